"""Collectives on real topologies (issue 13 item 3): what crosses each NIC decides the price.

Profiles give link bandwidth per device with every device of a node using the tier at once
(inter = node NIC bandwidth / devices_per_node). A group of g ranks per node owns g·B_dev of its
node's NICs; a node-contiguous ring puts one flow per node on them (NCCL spreads it over channels
so every NIC carries traffic), so its inter-node hop runs at B_node = min(g·B_dev, B_intra).
"""

import math
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dlsim.api.calibrate_comm import import_nccl_tests
from dlsim.api.comm import comm, comm_sweep
from dlsim.api.simulate import _default_pricer, simulate
from dlsim.cost.collectives import ALGORITHMS, collective_time, lower_bound
from dlsim.cost.collectives.registry import applicable
from dlsim.cost.collectives.core import make_options
from dlsim.cost.collectives.vectorized import evaluate, lower_bounds
from dlsim.io.paths import resolve_profile
from dlsim.io.profile_yaml import load_profile
from dlsim.plan.comm import Layout
from dlsim.plan.commcost import ClusterPricer
from dlsim.plan.compression import plan_sync
from dlsim.results import Source
from dlsim.spec.cluster import LinkTier
from dlsim.spec.strategy import Compression

# aws-p3's link tiers as datasheet numbers (the profile may gain measured efficiencies): NVLink 2
# 150 GB/s per direction, L 5 µs, o = g = 1 µs; 25 Gb/s Ethernet per instance / 8 GPUs, L 30 µs,
# o = g = 10 µs
P3 = replace(load_profile("aws-p3"),
             intra=LinkTier("nvlink2", 5e-6, 150e9, 1e-6, 1e-6),
             inter=LinkTier("ethernet-25g", 30e-6, 25e9 / 8 / 8, 10e-6, 10e-6))
N553 = 553e6
GAMMA_P3 = 1 / P3.reduce_bandwidth if P3.reduce_bandwidth else None  # 0: reductions inside NCCL's transfers


def test_node_contiguous_ring_hand_value():
    """8 nodes of aws-p3, p = 64, g = 8, Hockney: B_dev = 25 Gb/s / 8 = 0.390625 GB/s, so
    B_node = min(8 x 0.390625 GB/s, 150 GB/s NVLink) = 3.125 GB/s (the instance's 25 Gb/s NIC);
    α_e = L + 2o = 30 + 2·10 = 50 µs. Ring allreduce = 2(p−1)/p · n / B_node + 2(p−1)·α_e
    = 2·63/64 · 553e6 / 3.125e9 + 126 · 50e-6 = 0.348390 + 0.0063 = 0.354690 s (γ left out)."""
    t = collective_time("allreduce", "ring", N553, 64, P3.inter, intra=P3.intra, ranks_per_node=8, model="hockney")
    assert t.seconds == pytest.approx(2 * 63 / 64 * N553 / 3.125e9 + 126 * 50e-6, rel=1e-12)
    assert t.seconds == pytest.approx(0.354690, abs=1e-6)
    # reduce-scatter and allgather are the two halves
    rs = collective_time("reduce-scatter", "ring", N553, 64, P3.inter, intra=P3.intra, ranks_per_node=8,
                         model="hockney")
    assert rs.seconds == pytest.approx(63 / 64 * N553 / 3.125e9 + 63 * 50e-6, rel=1e-12)
    # without the node layout (one rank per node) every hop has only its device's share
    flat = collective_time("allreduce", "ring", N553, 64, P3.inter, model="hockney")
    assert flat.seconds == pytest.approx(2 * 63 / 64 * N553 / 0.390625e9 + 126 * 50e-6, rel=1e-12)


def test_ring_against_hierarchical_on_aws_p3():
    """Hierarchical: intra ring RS/AG at 150 GB/s, 8 inter rings of n/8 at B_dev. Node ring moves
    2·63/64·n through the NIC, hierarchical 2·7/8·n: ring / hierarchical ≈ (63/64)/(7/8) = 1.125
    plus latency (issue 13 found 8.8x)."""
    kw = dict(intra=P3.intra, ranks_per_node=8, gamma=GAMMA_P3)
    ring = collective_time("allreduce", "ring", N553, 64, P3.inter, **kw).seconds
    hier = collective_time("allreduce", "hierarchical", N553, 64, P3.inter, **kw).seconds
    assert 1.05 < ring / hier < 1.2
    bound = lower_bound("allreduce", N553, 64, P3.inter, gamma=GAMMA_P3, intra=P3.intra,
                        ranks_per_node=8)
    assert bound <= hier < 1.05 * bound


