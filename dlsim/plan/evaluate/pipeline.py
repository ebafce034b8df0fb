"""Pipeline schedules timed without the event simulation: the stages' op orders walked
(`pipeline_walk`), the closed forms of long pipelines (`pipeline_ends`), the activation peak of a
stage's op order (`activation_peak`).
"""

from __future__ import annotations

from typing import Callable, Sequence

from dlsim.plan.evaluate.periodic import Walked, periodic_walk
from dlsim.plan.evaluate.wavefront import (cached_stage_ops, cached_stage_steps, chunk_of, reused_structure,
                                          walk as wavefront_walk)
from dlsim.plan.pipeline import FORWARD


def activation_peak(steps: Sequence[tuple[bool, int]], acts: list[tuple[float, float, float]]) -> float:
    """Peak activation bytes of one stage running `steps` ((is a forward, local chunk) per op of its
    order, `cached_stage_steps`; local chunk c keeps acts[c] = (kept, forward extra, recompute extra)
    per micro-batch), counted as the simulator's memory tracker does: kept + forward extra when a
    forward starts, the extra freed when it ends; the recompute extra when a backward starts, kept +
    that extra freed when it ends."""
    fwd_in = [kept + fwd_extra for kept, fwd_extra, _ in acts]
    bwd_out = [kept + re_extra for kept, _, re_extra in acts]
    now = peak = 0.0
    for forward, c in steps:
        if forward:
            now += fwd_in[c]
            if now > peak:  # max(peak, now), as max keeps the first of equals
                peak = now
            now -= acts[c][1]
        else:
            now += acts[c][2]
            if now > peak:
                peak = now
            now -= bwd_out[c]
    return peak


def pipeline_walk(schedule: str, p: int, m: int, v: int, f: Sequence[float], b: Sequence[float],
                  c: Sequence[float], run_op: Callable | None = None, periodic: bool = True) -> list[list[float]]:
    """When each stage's last backward pass of each local chunk ends: the stages' op orders
    (`stage_ops`) run with forward / backward times f[k], b[k] per micro-batch of global chunk k and
    transfers c[k] across boundary k → k+1, each op starting when its stage is free and its input
    has arrived (no contention: the simulator's timeline for these tasks). With `run_op(r, op, k, t)`
    an op that starts at t ends when that says instead. Returns ends[r][local chunk].

    With `periodic` (for a `run_op` whose answer depends on the start time alone, past the first
    micro-batch) a long 1F1B or interleaved pipeline is walked for a few periods of its steady regime
    and extended (`dlsim.plan.evaluate.periodic`), the same ends within 1e-10 of the iteration."""
    if periodic and m > p:
        got = periodic_walk(schedule, p, m, v, lambda m1: Walked(*walk_ops(schedule, p, m1, v, f, b, c, run_op, True)))
        if got is not None:
            return got.last
    return walk_ops(schedule, p, m, v, f, b, c, run_op, False)[0]


