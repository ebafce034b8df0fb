"""Closed forms of every collective algorithm against values computed by hand.

Network: α = 5 us, 10 GB/s (β = 0.1 ns/B), γ = 0.1 ns/B, n = 100 MB, p = 8 unless stated.
So T(n) = 5 us + 10 ms, r(n) = 10 ms; T(n/8) = 5 us + 1.25 ms.
"""

import math

import pytest

from dlsim.cost.collectives import ALGORITHMS, choose_algorithm, collective_time, lower_bound
from dlsim.cost.collectives.dbt import dbt_layout, distinct_rounds, tree_parents
from dlsim.cost.collectives.survey import SURVEY_ALGORITHMS, survey_allreduce_time, survey_lower_bound
from dlsim.errors import SpecError
from dlsim.results import Source
from dlsim.spec.cluster import LinkTier

US = 1e-6
NET = LinkTier("net", latency=5 * US, bandwidth=10e9)
FAST = LinkTier("nvlink", latency=1 * US, bandwidth=100e9)
N, GAMMA = 1e8, 1e-10


def t(collective, algorithm, p=8, n=N, **kw):
    return collective_time(collective, algorithm, n, p, NET, gamma=GAMMA, **kw).seconds


HAND = [
    # allreduce
    ("allreduce", "ring", 8, {}, 14 * 5 * US + 2 * 0.875e-2 + 0.875e-2),          # 2(p-1)α + 2(p-1)/p nβ + (p-1)/p nγ
    ("allreduce", "recursive-doubling", 8, {}, 3 * (5 * US + 0.02)),
    ("allreduce", "rabenseifner", 8, {}, 6 * 5 * US + 2 * 0.875e-2 + 0.875e-2),
    ("allreduce", "binomial-tree", 8, {}, 3 * (5 * US + 0.02) + 3 * (5 * US + 0.01)),
    ("allreduce", "binomial-tree-openmpi", 8, {}, 3 * (5 * US + 0.02) + 6 * (5 * US + 0.01)),  # bcast 3+2+1 T
    ("allreduce", "chain", 8, {"segments": 4}, 10 * (2 * (5 * US + 2.5e-3) + 2.5e-3)),   # (k+p-2)(2T(n/k)+r(n/k))
    ("allreduce", "double-binary-tree", 2, {"segments": 1}, (5 * US + 0.005 + 0.005) + (5 * US + 0.005)),
    ("allreduce", "double-binary-tree", 4, {"segments": 1}, 4 * (5 * US + 0.01) + 4 * (5 * US + 0.005)),
    ("allreduce", "parameter-server", 8, {}, 16 * 5 * US + 16 * 0.01 + 8 * 0.01),   # Dryden 2pα + 2pnβ + pnγ
    ("allreduce", "parameter-server", 8, {"shards": 2}, 8 * (5 * US + 0.01) + 8 * (5 * US + 0.005)),
    # non-power-of-two p = 6 (MPICH fold: rank 2i+1 -> 2i, then 4 ranks, then back)
    ("allreduce", "recursive-doubling", 6, {}, 3 * (5 * US + 0.02) + (5 * US + 0.01)),
    ("allreduce", "rabenseifner", 6, {}, (5 * US + 0.02) + (2 * 5 * US + 0.015) + (2 * 5 * US + 0.0075)
     + (5 * US + 0.01)),
    ("allreduce", "binomial-tree", 6, {}, 3 * (5 * US + 0.02) + 3 * (5 * US + 0.01)),
    ("allreduce", "ring", 1, {}, 0.0),
    # reduce-scatter, allgather
    ("reduce-scatter", "ring", 8, {}, 7 * (5 * US + 2.5e-3)),
    ("reduce-scatter", "recursive-halving", 8, {}, 3 * 5 * US + 2 * (0.005 + 0.0025 + 0.00125)),
    ("allgather", "ring", 8, {}, 7 * (5 * US + 1.25e-3)),
    ("allgather", "recursive-doubling", 8, {}, 3 * 5 * US + 0.00875),
    ("allgather", "bruck", 8, {}, 3 * 5 * US + 0.00875),
    ("allgather", "bruck", 6, {}, 3 * 5 * US + 5 / 6 * 0.01),       # blocks 1 + 2 + 2 = p - 1
    # broadcast, reduce
    ("broadcast", "binomial-tree", 8, {}, 3 * (5 * US + 0.01)),
    ("broadcast", "binomial-tree-openmpi", 8, {}, 6 * (5 * US + 0.01)),
    ("broadcast", "chain", 8, {"segments": 4}, 10 * (5 * US + 2.5e-3)),      # (p-2+k) T(n/k)
    ("broadcast", "scatter-allgather", 8, {}, (3 * 5 * US + 0.00875) + 7 * (5 * US + 1.25e-3)),
    ("reduce", "binomial-tree", 8, {}, 3 * (5 * US + 0.02)),
    ("reduce", "chain", 8, {"segments": 4}, 10 * (5 * US + 0.005)),
    ("reduce", "rabenseifner", 8, {}, 6 * 5 * US + 2 * 0.875e-2 + 0.875e-2),
    # all-to-all, send/recv, PS, gossip
    ("all-to-all", "pairwise", 8, {}, 7 * (5 * US + 1.25e-3)),
    ("all-to-all", "linear", 8, {}, 7 * (5 * US + 1.25e-3)),               # Hockney: S = T
    ("all-to-all", "bruck", 8, {}, 3 * (5 * US + 0.005)),
    ("send-recv", "direct", 2, {}, 5 * US + 0.01),
    ("push", "sharded", 8, {}, 8 * (5 * US + 0.02)),
    ("pull", "sharded", 8, {"shards": 4}, 4 * 2 * (5 * US + 0.0025)),
    ("gossip", "random-peers", 8, {}, 3 * (5 * US + 0.02)),
    ("gossip", "random-peers", 8, {"fanout": 1, "rounds": 5}, 5 * (5 * US + 0.02)),
    # SparCML sparse allreduce, density 1%: N = 2.5e7 fp32 elements, 8-byte items, k = 2.5e5 per rank,
    # K(m) = N(1 - 0.99^m) nonzeros in a sum of m (2.5e5, 4.975e5, 985,099.75 for m = 1, 2, 4; 1,923,697.3 for 8)
    ("sparse-allreduce", "ssar-recursive-doubling", 8, {"density": 0.01},
     3 * 5 * US + 8 * (2.5e5 + 4.975e5 + 985_099.75) * 2e-10),
    ("sparse-allreduce", "ssar-split-allgather", 8, {"density": 0.01},
     7 * (5 * US + 2e6 / 8 * 2e-10) + 7 * (5 * US + 8 * 25e6 * (1 - 0.99 ** 8) / 8 * 1e-10)),
    ("sparse-allreduce", "dsar-split-allgather", 8, {"density": 0.01},
     7 * (5 * US + 2e6 / 8 * 2e-10) + 7 * (5 * US + 8 * 25e6 * (1 - 0.99 ** 8) / 8 * 1e-10)),
    # density 60%: items (4.8 B per element) exceed the dense 4 B: DSAR runs the dense ring allreduce
    ("sparse-allreduce", "dsar-split-allgather", 8, {"density": 0.6}, 14 * 5 * US + 2 * 0.875e-2 + 0.875e-2),
    ("sparse-allreduce", "dense-fallback", 8, {"density": 0.6}, 6 * 5 * US + 2 * 0.875e-2 + 0.875e-2),
]


