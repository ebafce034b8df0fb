"""Token-bucket links (`LinkTier.burst`): message times, the bucket through collectives, the fit.

Hand values on a Hockney link with α = 10 us, 1 MB/s (G = 1 us/B), burst b = 1000 B, peak
R = 10 MB/s (0.1 us/B), γ = 0: D(x, B) = max(0.1x, x − B) us; tokens after = min(b, B + D − x).
"""

import math

import numpy as np
import pytest

from dlsim.api.calibrate_comm import add_burst
from dlsim.calibrate.comm_fit import fit_burst
from dlsim.cost.collectives import collective_time, expand_schedule, make_costs, replay_dataflow, replay_steps
from dlsim.cost.collectives.vectorized import evaluate
from dlsim.cost.p2p import p2p_model
from dlsim.errors import SpecError
from dlsim.io.profile_yaml import load_profile
from dlsim.spec.cluster import LinkTier

US = 1e-6
BUCKET = LinkTier("tbf", latency=10 * US, bandwidth=1e6, burst=1000.0, peak_bandwidth=1e7)
PLAIN = LinkTier("plain", latency=10 * US, bandwidth=1e6)
LOGGP = LinkTier("lg", latency=2 * US, bandwidth=1e6, overhead=3 * US, gap=4 * US, burst=1000.0, peak_bandwidth=1e7)
FLAT = ("ring", "recursive-doubling", "rabenseifner", "binomial-tree-openmpi")


def t(algorithm, n, p, link=BUCKET, collective="allreduce", gamma=None):
    return collective_time(collective, algorithm, n, p, link, gamma=gamma).seconds


def test_message_time_full_bucket():
    m = p2p_model(BUCKET)
    assert m.time(500) == pytest.approx(10 * US + 50 * US)          # in the bucket: peak rate
    assert m.time(3000) == pytest.approx(10 * US + 2000 * US)       # 2000 B past the bucket at 1 MB/s
    assert m.spacing(3000) == pytest.approx(m.time(3000))           # Hockney S = T
    lg = p2p_model(LOGGP)
    # LogGP: x = s − 1; T = L + 2o + D(x, b), S = max(o, g + D)
    assert lg.time(3001) == pytest.approx(8 * US + 2000 * US)
    assert lg.spacing(3001) == pytest.approx(4 * US + 2000 * US)
    assert lg.spacing(11) == pytest.approx(max(3 * US, 4 * US + 1 * US))


def test_no_burst_keeps_the_old_numbers():
    for model in ("hockney", "loggp"):
        link = LinkTier("x", latency=2 * US, bandwidth=1e9, overhead=1 * US, gap=1.5 * US)
        m = p2p_model(link, model)
        assert not m.shaped
        s = np.array([1.0, 100.0, 1e6])
        expected = 4 * US + (s if model == "hockney" else s - 1) / 1e9
        assert np.allclose(m.time(s), expected, rtol=1e-14, atol=0)


def test_ring_two_ranks_hand_value():
    # chunk 1500 B: step 1 D = max(150, 1500 − 1000) = 500 us, tokens min(1000, 1000 + 510 − 1500) = 10;
    # step 2 D = 1500 − 10 = 1490 us: 510 + 1500 = 2010 us (without the bucket: 2·1510 = 3020 us)
    assert t("ring", 3000, 2) == pytest.approx(2010 * US)
    assert t("ring", 3000, 2, PLAIN) == pytest.approx(3020 * US)


def test_ring_small_chunks_refill_between_steps():
    # p = 4, n = 400: chunks of 100 B; each step 10 + 10 us, the bucket never empties: 6 × 20 us
    assert t("ring", 400, 4) == pytest.approx(6 * 20 * US)


def test_recursive_doubling_three_ranks_fold():
    # fold-in by a full port: 10 + 1000 − 1000 → 10 + max(100, 0) = 110 us; the participants' ports
    # stay full; exchange: 110 us, tokens min(1000, 1000 + 110 − 1000) = 110; fold-out: 10 + 890 = 900 us
    assert t("recursive-doubling", 1000, 3) == pytest.approx((110 + 110 + 900) * US)


def test_openmpi_allreduce_four_ranks_hand_value():
    # n = 800: reduce steps 2 × (10 + max(80, −200)) = 180 us; node 1 drained at 80 us with 280 tokens.
    # bcast depth 0: root to 1 and 2 shared, 10 + 10 + max(160, 1600 − 1000) = 620 us (ends at 800);
    # depth 1: node 1 holds min(1000, 280 + 720) = 1000 tokens: 10 + 80 = 90 us. Total 890 us.
    assert t("binomial-tree-openmpi", 800, 4) == pytest.approx(890 * US)