def walk_ops(schedule: str, p: int, m: int, v: int, f: Sequence[float], b: Sequence[float], c: Sequence[float],
          run_op: Callable | None, record: bool) -> tuple[list[list[float]], list[list[float]]]:
    """`pipeline_walk` op by op; with `record` also the end of every op of each stage, in its op order."""
    st = reused_structure(schedule, p, m, v)
    if st is not None:  # the schedule's dependency structure walked in one pass (`wavefront`)
        E = wavefront_walk(st, f, b, c) if run_op is None else _walk_timed(st, schedule, p, m, v, c, run_op)
        o = st.offsets
        return ([[E[j] for j in ids] for ids in st.last],
                [E[o[r]:o[r + 1]] for r in range(p)] if record else [])
    K = p * v
    ops = [cached_stage_ops(schedule, p, m, v, r) for r in range(p)]
    pos = [0] * p
    free = [0.0] * p
    # when the forward / backward of global chunk k and micro-batch mb ended: fend[k][mb] (None: not yet)
    fend: list[list[float | None]] = [[None] * m for _ in range(K)]
    bend: list[list[float | None]] = [[None] * m for _ in range(K)]
    last = [[0.0] * v for _ in range(p)]
    ends: list[list[float]] = [[] for _ in range(p)]
    remaining = sum(len(o) for o in ops)
    while remaining:
        progressed = False
        for r in range(p):
            order, i = ops[r], pos[r]
            t = free[r]
            done = ends[r]
            while i < len(order):
                op = order[i]
                kind, mb, chunk = op
                k = chunk * p + r
                if kind == FORWARD:
                    if k > 0:
                        dep = fend[k - 1][mb]
                        if dep is None:
                            break
                        t = max(t, dep + c[k - 1])
                    t = t + f[k] if run_op is None else run_op(r, op, k, t)
                    fend[k][mb] = t
                else:
                    if k < K - 1:
                        dep = bend[k + 1][mb]
                        if dep is None:
                            break
                        t = max(t, dep + c[k])
                    t = t + b[k] if run_op is None else run_op(r, op, k, t)
                    bend[k][mb] = t
                    last[r][chunk] = t
                if record:
                    done.append(t)
                i += 1
            if i != pos[r]:
                remaining -= i - pos[r]
                pos[r], free[r] = i, t
                progressed = True
        if not progressed:  # pragma: no cover  (the schedules are deadlock-free)
            raise RuntimeError(f"pipeline schedule {schedule} deadlocked")
    return last, ends


def _walk_timed(st, schedule: str, p: int, m: int, v: int, c: Sequence[float], run_op: Callable) -> list[float]:
    """The structure's ops (`wavefront.Structure.ops`, the op-by-op walk's order) timed by `run_op`
    from the same start as `walk_ops`'s (the later of the stage's previous op's end and the input's
    arrival; a missing one is the zero slot), without searching for the next op that can run."""
    ops = [op for r in range(p) for op in cached_stage_ops(schedule, p, m, v, r)]  # by id
    E = [0.0] * (st.n + 1)
    transfers = list(c) + [0.0]
    K = st.K
    for j, prev, dep, trans, r, slot in st.ops:
        t = E[prev]
        x = E[dep] + transfers[trans]
        if x > t:
            t = x
        E[j] = run_op(r, ops[j], chunk_of(slot, K), t)
    return E


def pipeline_ends(schedule: str, p: int, m: int, v: int, f: list[float], b: list[float],
              c: list[float]) -> list[list[float]]:
    """Closed forms (see `dlsim.plan.evaluate`): ends[r][local chunk] of the last backward passes."""
    F = [sum(f[c * p + r] for c in range(v)) for r in range(p)]
    B = [sum(b[c * p + r] for c in range(v)) for r in range(p)]
    if p == 1:
        return [[m * (F[0] + B[0]) - sum(b[1:c]) if c else m * (F[0] + B[0]) for c in range(v)]]
    total_c = sum(c)
    step = [F[r] + B[r] for r in range(p)]
    if schedule == "gpipe":
        end0 = sum(F) + (m - 1) * max(F) + sum(B) + (m - 1) * max(B) + 2 * total_c
    elif schedule == "interleaved":
        end0 = m * max(step) + (sum(step) - max(step)) / v + 2 * total_c / v
    else:
        end0 = sum(step) + 2 * total_c + (m - 1) * max(step)
    ends = []
    back = 0.0
    for r in range(p):  # stage r's last backward ends before stage 0's by the path back to it
        if r:
            back += B[r - 1] / v + (c[r - 1] if v == 1 else total_c / (p * v - 1))
        # the other local chunks' last passes: p backward passes of chunk 0 (and the later chunks) after them
        ends.append([end0 - back - (c_ * p * B[r] / v if c_ else 0.0) for c_ in range(v)])
    return ends