def test_dgx_a100_ring_uses_all_nics():
    """DGX A100, 4 nodes x 8: B_dev = 200 Gb/s = 25 GB/s, B_node = min(8·25, 300) = 200 GB/s;
    α_e = 5 + 2·1.5 = 8 µs. Ring = 2·31/32 · 1 GB / 200 GB/s + 62 · 8 µs = 9.6875 ms + 0.496 ms.
    With achievable fractions (bandwidth_efficiency 0.96 on the NIC, 0.773 on NVLink, published
    nccl-tests bus bandwidths) B_node = min(8·24, 231.9) = 192 GB/s."""
    inter, intra = LinkTier("ib", 5e-6, 25e9, 1.5e-6, 1.5e-6), LinkTier("nvl", 3e-6, 300e9, 1e-6, 1e-6)
    t = collective_time("allreduce", "ring", 1e9, 32, inter, intra=intra, ranks_per_node=8, model="hockney")
    assert t.seconds == pytest.approx(2 * 31 / 32 * 1e9 / 200e9 + 62 * 8e-6, rel=1e-12)
    t = collective_time("allreduce", "ring", 1e9, 32, replace(inter, bandwidth_efficiency=0.96), model="hockney",
                        intra=replace(intra, bandwidth_efficiency=0.773), ranks_per_node=8)
    assert t.seconds == pytest.approx(2 * 31 / 32 * 1e9 / 192e9 + 62 * 8e-6, rel=1e-12)


def test_hierarchical_reduce_scatter_and_allgather_hand_values():
    """2 nodes x 4, Hockney, n = 8 MB: intra α_i 7 µs at 150 GB/s, inter α_e 50 µs at B_dev.
    RS = 3·(7 µs + 2 MB/150 GB/s) + 1·(50 µs + 1 MB/0.390625 GB/s); AG the same steps reversed."""
    n = 8e6
    rs = collective_time("reduce-scatter", "hierarchical", n, 8, P3.inter, intra=P3.intra, ranks_per_node=4,
                         model="hockney").seconds
    ag = collective_time("allgather", "hierarchical", n, 8, P3.inter, intra=P3.intra, ranks_per_node=4,
                         model="hockney").seconds
    expected = 3 * (7e-6 + 2e6 / 150e9) + (50e-6 + 1e6 / 0.390625e9)
    assert rs == pytest.approx(expected, rel=1e-12) and ag == pytest.approx(expected, rel=1e-12)
    ar = collective_time("allreduce", "hierarchical", n, 8, P3.inter, intra=P3.intra, ranks_per_node=4,
                         model="hockney").seconds
    assert rs + ag == pytest.approx(ar, rel=1e-12)


def test_bandwidth_efficiency_scales_the_link():
    """bandwidth_efficiency 0.8: the bandwidth term of the ring grows by 1/0.8, latency unchanged."""
    from dataclasses import replace
    slow = replace(P3.inter, bandwidth_efficiency=0.8)
    t = collective_time("allreduce", "ring", N553, 64, slow, intra=P3.intra, ranks_per_node=8, model="hockney")
    assert t.seconds == pytest.approx(2 * 63 / 64 * N553 / (0.8 * 3.125e9) + 126 * 50e-6, rel=1e-12)


PROFILE = """name: two-tier
nodes: 2
devices_per_node: 4
device: {name: d, peak_tflops: {fp32: 10}, memory_gib: 16, memory_bandwidth_gbytes_per_s: 900}
intra_node: {name: nvl, bandwidth_gbytes_per_s: 100, latency_us: 2}
inter_node:
  name: nic
  bandwidth_gbits_per_s: 100
  latency_us: 5
  bandwidth_efficiency: EFF   # nccl-tests busbw / link rate (source)
"""


