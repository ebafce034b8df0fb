"""The ZeRO-2/3 passes' closed form (`dlsim.plan.evaluate.affine`) against the step-by-step walk
(`StreamWalk.walk_steps`): each piece equal to the walk at its point and everywhere inside its region,
and the memoised pieces (`Pieces`) answering for other points as the walk does."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import _default_pricer
from dlsim.plan.evaluate import Evaluator
from dlsim.plan.evaluate.affine import Pieces, edges, walk_affine
from dlsim.plan.evaluate.pipeline import walk_ops
from dlsim.plan.evaluate.timing import Timing
from dlsim.plan.pipeline import FORWARD
from dlsim.plan.zero import GATHER_PREFETCH
from dlsim.spec.strategy import make_strategy

SMALL = {"layers": 4, "hidden": 1024, "heads": 16, "seq_len": 1024, "positions": 1024}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-3)


def _timing(**fields) -> Timing:
    model = as_model("gpt3-175b", SMALL)
    cluster = replace(as_cluster("dgx-a100"), nodes=1)
    ev = Evaluator(model, cluster, "fp16", lambda lay, algo: _default_pricer(cluster, lay, algo, True))
    s = make_strategy(**fields)
    t = ev.strategy_table(s)
    ranges = ev.ranges(s, t)
    return Timing(ev, s, t, ranges, ev._memory(s, t, ranges))


def _passes(tm: Timing):
    """(stage, forward?, programs as `walk_affine` takes them, the direct walk of (q, e))."""
    for k in range(tm.s.pp * tm.s.virtual_stages):
        r = k % tm.s.pp
        fwd, rec, bwd, launches, gathers, every, bwd_gathers = tm._chunk(k)[12]
        g, gb = (gathers, bwd_gathers) if every else (None, None)
        for forward in (True, False):
            plan = [(fwd, {}, g)] if forward else ([(rec, {}, None)] if rec else []) + [(bwd, launches, gb)]

            def direct(q: float, e: float, plan=plan, r=r) -> tuple[float, float]:
                now, busy = 0.0, q
                for steps, ls, gs in plan:
                    now, busy, _, _ = tm.walk_steps(steps, r, ls, gs, now, busy, e if gs is not None else 0.0)
                return now, busy

            programs = [(tm._program(x, r), ls, gs, tm._unit_order(x) if gs is not None else ()) for x, ls, gs in plan]
            yield r, forward, programs, direct


@pytest.mark.parametrize("fields", [
    {"dp": 4, "tp": 2, "global_batch": 16, "zero": 3},
    {"dp": 2, "tp": 2, "pp": 2, "global_batch": 16, "num_microbatches": 4, "zero": 3, "recompute": "full"},
    {"dp": 4, "tp": 2, "global_batch": 16, "zero": 2, "recompute": "selective"},
    {"dp": 8, "global_batch": 16, "zero": 2},
])
def test_pieces_equal_the_walk(fields):
    tm = _timing(**fields)
    rng = random.Random(7)
    checked = 0
    for _, _, programs, direct in _passes(tm):
        plain = direct(0.0, 0.0)[0]
        span = 3 * plain + 1e-6
        pieces = Pieces()
        points = [(rng.uniform(-span, span), rng.uniform(-span, 0.0)) for _ in range(60)]
        points += [(0.0, 0.0), (span, 0.0), (-span, -span)]
        for q, e in points:
            end, busy, cons = walk_affine(programs, tm.sigma, q, e)
            want = direct(q, e)
            assert _rel(end[0] + end[1] * q + end[2] * e, want[0]) < 1e-12
            assert _rel(busy[0] + busy[1] * q + busy[2] * e, want[1]) < 1e-12
            assert all(g[0] + g[1] * q + g[2] * e >= -1e-12 for g in cons)  # the point is in its own region
            bounds = edges(cons)
            assert bounds is None or all(any(b == g for g in cons) for b in bounds)
            got = pieces.get(("pass",), q, e, 1.0)
            if got is not None:  # a piece found at another point answers for this one as the walk does
                assert _rel(got[0], want[0]) < 1e-9 and _rel(got[1], want[1]) < 1e-9, (q, e, got, want)
            pieces.add(("pass",), q, e, end, busy, cons)
            checked += 1
    assert checked > 100


def test_a_piece_covers_a_stream_falling_behind():
    """A backward pass whose reductions keep the stream busy past its end: every later, busier start
    lies in one piece, so a schedule walk whose stream falls further behind walks the pass once."""
    tm = _timing(dp=8, global_batch=16, zero=2)
    _, _, programs, direct = [x for x in _passes(tm) if not x[1]][0]
    plain = direct(0.0, 0.0)[0]
    pieces = Pieces()
    q0 = 10 * plain
    end, busy, cons = walk_affine(programs, tm.sigma, q0, 0.0)
    pieces.add(("b",), q0, 0.0, end, busy, cons)
    for q in (11 * plain, 20 * plain, 1e3 * plain):
        got = pieces.get(("b",), q, 0.0, 1.0)
        assert got is not None
        want = direct(q, 0.0)
        assert _rel(got[0], want[0]) < 1e-12 and _rel(got[1], want[1]) < 1e-12


def _reference_programs(tm: Timing, parts: list, c: list) -> tuple:
    """The ZeRO-2/3 schedule walk as it was first written: every op found by `walk_ops`' round robin and
    every pass walked step by step (`walk_steps`), memoised by nothing."""
    s, p = tm.s, tm.s.pp
    state = [(0.0, 0.0)] * p
    inside = [0.0] * p

    def run_op(r, op, k, t):
        busy, prev_end = state[r]
        fwd, rec, bwd, launches, all_gathers, every_pass, bwd_gathers = parts[k]
        if not every_pass and all_gathers and op.kind == FORWARD and op.microbatch == 0:
            end, q, _, _ = tm.walk_steps(fwd, r, {}, None, 0.0, max(0.0, busy - t, tm.first_busy[r] - t), 0.0,
                                         [x - t for x in tm.first_ready[k]])
        else:
            gathers = all_gathers if every_pass else None
            floor = -sum(gathers[:1 + GATHER_PREFETCH]) if gathers else 0.0
            q, dep = max(floor, busy - t), (max(floor, prev_end - t) if gathers else 0.0)
            if op.kind == FORWARD:
                end, q, _, _ = tm.walk_steps(fwd, r, {}, gathers, 0.0, q, dep)
            else:
                now = 0.0
                if rec:
                    now, q, _, _ = tm.walk_steps(rec, r, {}, None, now, q, 0.0)
                end, q, _, _ = tm.walk_steps(bwd, r, launches, bwd_gathers if every_pass else None, now, q, dep)
        state[r] = (t + q, t + end)
        inside[r] += end
        return t + end

    last, _ = walk_ops(s.schedule, p, s.num_microbatches, s.virtual_stages, (), (), c, run_op, False)
    return last, [x[0] for x in state], inside


@pytest.mark.parametrize("fields", [
    {"dp": 2, "tp": 2, "pp": 2, "global_batch": 64, "num_microbatches": 32, "zero": 2},
    {"dp": 2, "tp": 2, "pp": 2, "global_batch": 64, "num_microbatches": 32, "zero": 3, "recompute": "full"},
    {"dp": 2, "pp": 4, "global_batch": 32, "num_microbatches": 16, "zero": 3},
    {"dp": 2, "pp": 2, "global_batch": 32, "num_microbatches": 16, "zero": 2, "schedule": "interleaved",
     "virtual_stages": 2},
])
def test_schedule_walk_equals_the_step_by_step_walk(fields):
    """`StreamWalk._programs` (dependency order, alike chunks' memos, affine pieces) against every op
    and every pass walked as written first, to 1e-9 relative."""
    tm = _timing(**fields)
    tm.run()  # sets what the walk reads (the first micro-batch's gathers)
    parts = [tm._chunk(k)[12] for k in range(tm.s.pp * tm.s.virtual_stages)]
    c = tm._p2p_times()
    got, want = tm._programs(parts, c), _reference_programs(tm, parts, c)
    scale = max(max(row) for row in want[0])
    for a, b in ((sum(got[0], []), sum(want[0], [])), (got[1], want[1]), (got[2], want[2])):
        assert len(a) == len(b) and all(abs(x - y) <= 1e-9 * scale for x, y in zip(a, b)), (a, b)


def test_kept_walks_equal_the_walk():
    """`walk_steps` kept by what it reads (the priced program's and launches' contents, gathers, times)
    answers as the walk does, a copy of the launches shares the walk and other times do not."""
    tm = _timing(dp=4, tp=2, global_batch=16, zero=3)
    rng = random.Random(3)
    walked = 0
    for k in range(tm.s.pp * tm.s.virtual_stages):
        fwd, _, bwd, launches, gathers, _, bwd_gathers = tm._chunk(k)[12]
        for steps, ls, gs in ((fwd, {}, gathers), (bwd, launches, bwd_gathers), (bwd, launches, None)):
            for _ in range(5):
                now, busy, dep = rng.uniform(0, 1e-3), rng.uniform(0, 3e-3), rng.uniform(-1e-3, 0.0)
                want = tm._walk_steps(steps, k % tm.s.pp, ls, gs, now, busy, dep, None)
                assert tm.walk_steps(steps, k % tm.s.pp, ls, gs, now, busy, dep) == want
                assert tm.walk_steps(steps, k % tm.s.pp, dict(ls), list(gs) if gs else gs, now, busy, dep) == want
                walked += 1
            if ls:  # launches of another content: another walk
                other = {pos: tuple(2 * d for d in x) for pos, x in ls.items()}
                assert tm.walk_steps(steps, k % tm.s.pp, other, gs, 0.0, 0.0, 0.0) == \
                    tm._walk_steps(steps, k % tm.s.pp, other, gs, 0.0, 0.0, 0.0, None)
    assert walked >= 15


def test_edges_of_parallel_half_planes():
    """Half-planes that differ only in their constant cut out the region of the tightest one: the
    bounding half-planes `edges` keeps hold the same points as all of them."""
    rng = random.Random(11)
    for _ in range(200):
        dirs = [(rng.uniform(-1, 1), rng.uniform(-1, 1)) for _ in range(3)]
        cons = [(rng.uniform(0.5, 2.0) + j * rng.uniform(0.0, 0.3), a, b) for j in range(4) for a, b in dirs]
        rng.shuffle(cons)
        bounds = edges(cons)
        assert bounds is not None and all(b in cons for b in bounds)
        for _ in range(50):
            q, e = rng.uniform(-4, 4), rng.uniform(-4, 4)
            inside = all(g[0] + g[1] * q + g[2] * e >= 0 for g in cons)
            if abs(min(g[0] + g[1] * q + g[2] * e for g in cons)) > 1e-9:  # off the boundary
                assert inside == all(g[0] + g[1] * q + g[2] * e >= 0 for g in bounds)
