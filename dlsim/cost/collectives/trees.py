"""Binomial-tree algorithms rooted at rank 0 (MPICH `reduce_intra_binomial.c`, `bcast_intra_binomial.c`).

K = ⌈lg p⌉. Reduce: in step k (k = 0..K−1) every rank r with r mod 2^{k+1} = 2^k sends its partial
result of n bytes to r − 2^k, which combines it. Broadcast: in step k the ranks r ≡ 0 mod 2^{K−k}
send to r + 2^{K−1−k} (the root serves its largest subtree first, as MPICH does).

    reduce     K·[T(n) + r(n)]
    broadcast  K·T(n)
    allreduce  K·[T(n) + r(n)] + K·T(n)         (reduce then broadcast; Open MPI "nonoverlapping")

With Hockney T the allreduce is 2⌈lg p⌉(α + nβ) + ⌈lg p⌉nγ (S003; the survey's
T_tree = 2 log2 P (L + γmG) when o = g = 0 and reductions are free).

Broadcast by scatter + allgather (van de Geijn; Thakur et al. 2005 §4.1): a binomial scatter
(step k sends the blocks of a subtree, at most min(2^j, p − 2^j)·n/p bytes with j = K−1−k) then a
ring allgather:

    Σ_{j=0..K−1} T(min(2^j, p − 2^j)·n/p) + (p−1)·T(n/p)
"""

from __future__ import annotations

import numpy as np

from dlsim.cost.collectives.bits import ceil_log2
from dlsim.cost.collectives.costs import Costs
from dlsim.cost.collectives.ring import add_ring
from dlsim.cost.collectives.schedule import Schedule, ScheduleBuilder


def binomial_reduce_time(n, p, c: Costs):
    return ceil_log2(p) * c.step(n, True)


def binomial_bcast_time(n, p, c: Costs):
    return ceil_log2(p) * c.step(n)


def binomial_allreduce_time(n, p, c: Costs):
    return binomial_reduce_time(n, p, c) + binomial_bcast_time(n, p, c)


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


def binomial_reduce_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("reduce", "binomial-tree", n, p)
    add_binomial_reduce(b, n, p, 0)
    return b.build()


def binomial_bcast_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("broadcast", "binomial-tree", n, p)
    add_binomial_bcast(b, n, p, 0)
    return b.build()


def binomial_allreduce_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("allreduce", "binomial-tree", n, p)
    add_binomial_bcast(b, n, p, add_binomial_reduce(b, n, p, 0))
    return b.build()


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