def test_bandwidth_efficiency_yaml_key(tmp_path):
    (tmp_path / "profile.yaml").write_text(PROFILE.replace("EFF", "0.75"))
    c = load_profile(tmp_path)
    assert c.inter.bandwidth_efficiency == 0.75 and c.intra.bandwidth_efficiency == 1.0
    assert c.inter.effective_bandwidth == pytest.approx(0.75 * 12.5e9)
    # 2 nodes x 4, Hockney: B_node = min(4 · 0.75 · 12.5 GB/s, 100 GB/s) = 37.5 GB/s
    t = collective_time("allreduce", "ring", 1e9, 8, c.inter, intra=c.intra, ranks_per_node=4)
    assert t.seconds == pytest.approx(2 * 7 / 8 * 1e9 / 37.5e9 + 14 * 5e-6, rel=1e-12)
    (tmp_path / "profile.yaml").write_text(PROFILE.replace("EFF", "1.5"))
    from dlsim.errors import SpecError
    with pytest.raises(SpecError, match="bandwidth_efficiency"):
        load_profile(tmp_path)


def _multi_node_profiles():
    names = ["aws-p3", "dgx-a100", "dgx-h100", "dgx1-p100", "dgx1-v100", "piz-daint", "gpu-2013", "cpu-cluster"]
    return [c for c in (load_profile(n) for n in names) if c.inter is not None]


