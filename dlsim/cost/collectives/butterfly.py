"""Butterfly algorithms: recursive doubling, recursive halving and Rabenseifner.

Sources: Thakur, Rabenseifner, Gropp, "Optimization of Collective Communication Operations in
MPICH", IJHPCA 19(1) 2005 (formulas also in MPICH's `allreduce_intra_recursive_doubling.c` and
`allreduce_intra_reduce_scatter_allgather.c`); Rabenseifner, "Optimization of collective reduction
operations", ICCS 2004. K = lg p' where p' = 2^⌊lg p⌋.

Ranks that are not a power of two fold first, as MPICH does: with rem = p − p', rank 2i+1 (i < rem)
sends its whole vector to rank 2i, which combines it; the p' ranks {2i : i < rem} ∪ {r ≥ 2·rem}
run the power-of-two algorithm; at the end rank 2i sends rank 2i+1 its result. f = [rem > 0].

    allreduce, recursive doubling:  f·[T(n) + r(n)] + K·[T(n) + r(n)] + f·T(n)
    allreduce, Rabenseifner:        f·[T(n) + r(n)] + Σ_{k=1..K}[T(n/2^k) + r(n/2^k)] + Σ_{k=1..K} T(n/2^k) + f·T(n)
    reduce-scatter, recursive halving: f·[T(n) + r(n)] + Σ_{k=1..K}[T(n/2^k) + r(n/2^k)] + f·T(n/p)
    allgather, recursive doubling (p a power of two): Σ_{k=1..K} T(n/2^k)
    reduce, Rabenseifner (reduce-scatter + binomial gather to rank 0): f·[T(n) + r(n)] + 2-phase sums as allreduce

With Hockney T and p a power of two these are lg p·(α + nβ + nγ) and
2 lg p·α + 2((p−1)/p)nβ + ((p−1)/p)nγ (§3.1 of `reference/algorithms.md`). After folding, the
convention here splits the vector evenly among the p' ranks (MPICH splits by whole blocks).
On a token-bucket link the recursive-doubling and Rabenseifner allreduce steps are priced with the
bucket carried from step to step (`bucket.lockstep_time`; halving n/2 … n/2^K, then doubling
n/2^K … n/2: the order matters there).

Across nodes (`Costs.spans`: p = N·g ranks, g per node, both powers of two, node-contiguous): the
step that moves n/2^k bytes pairs ranks p/2^k apart (the halving goes p/2, p/4, … as MPICH's
reduce-scatter does, the doubling mirrors it), so the first lg N of the K terms of each sum cross
nodes — every rank of a node at once, each at its device's share B_dev of the NICs (`main`) — and
the last lg g stay on the intra-node tier. The inter-node bytes of Rabenseifner's allreduce are
then 2(1 − 1/N)·n per rank, g times the node-level bound's per-rank share: MPICH's distance order
sends the big halves across nodes.
"""

from __future__ import annotations

import numpy as np

from dlsim.cost.collectives import bucket
from dlsim.cost.collectives.bits import floor_log2, is_pof2, pof2_floor
from dlsim.cost.collectives.costs import Costs
from dlsim.cost.collectives.schedule import Schedule, ScheduleBuilder


