"""Double binary tree allreduce (NCCL ≥ 2.4; Sanders, Speck, Träff, Parallel Computing 35(12) 2009).

Trees [code: NVIDIA/nccl `src/graph/trees.cc`]: tree 1 is NCCL's in-order binary tree on ranks
0..p−1 (rank r's parent is (r XOR b) | 2b, or r XOR b when that is out of range, b = lowest set bit
of r; rank 0 is the root with one child); tree 2 is its mirror r → p−1−r for even p, or its shift
r → r+1 for odd p. Every rank is internal in at most one tree. Each tree reduces one half of the
vector to its root and broadcasts it back, pipelined in k segments of s = n/(2k) bytes.

Round structure (dlsim's construction): a non-root rank c of tree t with subtree height h_t(c),
depth d_t(c) and side σ_t(c) ∈ {0, 1} sends segment j up in round 2j + 2h_t(c) + σ_t(c) of the
reduce phase and receives it down in round 2j + 2d_t(parent) + σ_t(c) of the broadcast phase. The
sides are a 2-colouring in which the (at most two) children of any rank, across both trees, differ
and a rank's two sides differ; the constraint graph has degree ≤ 2 and only even cycles, so the
colouring always exists. Then every rank sends and receives at most one segment per round, a parent
has both children's segment j before it forwards it, and the phases take |U| and |D| rounds, the
number of distinct values of v + 2j (j < k) for v in the sets V_up = {2h + σ} and V_down = {2d + σ}:

    allreduce = |U|·[T(s) + r(s)] + |D|·T(s),   s = n / (2k)

For large k, |U| ≈ |D| ≈ 2k, so the bandwidth term is ≈ 2nβ (each rank sends and receives 2n
bytes), which NCCL's tuning model expresses as algBw = busBw / 2 (`reference/algorithms.md` §3.4).

Across nodes (`Costs.spans`: N = p/g nodes of g ranks) NCCL builds the double binary tree over the
nodes and a chain through the g GPUs of each node [doc: NCCL 2.4 blog "Massively scale your deep
learning training with NCCL 2.4"; `src/graph/trees.cc`]: one flow per node and tree direction, at
B_node (`costs.py`), and the chain adds its pipeline fill, g − 1 intra-node hops up and down:

    allreduce = DBT(n, N; T_node) + 2(g − 1)·T_intra(s),   s = n / (2k)
"""

from __future__ import annotations

from collections import defaultdict, deque
from functools import lru_cache

import numpy as np

from dlsim.cost.collectives.bits import lowbit, per_rank_count
from dlsim.cost.collectives.costs import Costs
from dlsim.cost.collectives.schedule import Schedule, ScheduleBuilder
from dlsim.cost.collectives.segments import MAX_SEGMENTS, choose_segments, linear_fit


def btree_parent(r: int, p: int) -> int:
    """Parent of rank r in NCCL's btree on p ranks (−1 for the root 0)."""
    if r == 0:
        return -1
    bit = lowbit(r)
    up = (r ^ bit) | (bit << 1)
    return up if up < p else r ^ bit


def tree_parents(p: int) -> tuple[list[int], list[int]]:
    """Parents of every rank in tree 1 and tree 2."""
    first = [btree_parent(r, p) for r in range(p)]
    if p % 2 == 0:
        second = [-1 if first[p - 1 - r] < 0 else p - 1 - first[p - 1 - r] for r in range(p)]
    else:
        second = []
        for r in range(p):
            u = first[(r - 1) % p]
            second.append(-1 if u < 0 else (u + 1) % p)
    return first, second


def _heights_depths(parent: list[int]) -> tuple[list[int], list[int]]:
    p = len(parent)
    children: dict[int, list[int]] = defaultdict(list)
    root = 0
    for r, q in enumerate(parent):
        if q < 0:
            root = r
        else:
            children[q].append(r)
    depth, order, queue = [0] * p, [], deque([root])
    while queue:
        q = queue.popleft()
        order.append(q)
        for c in children[q]:
            depth[c] = depth[q] + 1
            queue.append(c)
    height = [0] * p
    for q in reversed(order):
        height[q] = max((height[c] + 1 for c in children[q]), default=0)
    return height, depth


