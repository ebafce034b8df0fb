"""SparCML's sparse allreduce (Renggli, Ashkboos, Aghagolzadeh, Alistarh, Hoefler, "SparCML:
High-performance sparse communication for machine learning", SC'19; gitlab.com/renggli/sparcml).

Each of p ranks contributes a vector of N elements of which k = ρ·N are nonzero (top-k with
density ρ), sent as (index, value) items of c = `index_bytes` + `value_bytes` bytes; the dense
vector is n = N·`value_bytes` bytes (the collective's size, as for the dense allreduce). The sum of
m such vectors has, with the nonzero indices uniform and independent (the paper's analysis model),

    K(m) = N·(1 − (1 − ρ)^m)      expected nonzeros (fill-in; k ≤ K(m) ≤ min(N, m·k))

Three algorithms, named as in the paper (reference/algorithms.md §7); T(s), S(s), r(s) = γs are the
per-message prices of `costs.py`, the sizes of each message capped at the dense n (a partial sum
denser than n / c is sent dense: the sparse stream's switch):

* ssar-recursive-doubling (latency-optimal, small data): lg p' steps; at step j each rank exchanges
  its partial sum of 2^(j−1)·w vectors (w = 2 after the non-power-of-two fold, else 1) with its
  partner at distance 2^(j−1) and merges it:
      f·[T(s_0) + r(s_0)] + Σ_{j=1..K} [T(s_j) + r(s_j)] + f·T(s_p),   s_j = min(c·K(2^(j−1)·w), n)
  (s_0 = min(c·k, n), s_p = min(c·K(p), n); the first lg g steps inside a node when the group
  spans nodes, as `butterfly.inter_steps` counts them);
* ssar-split-allgather (bandwidth-optimal, large data): the index space is split into p ranges;
  each rank sends every other rank its items of that rank's range (a sparse all-to-all of c·k
  bytes per rank, pairwise, merged on receipt), then the p reduced ranges, K(p)/p items each, are
  all-gathered (ring):
      (p − 1)·[T(c·k/p) + r(c·k/p)] + (p − 1)·T(c·K(p)/p)
* dsar-split-allgather (SparCML's dynamic switch): the same, each phase dense where the sparse form
  is larger (c·k > n: a ring reduce-scatter of n instead of the all-to-all; c·K(p) > n: the ring
  allgather of n):
      (p − 1)·[T(c·k/p) + r(c·k/p)] or (p − 1)·[T(n/p) + r(n/p)],  then (p − 1)·T(min(c·K(p), n)/p)
  At density 1 this is the dense ring allreduce of n; the switch threshold is ρ = value/c (1/2 for
  fp32 values with 32-bit indices).

`dense-fallback` (registered beside them, `registry.py`) is the cheapest dense allreduce of n: the
representation switched to dense before the reduction starts, so that the sparse allreduce is never
slower than the dense one (SparCML chooses among its algorithms by this kind of performance model).
Phases across nodes use the node-aware ring step (`ring.ring_step`).
"""

from __future__ import annotations

import numpy as np

from dlsim.cost.collectives.bits import floor_log2, pof2_floor
from dlsim.cost.collectives.butterfly import _participants, inter_steps
from dlsim.cost.collectives.costs import Costs
from dlsim.cost.collectives.ring import add_ring, ring_step
from dlsim.cost.collectives.schedule import Schedule, ScheduleBuilder

DEFAULT_INDEX_BYTES = 4.0
"""32-bit indices (SparCML's sparse stream stores (uint32 index, value) pairs)."""


def item_bytes(index_bytes: float, value_bytes: float) -> float:
    """c: bytes of one (index, value) item."""
    return index_bytes + value_bytes


def fill_in(density, m, n_elements):
    """K(m) = N·(1 − (1 − ρ)^m): expected nonzeros of the sum of m vectors of density ρ (module doc)."""
    return n_elements * (1.0 - (1.0 - np.asarray(density, dtype=float)) ** m)


