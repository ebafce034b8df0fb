"""Executed form against closed form: every schedule replays to exactly the closed-form time.

With dyadic parameters (powers of two) every sum is exact in binary floating point, so the test
uses ==; other parameters and rank counts agree to rounding (rel 1e-12).
"""

import numpy as np
import pytest

from dlsim.cost.collectives import (ALGORITHMS, collective_time, expand_schedule, make_costs, replay_dataflow,
                                    replay_steps)
from dlsim.cost.collectives.vectorized import evaluate
from dlsim.spec.cluster import LinkTier

DYADIC = LinkTier("dy", latency=2.0 ** -17, bandwidth=2.0 ** 33, overhead=2.0 ** -20, gap=2.0 ** -19)
DYADIC_INTRA = LinkTier("dyi", latency=2.0 ** -19, bandwidth=2.0 ** 36, overhead=2.0 ** -22, gap=2.0 ** -21)
ODD = LinkTier("odd", latency=3.7e-6, bandwidth=12.3e9, overhead=0.7e-6, gap=1.9e-6)
ODD_INTRA = LinkTier("oddi", latency=0.9e-6, bandwidth=170e9, overhead=0.1e-6, gap=0.3e-6)
MODELS = ("hockney", "loggp", "logp")
CASES = [(c, a) for c, algs in ALGORITHMS.items() for a in algs]


def params(algorithm, p, segments=None):
    kw = {}
    if algorithm == "hierarchical":
        kw["ranks_per_node"] = 2 if p % 2 == 0 else 1
    if algorithm in ("chain", "double-binary-tree") and segments:
        kw["segments"] = segments
    if algorithm in ("parameter-server", "sharded"):
        kw["shards"] = 2
    return kw


def skip(collective, algorithm, p):
    return collective == "allgather" and algorithm == "recursive-doubling" and p & (p - 1)


def both(collective, algorithm, n, p, link, intra, gamma, model, **kw):
    closed = collective_time(collective, algorithm, n, p, link, gamma=gamma, intra=intra, model=model, **kw).seconds
    sched = expand_schedule(collective, algorithm, n, p, link=link, gamma=gamma, intra=intra, model=model, **kw)
    costs = make_costs(link, gamma=gamma, intra=intra, model=model)
    return closed, sched, costs


@pytest.mark.parametrize("collective,algorithm", CASES)
@pytest.mark.parametrize("model", MODELS)
def test_replay_equals_closed_form_exactly(collective, algorithm, model):
    n = 3.0 * 2 ** 24
    for p in (2, 3, 4, 6, 8, 12, 16, 24, 32):
        if skip(collective, algorithm, p):
            continue
        for segments in (1, 4, 16):
            kw = params(algorithm, p, segments)
            closed, sched, costs = both(collective, algorithm, n, p, DYADIC, DYADIC_INTRA, 2.0 ** -32, model, **kw)
            assert replay_steps(sched, costs) == closed, (p, segments)
            if "segments" not in kw:
                break


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_replay_equals_closed_form_any_ranks(collective, algorithm):
    for p in range(1, 21):
        if skip(collective, algorithm, p):
            continue
        for n in (1000.0, 7.3e6):
            for model in ("hockney", "loggp"):
                kw = params(algorithm, p)           # segments chosen automatically
                closed, sched, costs = both(collective, algorithm, n, p, ODD, ODD_INTRA, 3e-11, model, **kw)
                assert replay_steps(sched, costs) == pytest.approx(closed, rel=1e-12, abs=1e-18), (p, n, model)


LOCKSTEP = [("allreduce", "ring"), ("allreduce", "recursive-doubling"), ("allreduce", "rabenseifner"),
            ("allreduce", "binomial-tree"), ("allreduce", "chain"), ("reduce-scatter", "ring"),
            ("reduce-scatter", "recursive-halving"), ("allgather", "ring"), ("allgather", "bruck"),
            ("broadcast", "binomial-tree"), ("reduce", "binomial-tree"), ("all-to-all", "pairwise"),
            ("all-to-all", "bruck"), ("send-recv", "direct"), ("allreduce", "binomial-tree-openmpi"),
            ("broadcast", "binomial-tree-openmpi")]


@pytest.mark.parametrize("collective,algorithm", LOCKSTEP)
def test_dataflow_replay_agrees_for_lockstep_algorithms(collective, algorithm):
    for p in (2, 3, 5, 6, 8, 13, 16):
        closed, sched, costs = both(collective, algorithm, 3.0 * 2 ** 24, p, DYADIC, None, 2.0 ** -32, "loggp",
                                    **params(algorithm, p, 8))
        assert replay_dataflow(sched, costs) == pytest.approx(closed, rel=1e-12)


def test_dataflow_never_slower_than_steps():
    for p in (3, 4, 7, 10):
        closed, sched, costs = both("allreduce", "double-binary-tree", 1e7, p, ODD, None, 1e-10, "loggp", segments=6)
        assert replay_dataflow(sched, costs) <= closed * (1 + 1e-12)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 9, 16, 31])
def test_schedules_are_well_formed(p):
    n = 1e6
    for collective, algorithm in CASES:
        if skip(collective, algorithm, p):
            continue
        sched = expand_schedule(collective, algorithm, n, p, link=ODD, **params(algorithm, p, 3))
        steps = [m.step for m in sched.messages]
        assert steps == sorted(steps)
        for i, m in enumerate(sched.messages):
            assert all(d < i for d in m.deps) and m.src != m.dst and 0 <= m.src < sched.ranks
        if collective == "allreduce" and algorithm != "parameter-server":
            # every one of the p − 1 other contributions is combined somewhere
            assert sum(sched.bytes_reduced().values()) >= (p - 1) * n * (1 - 1e-12)
        if algorithm in ("ring", "rabenseifner") and collective == "allreduce" and p & (p - 1) == 0:
            assert all(abs(v - 2 * (p - 1) / p * n) < 1e-6 for v in sched.bytes_sent().values())


@pytest.mark.parametrize("p", [2, 4, 6, 7, 12, 33])
def test_double_binary_tree_uses_each_port_once_per_round(p):
    sched = expand_schedule("allreduce", "double-binary-tree", 1e6, p, segments=5)
    for step in sched.steps:
        senders = [sched.messages[i].src for i in step]
        receivers = [sched.messages[i].dst for i in step]
        assert len(senders) == len(set(senders)) and len(receivers) == len(set(receivers))


def test_vectorised_path_equals_scalar_path():
    sizes = np.geomspace(1, 1e10, 23)[:, None]
    ranks = np.array([1, 2, 3, 5, 8, 12, 16, 64, 100])[None, :]
    for collective in ALGORITHMS:
        grid = evaluate(collective, None, sizes, ranks, ODD, gamma=1e-10, intra=ODD_INTRA, ranks_per_node=4, shards=3)
        for algorithm, times in grid.items():
            for i in range(0, 23, 5):
                for j, p in enumerate(ranks[0]):
                    if np.isnan(times[i, j]):
                        assert skip(collective, algorithm, p) or (algorithm == "hierarchical" and p % 4)
                        continue
                    one = collective_time(collective, algorithm, float(sizes[i, 0]), int(p), ODD, gamma=1e-10,
                                          intra=ODD_INTRA, ranks_per_node=4, shards=3).seconds
                    assert times[i, j] == one
