"""Binomial-tree algorithms rooted at rank 0 (MPICH `reduce_intra_binomial.c`, `bcast_intra_binomial.c`).

K = ⌈lg p⌉. Reduce: in step k (k = 0..K−1) every rank r with r mod 2^{k+1} = 2^k sends its partial
result of n bytes to r − 2^k, which combines it. Broadcast: in step k the ranks r ≡ 0 mod 2^{K−k}
send to r + 2^{K−1−k} (the root serves its largest subtree first, as MPICH does).

    reduce     K·[T(n) + r(n)]
    broadcast  K·T(n)
    allreduce  K·[T(n) + r(n)] + K·T(n)         (reduce then broadcast; Open MPI "nonoverlapping")

With Hockney T the allreduce is 2⌈lg p⌉(α + nβ) + ⌈lg p⌉nγ (S003; the survey's
T_tree = 2 log2 P (L + γmG) when o = g = 0 and reductions are free).

Open MPI flavour (`binomial-tree-openmpi`): Open MPI's coll/base binomial broadcast
(`ompi_coll_base_bcast_intra_generic` over `ompi_coll_base_topo_build_bmtree`, unsegmented) posts
non-blocking sends to ALL of a node's children at once and waits for all of them, so they share the
node's send port; a node forwards once it has received the whole vector. In the bmtree (root 0)
node v, whose highest set bit is h (h = −1 for the root), has the children v + 2^j for j > h with
v + 2^j < p; a node's depth is its number of set bits. c messages of n bytes sharing one port all
arrive after B(c) = (c − 1)·S(n) + T(n) (`replay.py`). The last arrival is on the path
0 → 1 → 3 → … → 2^m − 1, whose node at depth m has the most children of its depth,
c_m = ⌈lg(p − 2^m + 1)⌉ − m (any node v at depth m has v ≥ 2^m − 1 and h ≥ m − 1), so

    broadcast  Σ_{m=0}^{D−1} B(c_m),   D = ⌊lg p⌋
               = k·T(n) + k(k−1)/2·S(n) for p = 2^k (c_m = k − m); Hockney: k(k+1)/2·T(n)
    allreduce  K·[T(n) + r(n)] + that broadcast     (Open MPI allreduce algorithm 2, nonoverlapping)

(p = 4: 2T + S = 3T with Hockney, MPICH's 2T; p = 8: 6T vs 3T; p = 5: B(3) + B(1); p = 6: B(3) + B(2).)
Open MPI's reduce (`ompi_coll_base_reduce_generic` over the in-order bmtree, the same tree as
MPICH's binomial reduce above) receives its children in order of increasing subtree; with eager
sends a leaf sends at once, and for p = 2^k the child with mask 2^i arrives during
[i(T+r), i(T+r) + T], disjoint from the others, so the reduce is the lock-step K·[T(n) + r(n)]
above. For other p some children's messages overlap at the root's receive port; the lock-step
form prices them one after another (the same total port time, reductions at most K·r(n) later).

On a token-bucket link the binomial reduce keeps its form (every rank sends once, from a full
port) and the Open MPI allreduce is `bucket.openmpi_allreduce_time` (a node's port refills
between its reduce send and its broadcast sends).

Broadcast by scatter + allgather (van de Geijn; Thakur et al. 2005 §4.1): a binomial scatter
(step k sends the blocks of a subtree, at most min(2^j, p − 2^j)·n/p bytes with j = K−1−k) then a
ring allgather:

    Σ_{j=0..K−1} T(min(2^j, p − 2^j)·n/p) + (p−1)·T(n/p)
"""

from __future__ import annotations

import numpy as np

from dlsim.cost.collectives import bucket
from dlsim.cost.collectives.bits import bmtree_children, ceil_log2, floor_log2, per_rank_count
from dlsim.cost.collectives.costs import Costs
from dlsim.cost.collectives.ring import add_ring
from dlsim.cost.collectives.schedule import Schedule, ScheduleBuilder


def binomial_reduce_time(n, p, c: Costs):
    return ceil_log2(p) * c.step(n, True)


def binomial_bcast_time(n, p, c: Costs):
    return ceil_log2(p) * c.step(n)


def binomial_allreduce_time(n, p, c: Costs):
    return binomial_reduce_time(n, p, c) + binomial_bcast_time(n, p, c)


