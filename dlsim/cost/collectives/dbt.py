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


def _parent_arrays(p: int) -> np.ndarray:
    """Parents of every rank in tree 1 (row 0) and tree 2 (row 1), −1 at a root (`btree_parent`)."""
    r = np.arange(p, dtype=np.int64)
    bit = r & -r
    up = (r ^ bit) | (bit << 1)
    first = np.where(up < p, up, r ^ bit)
    first[0] = -1
    if p % 2 == 0:
        mirrored = first[p - 1 - r]
        second = np.where(mirrored < 0, -1, p - 1 - mirrored)
    else:
        shifted = first[(r - 1) % p]
        second = np.where(shifted < 0, -1, (shifted + 1) % p)
    return np.stack([first, second])


def tree_parents(p: int) -> tuple[list[int], list[int]]:
    """Parents of every rank in tree 1 and tree 2."""
    first, second = _parent_arrays(p)
    return first.tolist(), second.tolist()


def _heights_depths(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Subtree height and depth of every rank of one tree, level by level (O(p log p) array work)."""
    p = len(parent)
    depth = np.zeros(p, dtype=np.int64)
    cur = np.arange(p, dtype=np.int64)
    while True:
        up = parent[cur]
        moving = up >= 0
        if not moving.any():
            break
        depth += moving
        cur = np.where(moving, up, cur)
    height = np.zeros(p, dtype=np.int64)
    for level in range(int(depth.max(initial=0)), 0, -1):
        nodes = np.nonzero(depth == level)[0]
        np.maximum.at(height, parent[nodes], height[nodes] + 1)
    return height, depth


def _sides(parents: np.ndarray) -> np.ndarray:
    """The side σ ∈ {0, 1} of every slot t·p + c (child c's edge to its parent in tree t; module doc):
    the two children of one rank (across both trees) and a rank's two slots differ. The constraint graph
    has degree ≤ 2 and only even cycles (paths and rings); each component takes side 0 at its first
    slot (lowest t·p + c) and alternates along it, its 2-colouring by the parity of the distance."""
    p = parents.shape[1]
    par = parents.reshape(-1)
    n = 2 * p
    slots = np.nonzero(par >= 0)[0]
    order = slots[np.argsort(par[slots], kind="stable")]  # by parent rank, slot order kept
    same = par[order[1:]] == par[order[:-1]]
    assert not (same[1:] & same[:-1]).any(), "a rank with more than two children in the double binary tree"
    both = np.nonzero((parents[0] >= 0) & (parents[1] >= 0))[0]
    u = np.concatenate([order[:-1][same], both]).tolist()
    v = np.concatenate([order[1:][same], both + p]).tolist()
    links: list[list[int]] = [[] for _ in range(n)]
    for a, b in zip(u, v):
        links[a].append(b)
        links[b].append(a)
    side = [-1] * n
    for first in slots.tolist():  # ascending: a component is entered at its lowest slot
        if side[first] >= 0:
            continue
        side[first] = 0
        todo = [first]
        while todo:
            x = todo.pop()
            for y in links[x]:
                if side[y] < 0:
                    side[y] = 1 - side[x]
                    todo.append(y)
    out = np.array([max(x, 0) for x in side], dtype=np.int64)
    assert not (out[u] == out[v]).any(), "double binary tree colouring failed"
    return out


@lru_cache(maxsize=256)
def _offsets(p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per slot t·p + c with a parent: (slot, child, parent, up-offset 2h+σ, down-offset 2d(parent)+σ)."""
    parents = _parent_arrays(p)
    side = _sides(parents)
    shapes = [_heights_depths(parents[t]) for t in (0, 1)]
    height = np.concatenate([shapes[0][0], shapes[1][0]])
    par = parents.reshape(-1)
    slots = np.nonzero(par >= 0)[0]
    tree, child, parent = slots // p, slots % p, par[slots]
    depth_of_parent = np.where(tree == 0, shapes[0][1][parent], shapes[1][1][parent])
    return tree, child, parent, 2 * height[slots] + side[slots], 2 * depth_of_parent + side[slots]


@lru_cache(maxsize=4096)
def dbt_offsets(p: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The sets V_up = {2h+σ} and V_down = {2d(parent)+σ} of the double binary tree on p ranks."""
    *_, up, down = _offsets(p)
    return tuple(np.unique(up).tolist()), tuple(np.unique(down).tolist())


@lru_cache(maxsize=256)
def dbt_layout(p: int) -> tuple[tuple[tuple[int, int, int, int, int], ...], tuple[int, ...], tuple[int, ...]]:
    """Edges (tree, child, parent, up-offset 2h+σ, down-offset 2d(parent)+σ) and the sets V_up, V_down."""
    tree, child, parent, up, down = _offsets(p)
    edges = tuple(zip(tree.tolist(), child.tolist(), parent.tolist(), up.tolist(), down.tolist()))
    return (edges, *dbt_offsets(p))


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
    up, down = dbt_offsets(p)
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
        up, down = dbt_offsets(int(p))
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
        return _time_for(n, k, *dbt_offsets(nodes), cn) + 2 * (g - 1) * c.intra.time(n / (2 * k))
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
