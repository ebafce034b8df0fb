"""Open MPI's binomial broadcast/allreduce (children served at once) and the tabulated p2p model.

Hand values with α = 5 us, 10 GB/s, γ = 0.1 ns/B, n = 100 MB: T = T(n) = 5 us + 10 ms, r = 10 ms.
Hockney S = T, so c shared messages take c·T; LogGP link below: S(n) = g + (n−1)G < T(n).
"""

import math

import numpy as np
import pytest

from dlsim.api.validate_comm import _crossing
from dlsim.cost.collectives import (choose_algorithm, collective_time, expand_schedule, make_costs, replay_dataflow,
                                    replay_steps)
from dlsim.cost.collectives.schedule import Message, Schedule
from dlsim.cost.collectives.vectorized import evaluate
from dlsim.cost.p2p import p2p_model, table_model
from dlsim.errors import SpecError
from dlsim.spec.cluster import LinkTier

US = 1e-6
NET = LinkTier("net", latency=5 * US, bandwidth=10e9)
LOGGP = LinkTier("lg", latency=3 * US, bandwidth=10e9, overhead=2 * US, gap=4 * US)
N, GAMMA = 1e8, 1e-10
T = 5 * US + 0.01
R = 0.01


def ompi(collective, p, link=NET, n=N):
    return collective_time(collective, "binomial-tree-openmpi", n, p, link, gamma=GAMMA).seconds


@pytest.mark.parametrize("p,messages", [(2, 1), (3, 2), (4, 3), (5, 4), (6, 5), (7, 5), (8, 6), (16, 10), (32, 15)])
def test_bcast_hand_values_hockney(p, messages):
    # p = 2^k: k(k+1)/2 message times; p = 5: root's 3 children (3T) then 1 -> 3 (T); p = 6: 3T + 2T (1 -> 3, 5);
    # p = 7: 3T + 2T (1 -> 3, 5), 3 -> 7 does not exist; p = 3: root's 2 children
    assert ompi("broadcast", p) == pytest.approx(messages * T, rel=1e-12)


def test_bcast_loggp_is_kT_plus_triangular_S():
    model = p2p_model(LOGGP)
    t, s = model.time(N), model.spacing(N)
    for k in range(1, 6):
        assert ompi("broadcast", 2 ** k, LOGGP) == pytest.approx(k * t + k * (k - 1) / 2 * s, rel=1e-12)


def test_allreduce_is_binomial_reduce_then_openmpi_bcast():
    assert ompi("allreduce", 4) == pytest.approx(2 * (T + R) + 3 * T, rel=1e-12)        # 5 T + 2 r
    assert ompi("allreduce", 8) == pytest.approx(3 * (T + R) + 6 * T, rel=1e-12)
    mpich = collective_time("allreduce", "binomial-tree", N, 4, NET, gamma=GAMMA).seconds
    assert mpich == pytest.approx(2 * (T + R) + 2 * T, rel=1e-12)
    assert ompi("allreduce", 2) == pytest.approx(collective_time("allreduce", "binomial-tree", N, 2, NET,
                                                                 gamma=GAMMA).seconds, rel=1e-12)


def test_tree_is_open_mpis_bmtree_and_sends_are_shared():
    # coll_base_topo.c: size 8 -> 0: {1, 2, 4}; 1: {3, 5}; 2: {6}; 3: {7}
    sched = expand_schedule("broadcast", "binomial-tree-openmpi", N, 8)
    pairs = [(m.step, m.src, m.dst) for m in sched.messages]
    assert pairs == [(0, 0, 1), (0, 0, 2), (0, 0, 4), (1, 1, 3), (1, 1, 5), (1, 2, 6), (2, 3, 7)]
    assert all(m.shared for m in sched.messages)
    assert sorted(m.dst for m in sched.messages) == list(range(1, 8))


def test_shared_port_replay_by_hand():
    costs = make_costs(NET)
    t1, t2 = costs.t(1e6), costs.t(3e6)
    shared = Schedule("broadcast", "x", 3e6, 3, (Message(0, 1, 1e6, shared=True), Message(0, 2, 3e6, shared=True)))
    fifo = Schedule("broadcast", "x", 3e6, 3, (Message(0, 1, 1e6), Message(0, 2, 3e6)))
    # shared: the small one finishes after 2 x its time (half the port), the large one after both
    assert replay_steps(shared, costs) == pytest.approx(t1 + t2, rel=1e-12)
    assert replay_dataflow(shared, costs) == pytest.approx(t1 + t2, rel=1e-12)
    assert replay_steps(fifo, costs) == pytest.approx(t1 + t2, rel=1e-12)
    only_small = Schedule("broadcast", "x", 1e6, 3, (Message(0, 1, 1e6, shared=True), Message(0, 2, 1e6, shared=True)))
    assert replay_steps(only_small, costs) == pytest.approx(2 * t1, rel=1e-12)


