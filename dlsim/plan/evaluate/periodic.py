"""Long pipelines walked through their periodic regime: a few periods walked, the rest counted.

In the 1F1B and interleaved schedules every stage runs, between its warm-up forwards and its
cool-down backwards, pairs (forward of virtual micro-batch w + q, backward of virtual micro-batch q),
w its warm-up. The pair coordinate q (a forward's virtual index less w, a backward's virtual index)
lines the stages up: shifting every op by S = P·v pairs (P micro-batches: 1 for 1F1B, p for the
interleaved schedule, whose op order repeats every p micro-batches of all v chunks) shifts its
micro-batch by P and leaves its chunk, its op-order neighbour and its cross-stage input (the previous
chunk's forward, the next chunk's backward of the same micro-batch, `pipeline_walk`) shifted alike,
as long as both are steady pairs; a cross-stage input sits at most L pairs away (`_lag`).

The walk is a max-plus recurrence, E(op) = max(E(previous op on the stage), E(input) + c) + d:
homogeneous (adding λ to every input adds λ to the output) and non-expansive (inputs off by at most ε
give outputs off by at most ε). So if a walk of m1 micro-batches is periodic over a window of pairs
Q = [K − 2S − L, K + S + L] on every stage (each op of Q ends exactly λ after its counterpart S
pairs earlier), a walk of m = m1 + Δ·P micro-batches is that walk with Δ periods inserted at pair K:
ops up to K as walked, each op beyond it at its counterpart's time + λ per period inserted, which
satisfies every op's recurrence (an input across the cut lies within Q, where the period holds) and
is therefore the walk (its unique solution). The last backward passes, past the window, end Δ·λ
later than walked. The check allows ε = `TOLERANCE`·(latest end)/(Δ + 1) per op, which bounds the
result's error by about `TOLERANCE` of the iteration. Where the walk is not periodic by then (a
transient longer than the tries, a max-plus period spanning several S), `periodic_walk` says None
and the caller walks every op.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from dlsim.plan.pipeline import FORWARD, interleaved_warmup

TOLERANCE = 1e-10
"""The periodicity check's allowance, as a share of the walk's latest end (split over the periods
inserted): the extension is then within about this share of the full walk."""
FIRST_MARGIN = 2
"""Periods walked before the checked window in the first try; each further try doubles the walk's
steady part (a longer transient needs more), up to half the micro-batches: a pipeline that is never
periodic costs at most about one more walk of every op."""


def _warmup(schedule: str, p: int, m: int, v: int, r: int) -> int:
    return min(p - r - 1, m) if schedule == "1f1b" else interleaved_warmup(p, m, v, r)


def _virtual(mb: int, chunk: int, p: int, v: int, forward: bool) -> int:
    """The virtual index of (micro-batch, local chunk) in a stage's forwards or backwards
    (`dlsim.plan.pipeline.interleaved`; 1F1B: the micro-batch)."""
    if v == 1:
        return mb
    return (mb // p) * p * v + (chunk if forward else v - 1 - chunk) * p + mb % p


@lru_cache(maxsize=4096)
def _lag(schedule: str, p: int, m: int, v: int) -> int:
    """L: how many pairs at most a cross-stage input lies from the op that waits for it (kept: a
    search asks for the same schedules again and again)."""
    w = [_warmup(schedule, p, m, v, r) for r in range(p)]
    mb = p * (m // p) // 2 if v > 1 else m // 2  # any micro-batch: the offsets repeat every P of them
    worst = 0
    for r in range(p):
        for chunk in range(v):
            k = chunk * p + r
            for kind, dep in ((FORWARD, k - 1), ("B", k + 1)):
                if not 0 <= dep < p * v:
                    continue
                fwd = kind == FORWARD
                q = _virtual(mb, chunk, p, v, fwd) - (w[r] if fwd else 0)
                rd = dep % p
                qd = _virtual(mb, dep // p, p, v, fwd) - (w[rd] if fwd else 0)
                worst = max(worst, abs(qd - q))
    return worst


@dataclass(frozen=True)
class Walked:
    """A walk of the pipeline (`Walk`): ends[r][local chunk] of the last backward passes, the end of
    every op of stage r in its op order (`ends`), and per stage and op what else must repeat for the
    walk to be periodic: values that move on by λ each period like the ends (`shifted`, such as when a
    communication stream is next free) and values that stay (`constant`, such as an op's duration)."""

    last: list[list[float]]
    ends: list[list[float]]
    shifted: tuple[list[list[float]], ...] = ()
    constant: tuple[list[list[float]], ...] = ()
    drifting: tuple[list[list[float]], ...] = ()
    """Values that move on by a rate of their own per stage each period (a communication stream that
    falls further behind the passes every period); the caller checks that this changes nothing else."""


@dataclass(frozen=True)
class Extension:
    """The m-micro-batch walk from a walk of `walked` micro-batches: `last` its ends, `periods`
    periods of `lam` seconds inserted, each a copy of the walked ops at positions `period_ops[r]` of
    stage r's op order; `rates[i][r]` how much `Walked.drifting[i]` moves on per period on stage r."""

    last: list[list[float]]
    walked: int
    periods: int
    lam: float
    period_ops: tuple[range, ...]
    rates: tuple[tuple[float, ...], ...] = ()


def periodic_walk(schedule: str, p: int, m: int, v: int, walk: Callable[[int], Walked]) -> Extension | None:
    """The m-micro-batch walk from a shorter walk (`walk(m1)`) extended through its periodic regime
    (see the module docstring), or None where that does not apply or the shorter walk is not
    periodic. The last call of `walk` is the walk extended."""
    if p < 2 or schedule not in ("1f1b", "interleaved") or (schedule == "1f1b" and v != 1):
        return None
    P = 1 if schedule == "1f1b" else p
    if m % P or m <= p:
        return None
    S = P * v
    L = _lag(schedule, p, m, v)
    w0 = _warmup(schedule, p, m, v, 0)  # stage 0 warms up longest
    steady = (FIRST_MARGIN + 4) * S + 2 * L + 1
    while True:
        m1 = _round_up(-(-(w0 + steady) // v), P)
        steady *= 2
        if 2 * m1 > m:
            return None  # not worth it: walk every op
        walked = walk(m1)
        found = _period(schedule, p, m, v, m1, S, L, walked)
        if found is None:
            continue
        # the period spans gamma·S pairs: periods inserted whole, from a walk of m1 ≡ m micro-batches
        gamma = found[0]
        m2 = m - (m - m1) // (gamma * P) * (gamma * P)
        if m2 != m1:
            if 2 * m2 > m:
                return None
            walked = walk(m2)
            found = _period(schedule, p, m, v, m2, S, L, walked, gamma)
            if found is None:
                continue
        gamma, lam, ops, rates = found
        periods = (m - m2) // (gamma * P)
        return Extension([[t + periods * lam for t in row] for row in walked.last], m2, periods, lam, ops, rates)
    return None


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _period(schedule: str, p: int, m: int, v: int, m1: int, S: int, L: int, walked: Walked,
            only: int | None = None) -> tuple[int, float, tuple[range, ...], tuple] | None:
    """(γ, λ, positions of one period's ops per stage, rates of the drifting values): the walk of m1 micro-batches repeats every γ·S
    pairs, λ later, over the window before the end of the stages' steady pairs, for the least γ (or
    γ = `only`); None if none does."""
    ends = walked.ends
    total = m1 * v
    w = [_warmup(schedule, p, m1, v, r) for r in range(p)]
    pairs = min(total - w[r] for r in range(p))
    latest = max(max(e) for e in ends if e)
    for gamma in ((only,) if only else range(1, (pairs - 2 * L - 1) // (4 * S) + 1)):
        shift = gamma * S
        K = pairs - 2 * shift - L - 1
        lo, hi = K - 2 * shift - L, K + shift + L
        if lo < 0:
            return None
        inserted = (m - m1) // (gamma * (S // v)) + 1
        tol = TOLERANCE * latest / inserted
        lam = ends[0][w[0] + 2 * (lo + shift)] - ends[0][w[0] + 2 * lo]
        if all(_periodic(series, w, lo, hi, shift, lam, tol) for series in (ends,) + walked.shifted) \
                and all(_periodic(series, w, lo, hi, shift, 0.0, tol) for series in walked.constant):
            rates = tuple(_rates(series, w, lo, hi, shift, tol) for series in walked.drifting)
            if all(r is not None for r in rates):
                return gamma, lam, tuple(range(wr + 2 * (K - shift + 1), wr + 2 * K + 2) for wr in w), rates
    return None


def _rates(series: list[list[float]], w: list[int], lo: int, hi: int, shift: int,
           tol: float) -> tuple[float, ...] | None:
    """Per stage, the one amount by which every pair op's value of q in [lo, hi] moves on `shift` pairs
    later (within `tol`); None where a stage has none."""
    out = []
    for e, wr in zip(series, w):
        first = wr + 2 * lo
        rate = e[first + 2 * shift] - e[first]
        out.append(rate)
        if not _periodic([e], [wr], lo, hi, shift, rate, tol):
            return None
    return tuple(out)


def _periodic(series: list[list[float]], w: list[int], lo: int, hi: int, shift: int, lam: float,
              tol: float) -> bool:
    """Whether the value of every pair op of q in [lo, hi], on every stage, is `lam` (within `tol`)
    below its counterpart's `shift` pairs later."""
    for e, wr in zip(series, w):
        for pos in range(wr + 2 * lo, wr + 2 * hi + 2):
            if abs(e[pos + 2 * shift] - e[pos] - lam) > tol:
                return False
    return True