@pytest.mark.parametrize("collective,algorithm,p,kw,expected", HAND, ids=[f"{h[0]}-{h[1]}-{h[2]}" for h in HAND])
def test_hand_computed(collective, algorithm, p, kw, expected):
    assert t(collective, algorithm, p, **kw) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_every_algorithm_has_a_hand_value():
    covered = {(h[0], h[1]) for h in HAND} | {("allreduce", "hierarchical")}
    covered |= {("reduce-scatter", "hierarchical"), ("allgather", "hierarchical")}   # tests/test_comm_topology.py
    covered |= {("all-to-all", "hierarchical")}                                       # tests/test_expert_parallel.py
    assert covered == {(c, a) for c, algs in ALGORITHMS.items() for a in algs}


def test_hierarchical_two_nodes_of_four():
    # intra RS: 3(1us + 2.5e7/1e11 + 2.5e7 γ); inter ring allreduce of 2.5e7 B on 2 nodes; intra AG
    rs = 3 * (1 * US + 2.5e-4 + 2.5e-3)
    inter = (5 * US + 1.25e-3 + 1.25e-3) + (5 * US + 1.25e-3)
    ag = 3 * (1 * US + 2.5e-4)
    got = collective_time("allreduce", "hierarchical", N, 8, NET, gamma=GAMMA, ranks_per_node=4, intra=FAST)
    assert got.seconds == pytest.approx(rs + inter + ag, rel=1e-12)
    rd = collective_time("allreduce", "hierarchical", N, 8, NET, gamma=GAMMA, ranks_per_node=4, intra=FAST,
                         inter_algorithm="recursive-doubling")
    assert rd.seconds == pytest.approx(rs + (5 * US + 2.5e-3 + 2.5e-3) + ag, rel=1e-12)