def _sizes(n, density, index_bytes, value_bytes):
    """(N, c, k) of a dense vector of n bytes."""
    elements = n / value_bytes
    return elements, item_bytes(index_bytes, value_bytes), density * elements


def _capped(items, c, n):
    return np.minimum(c * items, n)


def recursive_doubling_time(n, p, costs: Costs, density, index_bytes=DEFAULT_INDEX_BYTES, value_bytes=4.0):
    """SSAR_Recursive_double (module doc); vectorised in n and p."""
    N, c, k = _sizes(n, density, index_bytes, value_bytes)
    q = pof2_floor(p)
    K = floor_log2(q)
    f = (np.asarray(p) != q) * 1
    w = 1 + f
    inter = inter_steps(p, K, costs)
    total = f * costs.step(_capped(k, c, n), True) + f * costs.step(_capped(fill_in(density, p, N), c, n))
    for j in range(1, int(np.max(K)) + 1):
        s = _capped(fill_in(density, 2 ** (j - 1) * w, N), c, n)
        term = np.where(j > K - inter, costs.step(s, True), costs.step(s, True, intra=True))
        total = total + np.where(j <= K, term, 0.0)
    return total if np.ndim(total) else float(total)


def split_allgather_time(n, p, costs: Costs, density, index_bytes=DEFAULT_INDEX_BYTES, value_bytes=4.0,
                         dynamic: bool = True):
    """SSAR_Split_allgather (`dynamic` False) or DSAR_Split_allgather (module doc); vectorised."""
    N, c, k = _sizes(n, density, index_bytes, value_bytes)
    first, second = c * k, c * fill_in(density, p, N)
    split = (p - 1) * costs.step(first / p, True)  # the sparse all-to-all, pairwise
    if dynamic:
        split = np.where(first > n, (p - 1) * ring_step(n, p, costs, True), split)
        second = np.minimum(second, n)
    total = split + (p - 1) * ring_step(second, p, costs, False)
    return total if np.ndim(total) else float(total)


def recursive_doubling_schedule(n: float, p: int, density: float, index_bytes: float = DEFAULT_INDEX_BYTES,
                                value_bytes: float = 4.0) -> Schedule:
    N, c, k = _sizes(n, density, index_bytes, value_bytes)
    b = ScheduleBuilder("sparse-allreduce", "ssar-recursive-doubling", n, p)
    ranks, rem = _participants(p)
    step = 0
    for i in range(rem):
        b.send(0, 2 * i + 1, 2 * i, float(_capped(k, c, n)), reduce=True)
    step = 1 if rem else 0
    w = 2 if rem else 1
    for j in range(1, floor_log2(len(ranks)) + 1):
        s = float(_capped(fill_in(density, 2 ** (j - 1) * w, N), c, n))
        for r_i, r in enumerate(ranks):
            b.send(step, r, ranks[r_i ^ (1 << (j - 1))], s, reduce=True)
        step += 1
    for i in range(rem):
        b.send(step, 2 * i, 2 * i + 1, float(_capped(fill_in(density, p, N), c, n)))
    return b.build(density=density)


def split_allgather_schedule(n: float, p: int, density: float, index_bytes: float = DEFAULT_INDEX_BYTES,
                             value_bytes: float = 4.0, dynamic: bool = True) -> Schedule:
    N, c, k = _sizes(n, density, index_bytes, value_bytes)
    first, second = float(c * k), float(c * fill_in(density, p, N))
    if dynamic:
        first, second = min(first, n), min(second, n)
    name = "dsar-split-allgather" if dynamic else "ssar-split-allgather"
    b = ScheduleBuilder("sparse-allreduce", name, n, p)
    if dynamic and first > n:  # dense from the start: the ring reduce-scatter
        step = add_ring(b, n, [list(range(p))], 0, reduce=True)
    else:  # each rank's items of range d straight to rank d (pairwise), merged on receipt
        for i in range(1, p):
            for r in range(p):
                b.send(i - 1, r, (r + i) % p, first / p, reduce=True)
        step = p - 1
    add_ring(b, second, [list(range(p))], step, reduce=False)
    return b.build(density=density)