def test_vectorised_equals_scalar_and_auto_prefers_mpich():
    p = np.arange(1, 41)
    n = np.full(p.shape, 3.3e6)
    for coll in ("allreduce", "broadcast"):
        got = evaluate(coll, ["binomial-tree-openmpi"], n, p, LOGGP, gamma=GAMMA)["binomial-tree-openmpi"]
        want = [collective_time(coll, "binomial-tree-openmpi", 3.3e6, int(q), LOGGP, gamma=GAMMA).seconds for q in p]
        assert got == pytest.approx(want, rel=1e-12)
        # with Hockney (S = T) sharing a port never beats serving the largest subtree first
        hock = evaluate(coll, ["binomial-tree-openmpi", "binomial-tree"], n, p, NET, gamma=GAMMA)
        assert np.all(hock["binomial-tree"] <= hock["binomial-tree-openmpi"] * (1 + 1e-12))
    assert choose_algorithm("broadcast", 1e3, 8, NET) == "binomial-tree"


def test_table_model_interpolates_clips_and_extrapolates():
    m = table_model([1, 1024, 4096], [10e-6, 20e-6, 100e-6])
    assert m.time(1024) == pytest.approx(20e-6) and m.time(0) == pytest.approx(10e-6)
    assert m.time(2560) == pytest.approx(60e-6)                       # halfway between 1024 and 4096
    slope = 80e-6 / 3072
    assert m.beta == pytest.approx(slope) and m.time(8192) == pytest.approx(100e-6 + 4096 * slope)
    assert m.spacing(2560) == m.time(2560)
    assert np.allclose(m.time(np.array([1.0, 2560.0])), [10e-6, 60e-6])
    # a measured bump is removed: a smaller message is never slower (suffix minimum)
    bumpy = table_model([1, 128, 256, 4096], [13e-6, 21e-6, 13e-6, 80e-6])
    assert bumpy.time(128) == pytest.approx(13e-6) and bumpy.alpha == pytest.approx(13e-6)


@pytest.mark.parametrize("sizes,times", [([1], [1e-5]), ([1, 2], [1e-5, -1.0]), ([1, 1], [1e-5, 2e-5]),
                                         ([1, math.nan], [1e-5, 2e-5])])
def test_table_model_rejects_bad_tables(sizes, times):
    with pytest.raises(SpecError):
        table_model(sizes, times)


def test_collectives_priced_by_a_table():
    m = table_model([1, 1e6, 1e7], [10e-6, 1e-3, 5e-3])
    # ring, p = 4, n = 4e6: 6 messages of 1e6 bytes (2(p−1) steps of T(n/p)) + 3 reductions of 1e6 bytes
    got = collective_time("allreduce", "ring", 4e6, 4, NET, gamma=GAMMA, model=m)
    assert got.seconds == pytest.approx(6 * 1e-3 + 3 * 1e6 * GAMMA, rel=1e-12)
    assert "table" in got.note
    # Open MPI binomial on 4 ranks, n = 5.5e6: T = 1e-3 + 4.5e6 * (4e-3 / 9e6)
    t = 1e-3 + 4.5e6 * 4e-3 / 9e6
    assert collective_time("allreduce", "binomial-tree-openmpi", 5.5e6, 4, NET, gamma=GAMMA, model=m).seconds == \
        pytest.approx(5 * t + 2 * 5.5e6 * GAMMA, rel=1e-12)
    with pytest.raises(SpecError, match="measured"):
        p2p_model(NET, "table")


def test_crossings_interpolate_in_log_size_and_flag_ties():
    sizes = [1000.0, 4000.0]
    # a/b goes from 2 to 1/2: the crossing is at the geometric midpoint 2000
    (c,) = _crossing(sizes, [2.0, 1.0], [1.0, 2.0], 0.02)
    assert c["bytes"] == pytest.approx(2000.0) and not c["tie"]
    (c,) = _crossing(sizes, [1.01, 1.0], [1.0, 1.01], 0.02)
    assert c["tie"]