@pytest.mark.parametrize("collective", ["allreduce", "reduce-scatter", "allgather", "broadcast", "reduce"])
def test_no_algorithm_beats_the_lower_bound(collective):
    """Every applicable algorithm on every built-in multi-node profile, sizes 1 B-4 GB, 2-32 nodes,
    g = devices_per_node and g = 1, with and without the reduction cost: time ≥ bound."""
    sizes = 2.0 ** np.arange(0, 33, 2)
    worst = math.inf
    for c in _multi_node_profiles():
        for g in sorted({c.devices_per_node, 1, max(c.devices_per_node // 2, 1)}):
            ranks = np.array([g * k for k in (2, 3, 4, 8, 16, 32)])
            n, p = np.meshgrid(sizes, ranks)
            for gamma in (None, 1 / c.reduce_bandwidth if c.reduce_bandwidth > 0 else None):
                kw = dict(gamma=gamma, intra=c.intra, ranks_per_node=g)
                bound = lower_bounds(collective, n, p, c.inter, **kw)
                times = evaluate(collective, None, n, p, c.inter, **kw)
                for name, t in times.items():
                    ok = ~np.isnan(t)
                    if ok.any():
                        worst = min(worst, float(np.min(t[ok] / bound[ok])))
                        assert np.all(t[ok] >= bound[ok] * (1 - 1e-9)), (c.name, g, name, collective)
    assert worst >= 1 - 1e-9


def test_lower_bound_is_tight_for_hierarchical():
    """The node-level NIC term is met exactly by the hierarchical allreduce's inter-node rings; what
    it adds is its intra-node rings, 2·7/8 · 4 GB / 150 GB/s = 46.7 ms on 2.40 s (1.9%), and start-ups."""
    kw = dict(gamma=None, intra=P3.intra, ranks_per_node=8)
    b = lower_bound("allreduce", 4e9, 128, P3.inter, **kw)
    h = collective_time("allreduce", "hierarchical", 4e9, 128, P3.inter, **kw).seconds
    assert 1.0 <= h / b < 1.0 + 46.7e-3 / 2.4 + 0.002


def _zero_latency_profile(tmp_path):
    text = (Path(resolve_profile("aws-p3")) / "profile.yaml").read_text()
    for key in ("latency_us", "overhead_us", "gap_us"):
        text = "\n".join(line.split(key)[0] + f"{key}: 0" if key + ":" in line else line
                         for line in text.splitlines())
    (tmp_path / "profile.yaml").write_text(text)
    return load_profile(tmp_path)


@pytest.mark.parametrize("collective", ["ring", "hierarchical"])
def test_zero_communication_equals_data_parallel(tmp_path, collective):
    """ResNet-50 on 8 nodes of aws-p3 (dp 64) with start-ups set to zero (only the bandwidth terms):
    ZeRO-1/2 = reduce-scatter + all-gather = one allreduce per byte, so their communication equals
    plain data parallelism's; ZeRO-3 all-gathers twice (forward, backward) and reduce-scatters: 1.5x."""
    c = _zero_latency_profile(tmp_path)
    kw = dict(dp=64, microbatch_size=32, collective=collective, overlap=False, stack="eager")  # one dtype throughout
    comm = {z: simulate("resnet50", c, zero=z, **kw).communication_s for z in (0, 1, 2, 3)}
    assert comm[0] > 0
    assert comm[1] == pytest.approx(comm[0], rel=1e-5)
    assert comm[2] == pytest.approx(comm[0], rel=1e-5)
    # 1.5x per byte; the simulator keeps the unit gathered last in the forward pass for the first
    # backward step (no second gather of it), a fraction of a percent on ResNet-50
    assert 1.49 * comm[0] <= comm[3] <= 1.5 * comm[0] * (1 + 1e-9)


@pytest.mark.parametrize("algorithm", ["ring", "hierarchical", "auto"])
def test_reduce_scatter_plus_allgather_is_one_allreduce_per_op(algorithm):
    """Through the simulator's pricer on aws-p3 (with latencies): RS(n) + AG(n) = AR(n) for the same
    algorithm (ring; hierarchical with a ring across nodes); auto never makes the split costlier
    than 1 + ε of the allreduce's best ring-family price."""
    pricer = ClusterPricer(P3, Layout(64, 1, 1, 8), algorithm)
    ranks = list(range(64))
    for n in (1e6, 25e6, N553):
        ar = pricer.collective("allreduce", n, ranks).seconds
        split = pricer.collective("reduce_scatter", n, ranks).seconds + pricer.collective("allgather", n, ranks).seconds
        if algorithm == "auto":
            assert split <= 1.02 * collective_time("allreduce", "hierarchical", n, 64, P3.inter, intra=P3.intra,
                                                   ranks_per_node=8, gamma=pricer.gamma).seconds
        else:
            assert split == pytest.approx(ar, rel=1e-9)


def test_qsgd_8bit_beats_fp32_across_8_nodes():
    """Bandwidth-bound (400 MB of fp32 gradients, 8 nodes x 8 of aws-p3): QSGD 8-bit sends
    n/4 + 4·n/512/4 bytes by reduce-scatter + all-gather, about a quarter of the allreduce."""
    pricer = ClusterPricer(P3, Layout(64, 1, 1, 8), "auto")
    ranks = list(range(64))
    nbytes = 400e6
    fp32 = pricer.collective("allreduce", nbytes, ranks).seconds
    plan = plan_sync(Compression("qsgd", bits=8), nbytes, 4, 64)
    q8 = sum(pricer.collective(op, b, ranks).seconds for op, b in plan.collectives)
    assert q8 < 0.3 * fp32
    # and in the simulator (ResNet-50, dp 64 on 8 nodes)
    kw = dict(dp=64, microbatch_size=32, overlap=False)
    none = simulate("resnet50", "aws-p3", **kw)
    qsgd = simulate("resnet50", "aws-p3", compression=Compression("qsgd", bits=8), **kw)
    assert qsgd.communication_s < 0.5 * none.communication_s


NCCL_TEXT = """# nThread 1 nGpus 1 minBytes 1048576 maxBytes 4194304 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1
#
# Using devices
{ranks}
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576        262144     float     sum      -1   1000.0    1.05    2.06      0   1010.0    1.04    2.04      0
     4194304       1048576     float     sum      -1   3000.0    1.40    2.75      0   3020.0    1.39    2.73      0
# Out of bounds values : 0 OK
"""


def _nccl_profile(tmp_path, ranks=64):
    prof = tmp_path / "p3-measured"
    shutil.copytree(resolve_profile("aws-p3"), prof)
    lines = "\n".join(f"#  Rank {r:2d} Group  0 Pid {1000 + r} on node{r // 8} device {r % 8} [0x00] Tesla V100"
                      for r in range(ranks))
    out = tmp_path / "results.txt"            # not named after the test: --collective says what it is
    out.write_text(NCCL_TEXT.format(ranks=lines))
    return prof, out


def test_imported_nccl_tests_row_prices_the_collective(tmp_path):
    """An nccl-tests all_reduce_perf on 64 ranks measured 1,000 µs at 1 MiB and 3,000 µs at 4 MiB;
    after the import the simulator's pricer returns exactly those (MEASURED), log-log between them
    at 2 MiB: 1000·3^(1/2) µs = 1732.05 µs (INTERPOLATED), and the model outside, saying so."""
    prof, out = _nccl_profile(tmp_path)
    rec = import_nccl_tests(prof, [out], collective="allreduce")
    assert rec["rows_added"] == 4
    cluster = load_profile(prof)
    pricer = _default_pricer(cluster, Layout(64, 1, 1, 8), "auto")
    ranks = list(range(64))
    model = ClusterPricer(cluster, Layout(64, 1, 1, 8), "auto").collective("allreduce", 1048576, ranks)
    hit = pricer.collective("allreduce", 1048576, ranks)
    assert hit.seconds == pytest.approx(1000e-6, rel=1e-12) and hit.source is Source.MEASURED
    assert abs(model.seconds - hit.seconds) > 1e-4             # the prediction did change
    mid = pricer.collective("allreduce", 2 * 1048576, ranks)
    assert mid.source is Source.INTERPOLATED and mid.seconds == pytest.approx(1000e-6 * math.sqrt(3), rel=1e-9)
    above = pricer.collective("allreduce", 8 * 1048576, ranks)
    assert above.source is Source.MODEL and "outside the measured sizes" in above.note
    other = pricer.collective("allreduce", 1048576, list(range(32)))
    assert other.source is Source.MODEL and "no measured allreduce on 32 ranks" in other.note
    # measured=False ignores the table
    assert _default_pricer(cluster, Layout(64, 1, 1, 8), "auto", False).collective(
        "allreduce", 1048576, ranks).source is Source.MODEL


def test_comm_prices_the_imported_table_as_simulate_does(tmp_path, cli):
    """`dlsim comm` on a profile prices through the simulator's pricer (issue 32 item 4): an imported
    nccl-tests table gives the same measured 1,000 µs at 1 MiB, the same log-log 1,732.05 µs at 2 MiB
    and the same model outside, as `simulate`'s pricer; `--algorithm all` keeps the model rows."""
    prof, out = _nccl_profile(tmp_path)
    import_nccl_tests(prof, [out], collective="allreduce")
    pricer = _default_pricer(load_profile(prof), Layout(64, 1, 1, 8), "auto")
    for size in (1048576, 2 * 1048576, 8 * 1048576):
        want = pricer.collective("allreduce", size, list(range(64)))
        (row,) = comm("allreduce", size, 64, cluster=prof).results
        assert (row.time_s, row.source) == (want.seconds, want.source.value)
        assert row.algorithm == ("default" if want.source is not Source.MODEL else row.algorithm)
    sweep = comm_sweep("allreduce", [1048576, 4 * 1048576], 64, cluster=prof)
    assert sweep.times_s["default"] == pytest.approx([1000e-6, 3000e-6], rel=1e-12)
    ring = {r.algorithm: r for r in comm("allreduce", 1048576, 64, cluster=prof, algorithm="all").results}["ring"]
    assert ring.time_s == _default_pricer(load_profile(prof), Layout(64, 1, 1, 8), "ring").collective(
        "allreduce", 1048576, list(range(64))).seconds and ring.source == "model"
    code, text, _ = cli("comm", "allreduce", "--size", "1MiB", "--ranks", "64", "--cluster", str(prof))
    assert code == 0 and "1 ms" in text and "default: measured" in text


def test_import_honours_collective_option(tmp_path, cli):
    prof, out = _nccl_profile(tmp_path, ranks=16)
    cli("calibrate", "comm", "--out", str(prof), "--import-nccl-tests", str(out), "--collective", "allgather")
    text = (prof / "comm_collectives.csv").read_text()
    assert ",allgather,default," in text and ",allreduce," not in text


def test_algorithms_cover_the_hierarchical_entries():
    """Hierarchical reduce-scatter / allgather exist and need ranks_per_node dividing ranks."""
    for coll in ("allreduce", "reduce-scatter", "allgather"):
        algo = ALGORITHMS[coll]["hierarchical"]
        assert applicable(algo, 16, make_options(ranks_per_node=8))
        assert not applicable(algo, 12, make_options(ranks_per_node=8))


def test_layout_tiers_and_ranks_per_node_by_node_of_each_rank():
    """`Layout.tier` (from the least and greatest rank) and `ranks_per_node` agree with `node` taken
    rank by rank, for groups in any order, on and across node boundaries."""
    import random
    from collections import Counter
    rng = random.Random(5)
    for per_node in (1, 2, 4, 8):
        lay = Layout(4, 2, 2, per_node)
        for _ in range(300):
            ranks = rng.sample(range(32), rng.randint(1, 8))
            nodes = Counter(lay.node(r) for r in ranks)
            assert lay.tier(ranks) == ("intra" if len(nodes) == 1 else "inter")
            assert lay.ranks_per_node(ranks) == max(nodes.values())