def test_loggp_linear_alltoall_overlaps_sends():
    link = LinkTier("l", latency=3 * US, bandwidth=10e9, overhead=1 * US, gap=2 * US)
    s = 1e6 / 8
    got = collective_time("all-to-all", "linear", 1e6, 8, link).seconds
    assert got == pytest.approx((5 * US + (s - 1) * 1e-10) + 6 * (2 * US + (s - 1) * 1e-10))
    pairwise = collective_time("all-to-all", "pairwise", 1e6, 8, link).seconds
    assert got < pairwise


def test_estimate_record_and_auto():
    est = collective_time("allreduce", "auto", 1e3, 8, NET)
    assert est.source is Source.MODEL and "recursive-doubling" in est.note and "auto" in est.note
    assert choose_algorithm("allreduce", 1e3, 8, NET) == "recursive-doubling"
    assert choose_algorithm("allreduce", 1e9, 8, NET) == "rabenseifner"
    assert choose_algorithm("allreduce", 1e9, 6, NET) == "ring"       # fold costs 2 nβ when p is not 2^k
    assert choose_algorithm("broadcast", 1e3, 8, NET) == "binomial-tree"
    assert collective_time("allreduce", "ring", 0, 8, NET).seconds == 0.0


def test_lower_bounds():
    lb = lower_bound("allreduce", N, 8, NET, gamma=GAMMA)
    assert lb == pytest.approx(3 * 5 * US + 2 * 0.875e-2 + 0.875e-2)
    for algo in ALGORITHMS["allreduce"]:
        if algo not in ("hierarchical",):
            assert t("allreduce", algo) >= lb * (1 - 1e-12)
    assert lower_bound("broadcast", N, 8, NET) == pytest.approx(3 * 5 * US + 0.01)
    assert lower_bound("send-recv", N, 2, NET) == pytest.approx(5 * US + 0.01)


@pytest.mark.parametrize("survey,p", [(s, p) for s in SURVEY_ALGORITHMS for p in (2, 4, 16)])
def test_survey_formulas_match(survey, p):
    values, elem = 2.5e7, 4                              # 25M fp32 values = 100 MB
    ours = collective_time("allreduce", SURVEY_ALGORITHMS[survey], values * elem, p, NET).seconds
    assert survey_allreduce_time(survey, values, elem, p, 5 * US, 1e-10) == pytest.approx(ours, rel=1e-12)
    assert survey_lower_bound(values, elem, p, 5 * US, 1e-10) == pytest.approx(lower_bound("allreduce", 1e8, p, NET))


