"""A pass beside the communication stream as a piecewise-affine function of when the stream is free
and when the previous pass ended (relative to the pass's start): the closed form of
`dlsim.plan.evaluate.stream.StreamWalk.walk_steps` that the ZeRO-2/3 schedule walks evaluate instead of
walking every pass again.

Every step of `walk_steps` maps (now, busy) by a maximum of affine expressions or an affine expression
chosen by a comparison (compute slowed by σ while the stream is busy: now' = now + d(1 + σ) while the
window busy − now holds all of it, else busy + d − (busy − now)/(1 + σ); a queued collective
busy' = busy + c, now' = busy'; a launch busy' = max(busy, now) + c; a gather ready at
max(busy, first_dep or now) + g). With the starting stream q and the previous pass's end e as
variables, the walk at one point (q, e) takes one branch at each step, and on the set of points where
every comparison comes out the same way — an intersection of half-planes — the pass's end and its
stream are one affine function of (q, e) (`walk_affine` returns it with the half-planes). Each piece
of the function is continuous with its neighbours (each branch agrees with the other at the
comparison's boundary: a stretched kernel whose window is exactly its slowed length, a stream free
exactly when a collective starts), so evaluating a piece at a point of its closed boundary gives the
walk's value. `Pieces` keeps the pieces found along lines where one of the two variables is fixed,
which is how the schedule walks meet them (a stream that falls further behind each period at a fixed
previous-pass gap, a gap that varies while the stream is idle): one walk per piece, then two
multiplications per pass. The affine value differs from the walk's only by the rounding of the
sums' order (about 1e-16 of the times involved; tests/test_evaluate_affine.py holds the two equal to
1e-12 relative).
"""

from __future__ import annotations

from typing import Sequence

from dlsim.cost.overlap import overlap_cost
from dlsim.plan.zero import GATHER_PREFETCH

COMPUTE, COLLECTIVE, OVERLAP, OVERLAP_QUEUED = 0, 1, 2, 3  # step kinds of a priced program (`StreamWalk._program`)

SNAP = 1e-12
"""A point within this share of its pass's start time outside a piece is taken from the piece: the
times q and e are differences of times that far along, rounded alike, so points that differ by their
rounding alone (the same pass in every period of a schedule) share the piece they sit on the boundary
of. The piece's affine extension is within that distance of the walk's value (the pieces agree at
their boundaries), about 1e-12 of the iteration per pass."""

Affine = tuple[float, float, float]
"""c0 + cq·q + ce·e."""


def _at(x: Affine, q: float, e: float) -> float:
    return x[0] + x[1] * q + x[2] * e


def _sub(x: Affine, y: Affine) -> Affine:
    return (x[0] - y[0], x[1] - y[1], x[2] - y[2])


def _add(x: Affine, c: float) -> Affine:
    return (x[0] + c, x[1], x[2])


def walk_affine(programs: Sequence[tuple[list, dict, list | None, tuple]], sigma: float, q: float,
                e: float) -> tuple[Affine, Affine, list[Affine]]:
    """The steps of `programs` walked one after the other from now = 0 with the stream busy until q,
    as `walk_steps` runs them (per program: its priced steps, launches by step position, the gathers
    of its parameter units or None, the units in step order; a program's gathers after the first
    ones wait for `e`, the previous pass's end), tracking now and busy as affine functions of (q, e).
    Returns (end, stream busy until, half-planes g with g(q, e) ≥ 0 where the same branches are taken)."""
    now: Affine = (0.0, 0.0, 0.0)
    busy: Affine = (0.0, 1.0, 0.0)
    dep: Affine = (0.0, 0.0, 1.0)
    cons: list[Affine] = []

    def record(x: Affine) -> None:
        if x[1] or x[2]:  # a comparison of constants comes out the same way everywhere
            cons.append(x)

    def larger(x: Affine, y: Affine) -> Affine:
        """max(x, y) as Python's max takes it (x on a tie), recording the side taken."""
        d = _sub(x, y)
        if _at(d, q, e) >= 0:
            record(d)
            return x
        record(_sub(y, x))
        return y

    def not_negative(x: Affine) -> bool:
        """Whether x(q, e) ≥ 0, recording the side taken."""
        if _at(x, q, e) >= 0:
            record(x)
            return True
        record((-x[0], -x[1], -x[2]))
        return False

    def positive(x: Affine) -> bool:
        """Whether x(q, e) > 0, recording the side taken (a tie belongs to both: the branches agree)."""
        if _at(x, q, e) > 0:
            record(x)
            return True
        record((-x[0], -x[1], -x[2]))
        return False

    for program, launches, gathers, order in programs:
        unit = None
        ready: dict[int, Affine | None] = {}
        where = {u: i for i, u in enumerate(order)} if gathers is not None else {}
        for pos, (kind, d, c, queued, st_unit) in enumerate(program):
            if gathers is not None and st_unit >= 0 and st_unit != unit:
                j = where[st_unit]
                for k in range(j, min(len(order), j + 1 + GATHER_PREFETCH)):
                    u = order[k]
                    if u in ready:
                        continue
                    if gathers[u] is None:  # kept gathered since its forward pass: waits for nothing
                        ready[u] = None
                        continue
                    busy = _add(larger(busy, dep if k <= GATHER_PREFETCH else now), gathers[u])
                    ready[u] = busy
                unit = st_unit
                if ready[st_unit] is not None:
                    now = larger(now, ready[st_unit])
            if kind == COMPUTE:  # `positive` and `not_negative` written out (the hot path), the same sums
                if sigma > 0:
                    w0, w1, w2 = busy[0] - now[0], busy[1] - now[1], busy[2] - now[2]
                    if w0 + w1 * q + w2 * e > 0:
                        if w1 or w2:
                            cons.append((w0, w1, w2))
                        x0 = w0 + -d * (1 + sigma)
                        if x0 + w1 * q + w2 * e >= 0:  # the window holds the slowed kernel
                            if w1 or w2:
                                cons.append((x0, w1, w2))
                            now = (now[0] + d * (1 + sigma), now[1], now[2])
                        else:  # slowed until the stream is free, then at full speed
                            if w1 or w2:
                                cons.append((-x0, -w1, -w2))
                            s = 1 + sigma
                            now = (busy[0] + d - w0 / s, busy[1] - w1 / s, busy[2] - w2 / s)
                    else:
                        if w1 or w2:
                            cons.append((-w0, -w1, -w2))
                        now = (now[0] + d, now[1], now[2])
                else:
                    now = (now[0] + d, now[1], now[2])
            elif kind == COLLECTIVE:
                if queued and positive(_sub(busy, now)):
                    busy = _add(busy, c)
                    now = busy
                else:
                    now = _add(now, c)
            elif kind == OVERLAP_QUEUED:
                if positive(_sub(busy, now)):
                    busy = _add(busy, c)
                    now = larger(_add(now, d), busy)
                else:
                    extra, exposed = overlap_cost(d, c, sigma)
                    busy = _add(now, c)
                    now = _add(now, d + extra + exposed)
            else:
                now = (now[0] + (d + c), now[1], now[2])
            if pos in launches:
                for dur in launches[pos]:
                    busy = _add(larger(busy, now), dur)
    return now, busy, cons


