"""Pipelined chain: the vector travels along the ranks 0 − 1 − … − (p−1) in k segments of n/k bytes.

In round t the link between chain neighbours at hop h carries segment t − h + 1, so every rank sends
and receives at most one segment per round and a phase takes k + p − 2 rounds
(`reference/algorithms.md` §3.1: broadcast `(p − 2 + k)(α + (n/k)β)`, best `k* = sqrt((p−2)nβ/α)`;
Open MPI coll/tuned "chain"/"pipeline"; NCCL's intra-node chain):

    broadcast (from rank 0)   (k + p − 2)·T(n/k)
    reduce    (to rank 0)     (k + p − 2)·[T(n/k) + r(n/k)]
    allreduce                 (k + p − 2)·[T(n/k) + r(n/k)] + (k + p − 2)·T(n/k)   (reduce, then broadcast)

The allreduce does not overlap its two phases (Open MPI's "nonoverlapping" convention).
"""

from __future__ import annotations

import numpy as np

from dlsim.cost.collectives.costs import Costs
from dlsim.cost.collectives.schedule import Schedule, ScheduleBuilder
from dlsim.cost.collectives.segments import MAX_SEGMENTS, choose_segments, continuous_optimum, linear_fit

_PHASES = {"broadcast": (False,), "reduce": (True,), "allreduce": (True, False)}


def _round_price(n, k, c: Costs, collective: str):
    return sum(c.step(n / k, reduce) for reduce in _PHASES[collective])


def chain_time(n, p, c: Costs, collective: str, segments=None, max_segments: int = MAX_SEGMENTS):
    k = chain_segments(n, p, c, collective, max_segments) if segments is None else segments
    return np.where(p > 1, (k + p - 2) * _round_price(n, k, c, collective), 0.0) if np.ndim(p) else \
        ((k + p - 2) * _round_price(n, k, c, collective) if p > 1 else 0.0)


def chain_segments(n, p, c: Costs, collective: str, max_segments: int = MAX_SEGMENTS):
    """The segment count the chain uses when none is given (see `segments.py`)."""
    a, b = linear_fit(lambda s: _round_price(s, 1, c, collective), n)
    k_star = continuous_optimum(1.0, p - 2, a, b, n)
    return choose_segments(lambda k: (k + p - 2) * _round_price(n, k, c, collective), k_star, n, max_segments)


def _add_phase(b: ScheduleBuilder, n: float, p: int, k: int, step: int, reduce: bool) -> int:
    rounds = k + p - 2 if p > 1 else 0
    for t in range(rounds):
        for h in range(1, p):
            if 0 <= t - h + 1 < k:
                src, dst = (p - h, p - h - 1) if reduce else (h - 1, h)
                b.send(step + t, src, dst, n / k, reduce=reduce)
    return step + rounds


def chain_schedule(n: float, p: int, collective: str, segments: int) -> Schedule:
    b = ScheduleBuilder(collective, "chain", n, p)
    step = 0
    for reduce in _PHASES[collective]:
        step = _add_phase(b, n, p, segments, step, reduce)
    return b.build(segments=segments)