@lru_cache(maxsize=4096)
def dbt_layout(p: int) -> tuple[tuple[tuple[int, int, int, int, int], ...], tuple[int, ...], tuple[int, ...]]:
    """Edges (tree, child, parent, up-offset 2h+σ, down-offset 2d(parent)+σ) and the sets V_up, V_down."""
    parents = tree_parents(p)
    slots = [(t, c) for t in (0, 1) for c in range(p) if parents[t][c] >= 0]
    adjacency: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    by_parent: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for t, c in slots:
        by_parent[parents[t][c]].append((t, c))
    for group in by_parent.values():
        assert len(group) <= 2, "a rank with more than two children in the double binary tree"
        if len(group) == 2:
            adjacency[group[0]].append(group[1])
            adjacency[group[1]].append(group[0])
    for c in range(p):
        if parents[0][c] >= 0 and parents[1][c] >= 0:
            adjacency[(0, c)].append((1, c))
            adjacency[(1, c)].append((0, c))
    side: dict[tuple[int, int], int] = {}
    for start in slots:
        if start in side:
            continue
        side[start] = 0
        queue = deque([start])
        while queue:
            u = queue.popleft()
            for v in adjacency[u]:
                if v not in side:
                    side[v] = 1 - side[u]
                    queue.append(v)
                assert side[v] != side[u], "double binary tree colouring failed"
    shape = [_heights_depths(parents[t]) for t in (0, 1)]
    edges = tuple((t, c, parents[t][c], 2 * shape[t][0][c] + side[(t, c)],
                   2 * shape[t][1][parents[t][c]] + side[(t, c)]) for t, c in slots)
    return edges, tuple(sorted({e[3] for e in edges})), tuple(sorted({e[4] for e in edges}))


def distinct_rounds(values: tuple[int, ...], k):
    """|{v + 2j : v in values, 0 ≤ j < k}|, vectorised over k."""
    total = 0
    for parity in (0, 1):
        vs = [v for v in values if v % 2 == parity]
        for lo, hi in zip(vs, vs[1:]):
            total = total + np.minimum(k, (hi - lo) // 2)
        if vs:
            total = total + k
    return total


def _time_for(n, k, up_values, down_values, c: Costs):
    s = n / (2 * k)
    return distinct_rounds(up_values, k) * c.step(s, True) + distinct_rounds(down_values, k) * c.step(s)


def dbt_segments(n, p: int, c: Costs, max_segments: int = MAX_SEGMENTS):
    """Segments per tree when none is given: the continuous optimum, rounded (see `segments.py`)."""
    _, up, down = dbt_layout(p)
    big = max(up + down) + 2
    slopes, offsets = [], []
    for values in (up, down):
        slope = distinct_rounds(values, big + 1) - distinct_rounds(values, big)
        slopes.append(slope)
        offsets.append(distinct_rounds(values, big) - slope * big)
    a_up, b_up = linear_fit(lambda s: c.step(s, True), n)
    a_dn, b_dn = linear_fit(lambda s: c.step(s), n)
    with np.errstate(divide="ignore", invalid="ignore"):
        k_star = np.sqrt((offsets[0] * b_up + offsets[1] * b_dn) * n / (2 * (slopes[0] * a_up + slopes[1] * a_dn)))
    return choose_segments(lambda k: _time_for(n, k, up, down, c), k_star, n, max_segments)


def dbt_time(n, p, c: Costs, segments=None, max_segments: int = MAX_SEGMENTS):
    """Closed form above; p may be an array (evaluated per distinct rank count)."""
    if np.ndim(p) == 0:
        if p < 2:
            return 0.0 * n
        _, up, down = dbt_layout(int(p))
        k = dbt_segments(n, int(p), c, max_segments) if segments is None else segments
        return _time_for(n, k, up, down, c)
    return per_rank_count(lambda n_q, q: dbt_time(n_q, q, c, segments, max_segments), n, p)


def _node_costs(c: Costs) -> Costs:
    return Costs(c.node, c.intra, c.gamma)


def dbt_node_time(n, p, c: Costs, segments=None, max_segments: int = MAX_SEGMENTS):
    """`dbt_time`, or across nodes the node-level tree plus the intra-node chain (module doc)."""
    if c.node is None:
        return dbt_time(n, p, c, segments, max_segments)
    if np.ndim(p) == 0:
        if not c.spans(p):
            return dbt_time(n, p, c, segments, max_segments)
        g, nodes, cn = c.ranks_per_node, int(p) // c.ranks_per_node, _node_costs(c)
        k = dbt_segments(n, nodes, cn, max_segments) if segments is None else segments
        return _time_for(n, k, *dbt_layout(nodes)[1:], cn) + 2 * (g - 1) * c.intra.time(n / (2 * k))
    return per_rank_count(lambda n_q, q: dbt_node_time(n_q, q, c, segments, max_segments), n, p)


def dbt_schedule(n: float, p: int, segments: int) -> Schedule:
    b = ScheduleBuilder("allreduce", "double-binary-tree", n, p)
    edges, up, _ = dbt_layout(p) if p > 1 else ((), (0,), ())
    s = n / (2 * segments)
    sends = []
    for t, child, parent, up_offset, _ in edges:
        sends += [(up_offset + 2 * j, t, child, parent, True) for j in range(segments)]
    first_down = max(up) + 2 * (segments - 1) + 1
    for t, child, parent, _, down_offset in edges:
        sends += [(first_down + down_offset + 2 * j, t, parent, child, False) for j in range(segments)]
    for rnd, _, src, dst, reduce in sorted(sends, key=lambda x: (x[0], x[1], x[2])):
        b.send(rnd, src, dst, s, reduce=reduce)
    return b.build(segments=segments)