@pytest.mark.parametrize("link", [BUCKET, LOGGP])
@pytest.mark.parametrize("p", [2, 3, 4, 5, 6, 7, 8, 12, 16])
@pytest.mark.parametrize("n", [64.0, 900.0, 2500.0, 40000.0])
def test_closed_form_equals_replay(link, p, n):
    costs = make_costs(link, gamma=1e-9)
    for name in FLAT:
        sched = expand_schedule("allreduce", name, n, p)
        closed = collective_time("allreduce", name, n, p, link, gamma=1e-9).seconds
        assert closed == pytest.approx(replay_steps(sched, costs), rel=1e-12)
    for name in ("ring", "recursive-doubling", "rabenseifner"):
        sched = expand_schedule("allreduce", name, n, p)
        assert replay_dataflow(sched, costs) == pytest.approx(replay_steps(sched, costs), rel=1e-12)
    for collective in ("reduce-scatter", "allgather"):
        sched = expand_schedule(collective, "ring", n, p)
        assert t("ring", n, p, link, collective, 1e-9) == pytest.approx(replay_steps(sched, costs), rel=1e-12)


def test_other_algorithms_are_replayed():
    costs = make_costs(BUCKET)
    for collective, name in (("allreduce", "binomial-tree"), ("broadcast", "binomial-tree"),
                             ("allreduce", "chain"), ("all-to-all", "pairwise")):
        sched = expand_schedule(collective, name, 5000.0, 6, link=BUCKET)
        assert t(name, 5000.0, 6, collective=collective) == pytest.approx(replay_steps(sched, costs))


def test_vectorised_path_matches_scalar():
    sizes = np.array([100.0, 1000.0, 3000.0, 50000.0, 100.0, 3000.0])
    ranks = np.array([4, 4, 4, 4, 5, 8])
    out = evaluate("allreduce", list(FLAT) + ["binomial-tree"], sizes, ranks, BUCKET, gamma=1e-9)
    for name, times in out.items():
        for i in range(len(sizes)):
            assert times[i] == pytest.approx(t(name, sizes[i], int(ranks[i]), gamma=1e-9), rel=1e-12)


def test_bucket_beats_line_rate_and_never_exceeds_it():
    for name in FLAT:
        for n in (500.0, 2000.0, 1e5):
            assert t(name, n, 4) <= t(name, n, 4, PLAIN) + 1e-15


def test_logp_with_burst_refused():
    with pytest.raises(SpecError):
        p2p_model(LinkTier("x", latency=1 * US, bandwidth=1e6, gap=1 * US, burst=100.0), "logp")


def test_fit_burst_recovers_the_bucket():
    alpha, beta, b, peak = 13e-6, 1 / 23.5e6, 1800.0, 2e8
    sizes = [2.0 ** k for k in range(0, 25)]
    times = [alpha + max(s / peak, (s - b) * beta) for s in sizes]
    fit = fit_burst(sizes, times, alpha, beta)
    assert fit.burst_bytes == pytest.approx(b)
    assert fit.peak_bytes_per_s == math.inf            # not identifiable from ping-pong (comm_fit doc)
    # a link without a bucket: T = α + β s (+ noise) → no burst
    plain = [alpha + beta * s * (1 + 0.01 * math.sin(s)) for s in sizes]
    assert fit_burst(sizes, plain, alpha, beta) is None


PROFILE = """name: t
nodes: 2
devices_per_node: 1
device: {name: cpu, peak_tflops: {fp32: 0.1}, memory_gib: 1, memory_bandwidth_gbytes_per_s: 10}
reduce_bandwidth_gbytes_per_s: 10
intra_node: {name: none, latency_us: 0, bandwidth_gbytes_per_s: 10}
inter_node:
  name: net
  latency_us: 10
  bandwidth_gbytes_per_s: 0.001
tables: {}
"""


def test_profile_field_and_add_burst(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text(PROFILE)
    assert load_profile(tmp_path).inter.burst == 0.0
    changes = add_burst(path, {"burst_bytes": 1828.16, "peak_bytes_per_s": 2.19e8})
    assert changes and "burst_bytes" in path.read_text()
    link = load_profile(tmp_path).inter
    assert link.burst == pytest.approx(1828)
    assert link.peak_bandwidth == pytest.approx(0.219e9)
    assert add_burst(path, {"burst_bytes": 5.0, "peak_bytes_per_s": 1e9}) == []   # never replaced
    path.write_text(PROFILE.replace("bandwidth_gbytes_per_s: 0.001", "bandwidth_gbytes_per_s: 0.001\n  burst_bytes: -1"))
    with pytest.raises(SpecError):
        load_profile(tmp_path)


def test_lower_bound_holds_on_a_bucket():
    from dlsim.cost.collectives import lower_bound
    # allreduce p = 4, n = 4000, V = 6000 B: max(⌈lg 4⌉α + 6000·0.1 us, (6000 − 1000)·1 us) = 5000 us
    assert lower_bound("allreduce", 4000, 4, BUCKET) == pytest.approx(5000 * US)
    assert lower_bound("allreduce", 400, 4, BUCKET) == pytest.approx((20 + 60) * US)
    for name in FLAT:
        for n in (100.0, 1000.0, 4000.0, 1e5):
            for p in (2, 4, 7, 8):
                assert t(name, n, p) >= lower_bound("allreduce", n, p, BUCKET) * (1 - 1e-12)