def openmpi_bcast_time(n, p, c: Costs):
    """Σ_{m<⌊lg p⌋} [(c_m − 1)·S(n) + T(n)], c_m = ⌈lg(p − 2^m + 1)⌉ − m (module doc)."""
    D = floor_log2(p)
    t, s = c.t(n), c.gap(n)
    if np.ndim(D) == 0 and np.ndim(n) == 0:
        return sum((ceil_log2(p - 2 ** m + 1) - m - 1) * s + t for m in range(int(D))) if D else 0.0 * n
    total = np.zeros(np.broadcast(n, p).shape)
    p_arr = np.asarray(p)
    for m in range(int(np.max(D))):
        kids = ceil_log2(np.maximum(p_arr - 2 ** m + 1, 1)) - m
        total = total + np.where(m < D, (kids - 1) * s + t, 0.0)
    return total


def openmpi_allreduce_time(n, p, c: Costs):
    if bucket.shaped(c):
        if np.ndim(p) == 0:
            return bucket.openmpi_allreduce_time(n, int(p), c)
        return per_rank_count(lambda n_q, q: bucket.openmpi_allreduce_time(n_q, q, c), n, p)
    return binomial_reduce_time(n, p, c) + openmpi_bcast_time(n, p, c)


def doubling_blocks_time(n, p, c: Costs):
    """Σ_{j=0..⌈lg p⌉−1} T(min(2^j, p − 2^j)·n/p): a binomial scatter, or a Bruck allgather."""
    K = ceil_log2(p)
    if np.ndim(K) == 0:
        return sum(c.step(min(2 ** j, p - 2 ** j) * n / p) for j in range(int(K))) if K else 0.0 * n
    total = np.zeros(np.broadcast(n, p).shape)
    for j in range(int(np.max(K))):
        size = np.minimum(2.0 ** j, p - 2.0 ** j) * n / p
        total = total + np.where(j < K, c.step(np.maximum(size, 0.0)), 0.0)
    return total


def scatter_allgather_bcast_time(n, p, c: Costs):
    return doubling_blocks_time(n, p, c) + (p - 1) * c.step(n / p)


def add_binomial_reduce(b: ScheduleBuilder, n: float, p: int, step: int) -> int:
    for k in range(ceil_log2(p)):
        mask = 1 << k
        for r in range(p):
            if r % (2 * mask) == mask:
                b.send(step, r, r - mask, n, reduce=True)
        step += 1
    return step


def add_binomial_bcast(b: ScheduleBuilder, n: float, p: int, step: int) -> int:
    K = ceil_log2(p)
    for k in range(K):
        mask = 1 << (K - 1 - k)
        for r in range(0, p, 2 * mask):
            if r + mask < p:
                b.send(step, r, r + mask, n)
        step += 1
    return step


def add_openmpi_bcast(b: ScheduleBuilder, n: float, p: int, step: int) -> int:
    """Open MPI's bmtree broadcast: step d = the sends of the nodes at depth d, each node's shared."""
    level = [0]
    while level:
        nxt = []
        for v in level:
            for child in bmtree_children(v, p):
                b.send(step, v, child, n, shared=True)
                nxt.append(child)
        if nxt:
            step += 1
        level = nxt
    return step


def _phases(collective: str, algorithm: str, n: float, p: int, *phases) -> Schedule:
    """A schedule made of `phases` run one after the other, each `add(b, n, p, first_step) -> next_step`."""
    b = ScheduleBuilder(collective, algorithm, n, p)
    step = 0
    for add in phases:
        step = add(b, n, p, step)
    return b.build()


def openmpi_bcast_schedule(n: float, p: int) -> Schedule:
    return _phases("broadcast", "binomial-tree-openmpi", n, p, add_openmpi_bcast)


def openmpi_allreduce_schedule(n: float, p: int) -> Schedule:
    return _phases("allreduce", "binomial-tree-openmpi", n, p, add_binomial_reduce, add_openmpi_bcast)


def binomial_reduce_schedule(n: float, p: int) -> Schedule:
    return _phases("reduce", "binomial-tree", n, p, add_binomial_reduce)


def binomial_bcast_schedule(n: float, p: int) -> Schedule:
    return _phases("broadcast", "binomial-tree", n, p, add_binomial_bcast)


def binomial_allreduce_schedule(n: float, p: int) -> Schedule:
    return _phases("allreduce", "binomial-tree", n, p, add_binomial_reduce, add_binomial_bcast)


def scatter_allgather_bcast_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("broadcast", "scatter-allgather", n, p)
    K = ceil_log2(p)
    step = 0
    for k in range(K):
        mask = 1 << (K - 1 - k)
        for r in range(0, p, 2 * mask):
            if r + mask < p:
                b.send(step, r, r + mask, min(mask, p - r - mask) * n / p)
        step += 1
    add_ring(b, n, [list(range(p))], step, reduce=False)
    return b.build()