BOX = 1e6
"""Seconds: the square |q|, |e| ≤ BOX in which the pieces' regions are cut out (`edges`)."""


def edges(cons: list[Affine]) -> list[Affine] | None:
    """The half-planes of `cons` that bound their intersection (a convex polygon, cut out of the
    square of side 2·`BOX` one half-plane after another, Sutherland and Hodgman's clipping, each edge
    labelled with the half-plane it lies on); None where the region is thinner than a polygon (a
    segment or a point: every half-plane is kept then)."""
    poly: list[tuple[float, float, int]] = [(-BOX, -BOX, -1), (BOX, -BOX, -1), (BOX, BOX, -1), (-BOX, BOX, -1)]
    # of half-planes that differ only in their constant (a walk records the same comparison step after
    # step, the constant moving on), the tightest one holds the others: clipped by it alone
    tightest: dict[tuple[float, float], int] = {}
    for i, g in enumerate(cons):
        if g[1] or g[2]:
            j = tightest.get((g[1], g[2]))
            if j is None or g[0] < cons[j][0]:
                tightest[(g[1], g[2])] = i
    for i in sorted(tightest.values()):
        g = cons[i]
        out: list[tuple[float, float, int]] = []
        n = len(poly)
        for j in range(n):
            px, py, label = poly[j]
            qx, qy, _ = poly[(j + 1) % n]
            gp = g[0] + g[1] * px + g[2] * py
            gq = g[0] + g[1] * qx + g[2] * qy
            if gp >= 0:
                out.append((px, py, label))
                if gq < 0:
                    w = gp / (gp - gq)
                    out.append((px + w * (qx - px), py + w * (qy - py), i))
            elif gq >= 0:
                w = gp / (gp - gq)
                out.append((px + w * (qx - px), py + w * (qy - py), label))
        poly = out
        if len(poly) < 3:
            return None
    return [cons[i] for i in sorted({label for _, _, label in poly if label >= 0})]


def on_piece(piece: tuple, q: float, e: float, slack: float) -> tuple[float, float] | None:
    """(end, stream busy until) of a pass at (q, e) from one piece (bounds, end, busy) of its closed
    form, if the point lies in the piece's region (no bounding half-plane below `slack`), else None."""
    bounds, end, busy = piece
    for g in bounds:
        if g[0] + g[1] * q + g[2] * e < slack:
            return None
    return end[0] + end[1] * q + end[2] * e, busy[0] + busy[1] * q + busy[2] * e


class Pieces:
    """The pieces of passes' affine functions found so far (see the module docstring): `get` gives
    (end, stream busy until) of a pass at (q, e) from a piece whose region holds the point, `add` keeps
    a piece walked at (q, e), its region by the half-planes that bound it (`edges`)."""

    def __init__(self) -> None:
        self._pieces: dict[tuple, list[tuple[list[Affine], Affine, Affine]]] = {}

    def get(self, key: tuple, q: float, e: float, scale: float) -> tuple[float, float] | None:
        """The pass `key` at (q, e) from a piece whose region holds the point, or within `SNAP` ×
        `scale` (the pass's start time: the rounding of the times q and e are differences of) of it."""
        slack = -SNAP * scale
        pieces = self._pieces.get(key, ())
        for i, piece in enumerate(pieces):
            got = on_piece(piece, q, e, slack)
            if got is not None:
                if i:  # the piece last found first: a walk meets its passes' pieces in runs
                    pieces[0], pieces[i] = pieces[i], pieces[0]
                return got
        return None

    def of(self, key: tuple) -> list[tuple[tuple[Affine, ...], Affine, Affine]]:
        """The pieces of pass `key`, the list that `get` searches (the piece last found first) and `add`
        extends: a caller may test its first piece (`on_piece`) as `get` does first (`StreamWalk._walk_programs`)."""
        return self._pieces.setdefault(key, [])

    def add(self, key: tuple, q: float, e: float, end: Affine, busy: Affine, cons: list[Affine]) -> None:
        bounds = edges(cons)
        self._pieces.setdefault(key, []).append((tuple(cons if bounds is None else bounds), end, busy))