def test_double_binary_tree_structure():
    first, second = tree_parents(14)
    # NCCL trees.cc illustration: 0-8, 8-{4,12}, 4-{2,6}, 12-{10,13}, 2-{1,3}, ...
    assert [first[r] for r in (8, 4, 12, 2, 6, 10, 13, 1, 3)] == [0, 8, 8, 4, 4, 12, 12, 2, 2]
    assert second.index(-1) == 13 and tree_parents(13)[1].index(-1) == 1
    for p in range(2, 70):
        first, second = tree_parents(p)
        internal = [{q for q in parents if q >= 0} for parents in (first, second)]
        both = internal[0] & internal[1]
        assert both <= ({0} if p % 2 else set())
        edges, up, down = dbt_layout(p)
        assert len(edges) == 2 * (p - 1)
    # rounds of a phase grow by 2 per segment once the pipeline is full
    _, up, down = dbt_layout(64)
    assert distinct_rounds(up, 101) - distinct_rounds(up, 100) == 2


def test_bad_arguments():
    with pytest.raises(SpecError, match="unknown collective"):
        t("allsum", "ring")
    with pytest.raises(SpecError, match="unknown algorithm 'spiral'"):
        t("allreduce", "spiral")
    with pytest.raises(SpecError, match="power-of-two"):
        t("allgather", "recursive-doubling", 6)
    with pytest.raises(SpecError, match="ranks_per_node"):
        t("allreduce", "hierarchical", 8)
    with pytest.raises(SpecError, match="ranks must be a positive integer"):
        t("allreduce", "ring", 0)
    with pytest.raises(SpecError, match="size must be"):
        t("allreduce", "ring", 8, n=-1.0)
    with pytest.raises(SpecError, match="size must be"):
        t("allreduce", "ring", 8, n=math.inf)
    with pytest.raises(SpecError, match="segments"):
        t("allreduce", "chain", 8, segments=0)


@pytest.mark.parametrize("collective,algorithm,p,kw,expected", HAND, ids=[f"{h[0]}-{h[1]}-{h[2]}" for h in HAND])
def test_hand_computed_executed_form(collective, algorithm, p, kw, expected):
    """The same hand values, reached by replaying each algorithm's message schedule step by step."""
    from dlsim.cost.collectives import expand_schedule, make_costs, replay_steps
    sched = expand_schedule(collective, algorithm, N, p, link=NET, gamma=GAMMA, **kw)
    assert replay_steps(sched, make_costs(NET, gamma=GAMMA)) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_hierarchical_executed_form_by_hand():
    from dlsim.cost.collectives import expand_schedule, make_costs, replay_steps
    rs = 3 * (1 * US + 2.5e-4 + 2.5e-3)
    inter = (5 * US + 1.25e-3 + 1.25e-3) + (5 * US + 1.25e-3)
    ag = 3 * (1 * US + 2.5e-4)
    sched = expand_schedule("allreduce", "hierarchical", N, 8, link=NET, gamma=GAMMA, ranks_per_node=4, intra=FAST)
    assert replay_steps(sched, make_costs(NET, gamma=GAMMA, intra=FAST)) == pytest.approx(rs + inter + ag, rel=1e-12)


# Lower bounds by hand, p = 8, α = 5 us, nβ = 0.01 s, nγ = 0.01 s: ⌈lg 8⌉ = 3, (p−1)/p = 0.875
BOUNDS = [
    ("broadcast", {}, 3 * 5 * US + 0.01),
    ("reduce", {}, 3 * 5 * US + 0.01 + 0.00875),
    ("allgather", {}, 3 * 5 * US + 0.00875),
    ("reduce-scatter", {}, 3 * 5 * US + 0.00875 + 0.00875),
    ("allreduce", {}, 3 * 5 * US + 2 * 0.00875 + 0.00875),
    ("all-to-all", {}, 3 * 5 * US + 0.00875),
    ("send-recv", {}, 5 * US + 0.01),
    ("push", {"shards": 2}, 5 * US + 4 * 0.01),           # busiest server receives p/S = 4 vectors
    ("pull", {"shards": 16}, 5 * US + 1 * 0.01),          # at least one full vector per worker
    ("gossip", {"fanout": 2, "rounds": 3}, 5 * US + 6 * 0.01),
]