def inter_steps(p, K, c: Costs):
    """How many of the K halving/doubling terms cross nodes: lg(p/g) across nodes (module doc), else K."""
    if c.node is None:
        return K
    g = c.ranks_per_node
    topo = c.spans(p) & is_pof2(p) & bool(is_pof2(g))
    return np.where(topo, floor_log2(np.maximum(np.asarray(p) // g, 1)), K) if np.ndim(p) else \
        (floor_log2(p // g) if topo else K)


def halving_sum(n, K, c: Costs, reduce: bool, inter=None):
    """Σ_{k=1..K} [T(n/2^k) (+ r(n/2^k))], vectorised over n and K; terms k > `inter` on the intra tier."""
    inter = K if inter is None else inter
    if np.ndim(K) == 0 and np.ndim(inter) == 0:
        return sum(c.step(n / 2.0 ** k, reduce, intra=k > inter) for k in range(1, int(K) + 1)) if K else 0.0 * n
    total = np.zeros(np.broadcast(n, K, inter).shape)
    for k in range(1, int(np.max(K)) + 1):
        term = np.where(k > inter, c.step(n / 2.0 ** k, reduce, intra=True), c.step(n / 2.0 ** k, reduce))
        total = total + np.where(k <= K, term, 0.0)
    return total


def _fold(p):
    """(p', K, f): participants after folding, their lg, and whether a fold step happens."""
    q = pof2_floor(p)
    return q, floor_log2(q), (p != q) * 1


def recursive_doubling_allreduce_time(n, p, c: Costs):
    if bucket.shaped(c):
        return bucket.lockstep_time(c, bucket.recursive_doubling_steps(n, p))
    _, K, f = _fold(p)
    inter = inter_steps(p, K, c)
    return f * c.step(n, True) + inter * c.step(n, True) + (K - inter) * c.step(n, True, intra=True) + f * c.step(n)


def rabenseifner_allreduce_time(n, p, c: Costs):
    if bucket.shaped(c):
        return bucket.lockstep_time(c, bucket.rabenseifner_steps(n, p))
    _, K, f = _fold(p)
    inter = inter_steps(p, K, c)
    return (f * c.step(n, True) + halving_sum(n, K, c, True, inter) + halving_sum(n, K, c, False, inter)
            + f * c.step(n))


def recursive_halving_reduce_scatter_time(n, p, c: Costs):
    _, K, f = _fold(p)
    return f * c.step(n, True) + halving_sum(n, K, c, True, inter_steps(p, K, c)) + f * c.step(n / p)


def recursive_doubling_allgather_time(n, p, c: Costs):
    _, K, _ = _fold(p)
    return halving_sum(n, K, c, False, inter_steps(p, K, c))


def rabenseifner_reduce_time(n, p, c: Costs):
    _, K, f = _fold(p)
    inter = inter_steps(p, K, c)
    return f * c.step(n, True) + halving_sum(n, K, c, True, inter) + halving_sum(n, K, c, False, inter)


# ---------------------------------------------------------------------------------------------
# schedules

def _participants(p: int) -> tuple[list[int], int]:
    """Original rank of each of the p' participants, and rem."""
    q = pof2_floor(p)
    rem = p - q
    return [2 * i for i in range(rem)] + list(range(2 * rem, p)), rem


def _fold_in(b: ScheduleBuilder, n: float, rem: int) -> int:
    for i in range(rem):
        b.send(0, 2 * i + 1, 2 * i, n, reduce=True)
    return 1 if rem else 0


def _fold_out(b: ScheduleBuilder, nbytes: float, rem: int, step: int) -> None:
    for i in range(rem):
        b.send(step, 2 * i, 2 * i + 1, nbytes)


def _exchange(b: ScheduleBuilder, step: int, ranks: list[int], distance: int, nbytes: float, reduce: bool) -> None:
    for j, r in enumerate(ranks):
        b.send(step, r, ranks[j ^ distance], nbytes, reduce=reduce)


def _halving(b: ScheduleBuilder, step: int, ranks: list[int], n: float) -> int:
    q = len(ranks)
    for k in range(floor_log2(q)):
        _exchange(b, step, ranks, q >> (k + 1), n / 2.0 ** (k + 1), True)
        step += 1
    return step


def _doubling(b: ScheduleBuilder, step: int, ranks: list[int], n: float) -> int:
    q = len(ranks)
    for k in range(floor_log2(q)):
        _exchange(b, step, ranks, 1 << k, n * 2.0 ** k / q, False)
        step += 1
    return step


def recursive_doubling_allreduce_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("allreduce", "recursive-doubling", n, p)
    ranks, rem = _participants(p)
    step = _fold_in(b, n, rem)
    for k in range(floor_log2(len(ranks))):
        _exchange(b, step, ranks, 1 << k, n, True)
        step += 1
    _fold_out(b, n, rem, step)
    return b.build()


def rabenseifner_allreduce_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("allreduce", "rabenseifner", n, p)
    ranks, rem = _participants(p)
    step = _doubling(b, _halving(b, _fold_in(b, n, rem), ranks, n), ranks, n)
    _fold_out(b, n, rem, step)
    return b.build()


def recursive_halving_reduce_scatter_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("reduce-scatter", "recursive-halving", n, p)
    ranks, rem = _participants(p)
    step = _halving(b, _fold_in(b, n, rem), ranks, n)
    _fold_out(b, n / p, rem, step)
    return b.build()


def recursive_doubling_allgather_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("allgather", "recursive-doubling", n, p)
    _doubling(b, 0, list(range(p)), n)
    return b.build()


def rabenseifner_reduce_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("reduce", "rabenseifner", n, p)
    ranks, rem = _participants(p)
    step = _halving(b, _fold_in(b, n, rem), ranks, n)
    q = len(ranks)
    for k in range(floor_log2(q)):
        for j in range(q):
            if j % (2 << k) == (1 << k):
                b.send(step, ranks[j], ranks[j - (1 << k)], n * 2.0 ** k / q)
        step += 1
    return b.build()