@pytest.mark.parametrize("collective,kw,expected", BOUNDS, ids=[b[0] for b in BOUNDS])
def test_every_lower_bound_by_hand(collective, kw, expected):
    assert lower_bound(collective, N, 8, NET, gamma=GAMMA, **kw) == pytest.approx(expected, rel=1e-12)
    algos = ALGORITHMS[collective]
    for name in algos:
        if name in ("hierarchical",):
            continue
        params = {k: v for k, v in kw.items() if k in ("shards", "fanout", "rounds")}
        assert t(collective, name, 8, **params) >= expected * (1 - 1e-12), name


def _reference_layout(p: int):
    """The double binary tree's edges built rank by rank (dicts, a breadth-first 2-colouring from each
    component's first slot): the definition `dbt_layout`'s array construction must reproduce."""
    from collections import defaultdict, deque

    from dlsim.cost.collectives.dbt import btree_parent
    first = [btree_parent(r, p) for r in range(p)]
    second = ([-1 if first[p - 1 - r] < 0 else p - 1 - first[p - 1 - r] for r in range(p)] if p % 2 == 0 else
              [-1 if first[(r - 1) % p] < 0 else (first[(r - 1) % p] + 1) % p for r in range(p)])
    parents = (first, second)
    slots = [(t, c) for t in (0, 1) for c in range(p) if parents[t][c] >= 0]
    adjacency, by_parent = defaultdict(list), defaultdict(list)
    for t, c in slots:
        by_parent[parents[t][c]].append((t, c))
    for group in by_parent.values():
        if len(group) == 2:
            adjacency[group[0]].append(group[1])
            adjacency[group[1]].append(group[0])
    for c in range(p):
        if first[c] >= 0 and second[c] >= 0:
            adjacency[(0, c)].append((1, c))
            adjacency[(1, c)].append((0, c))
    side = {}
    for start in slots:
        if start not in side:
            side[start], queue = 0, deque([start])
            while queue:
                u = queue.popleft()
                for v in adjacency[u]:
                    if v not in side:
                        side[v] = 1 - side[u]
                        queue.append(v)

    def shape(parent):
        depth = [0] * p
        for r in range(p):
            q = r
            while parent[q] >= 0:
                depth[r], q = depth[r] + 1, parent[q]
        height = [0] * p
        for r in sorted(range(p), key=lambda x: -depth[x]):
            if parent[r] >= 0:
                height[parent[r]] = max(height[parent[r]], height[r] + 1)
        return height, depth
    shapes = [shape(parents[t]) for t in (0, 1)]
    return tuple((t, c, parents[t][c], 2 * shapes[t][0][c] + side[(t, c)],
                  2 * shapes[t][1][parents[t][c]] + side[(t, c)]) for t, c in slots)


def test_double_binary_tree_arrays_equal_the_rank_by_rank_construction():
    """`dbt_layout` (array construction, milliseconds at a million ranks) gives exactly the edges, offsets
    and colouring of the rank-by-rank definition, so the closed form and the schedule do not change."""
    for p in list(range(2, 130)) + [255, 256, 257, 1000, 1023, 4097]:
        edges, up, down = dbt_layout(p)
        assert edges == _reference_layout(p), p
        assert up == tuple(sorted({e[3] for e in edges})) and down == tuple(sorted({e[4] for e in edges}))


def test_auto_prices_the_chosen_algorithm_as_asked_by_name():
    """`auto` keeps the price it chose by: the same seconds, to the bit, as the chosen algorithm asked
    for by name, for every collective, across sizes, rank counts and node layouts."""
    checked = 0
    for collective in ALGORITHMS:
        for p, per_node in ((2, None), (6, None), (8, None), (16, 4), (64, 8)):
            for n in (0.0, 1e3, 3.3e5, 1e8):
                kw = dict(gamma=GAMMA, ranks_per_node=per_node, intra=FAST if per_node else None)
                try:
                    name = choose_algorithm(collective, n, p, NET, **kw)
                except SpecError:
                    continue
                if not name:
                    continue
                auto = collective_time(collective, "auto", n, p, NET, **kw)
                assert auto.seconds == collective_time(collective, name, n, p, NET, **kw).seconds
                assert name in auto.note and "auto" in auto.note
                checked += 1
    assert checked >= 100
