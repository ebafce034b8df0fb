"""Steady-state extension of long pipelines: simulate a few steady periods, repeat the period.

With the 1F1B schedule every stage, once its warm-up is over, repeats the same pair (forward of
micro-batch i + w, backward of micro-batch i) until its cool-down; with m micro-batches instead of
m', the op order of every stage differs only by m − m' more such pairs. The interleaved schedule
repeats the same way with a period of P = pp micro-batches (its pairs run virtual micro-batches, each
period every chunk of pp micro-batches; m and m' multiples of pp); 1F1B's period is P = 1. The engine
is deterministic and time-invariant, so once the whole pipeline is periodic (every task of
micro-batch i + P starts and ends exactly one period λ after its counterpart of micro-batch i) the
m-micro-batch timeline is the m'-micro-batch timeline cut at a time τ inside the periodic part, with
Δ = (m − m')/P periods of length λ inserted there: everything before τ unchanged, everything after τ
later by Δ·λ and its micro-batch index higher by Δ·P.

`simulate_steady` simulates m' micro-batches event by event (`reduced_microbatches`: for 1F1B first
m' = pp + FIRST_MARGIN, then, where no cut passes there, pp + pp // 4 + MARGIN, and for ZeRO-3 then
ZERO3_DEPTHS·pp; for the interleaved schedule the first stage's warm-up and INTERLEAVED_PERIODS
periods, then twice as many; each where it leaves a third of the micro-batches unsimulated), checks
that periodicity on a window of three periods around τ (every task touching it is a micro-batch task
whose counterpart P micro-batches later is exactly λ later, within 1e-9 of the makespan, and ends
before `divergence`: up to then the m'-run is the m-run event for event, so the window checked is the
m-run's own and any m' finds the same cut and period), and extends the record: makespan
+Δ·λ; per-device breakdowns and communication +Δ·(their value inside one period); memory peaks
as simulated (1F1B holds at most pp − stage micro-batches, the interleaved schedule its warm-up + 1
chunk-micro-batches, whatever m is); the critical path with its periodic segment repeated (its last
tasks renamed and shifted): a segment from a task to its counterpart k periods later, repeated Δ/k
times (k = 1 where the path repeats every period; with asynchronous tensor-parallel communication a
1F1B path zigzags through every stage and back, k = pp, and the reduced count is chosen so that pp
divides Δ; the periodicity is then checked over the whole segment); tasks and the measured share
+Δ·(one period's tasks).
The reduced run is tracked for near-ties (`dlsim.sim.ties`): two chains equal in exact arithmetic
whose order only the last bits of their times decide (requests of a contended port, waits for one
task, memory changes of a device near its peak, the critical path's predecessors). Before the cut
the reduced run is the full run, bit for bit; past it the full run's times have other last bits, so
it may break such a tie the other way in any period it repeats: a cut is accepted only where none
lies at or after its window's start, and the critical path's choices from its periodic segment on
(GPT-3 175B on pp 8 with Megatron-LM 2022's interleaved schedule requests a device's port for a
forward and an all-gather at one instant every period: simulated in full, its tracked run stopped
at the ABORT_PORT_RACES-th tie).
`events` counts the events actually processed. Where the check fails, or for another schedule, a
trace, expanded or explicit collectives, it answers None and the caller runs the full simulation.
tests/test_sim_steady.py holds the extension equal to the full simulation within float rounding.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import replace
from typing import Any

import numpy as np

from dlsim.plan.iteration import IterationInputs, build_iteration
from dlsim.plan.pipeline import stage_ops
from dlsim.plan.taskgraph import TaskGraph
from dlsim.results import TimeBreakdown
from dlsim.results_sim import DeviceRecord, SimResult
from dlsim.sim.analysis import comm_spans, critical_path, device_times, segment_totals, task_seconds, window_times
from dlsim.sim.engine import Timeline
from dlsim.sim.run import CRITICAL_PATH_TASKS, RunInfo, device_records, summarise
from dlsim.sim.ties import Ties, TooManyTies, critical_path_ties, execute_tracked, memory_races, port_races, wait_races

FIRST_MARGIN = 8  # the first try: micro-batches simulated beyond pp (cuts at pp to pp + 3; with 6, a 64-stage
# pipeline whose backward adds gradient-accumulation kernels settles one micro-batch after the last cut)
MARGIN = 10  # extra micro-batches simulated beyond pp + pp // 4 (the last stage lags the first by about
# pp·t_f/(t_f + t_b) micro-batches; the warm-up's transient dies out over a few more)
INTERLEAVED_PERIODS = 5  # interleaved: periods of pp micro-batches simulated beyond the first stage's warm-up
# (three make the checked window, two let the warm-up's transient die out: GPT-3 175B on pp 8, v 3, dp 16 with
# Megatron-LM 2022's asynchronous tensor-parallel backward is periodic from 7 periods, not from 6)
ZERO3_DEPTHS = 4  # ZeRO-3 pipelines (every pass gathers its parameter units and reduce-scatters its gradients on
# one communication stream): the backlog settles later; a third count of this many pipeline depths (GPT-3 175B,
# pp 8 and 32: periodic from 4·pp micro-batches, not from 2·pp or 3·pp)
MB_LABELS = frozenset({"F", "R", "B", "SF", "SB", "G", "C", "AG"})  # labels (kind, chunk, micro-batch, ...)
TOLERANCE = 1e-9  # periodicity checked to this fraction of the makespan


def period_microbatches(schedule: str, pp: int) -> int:
    """Micro-batches per period of a schedule's steady part: 1 for 1F1B (a forward and a backward per
    micro-batch), pp for the interleaved schedule (its op order repeats every pp micro-batches of all
    its chunks)."""
    return pp if schedule == "interleaved" else 1


def reduced_microbatches(x: IterationInputs) -> tuple[int, ...]:
    """Micro-batch counts to try for the extension, smallest first; () where it does not apply.

    1F1B: the first, pp + FIRST_MARGIN, leaves room for cuts at micro-batches pp to pp + 3 (a 1F1B
    pipeline's first stage leaves its warm-up at micro-batch pp − 1); where no cut passes there, the
    larger count pp + pp // 4 + MARGIN follows, and for ZeRO-3 ZERO3_DEPTHS·pp; with asynchronous
    tensor-parallel communication 2·pp + FIRST_MARGIN and 2·pp + pp // 4 + MARGIN, each raised until pp
    divides the micro-batches left. Interleaved (periods
    of pp micro-batches): the first stage's warm-up (2(pp − 1) + (v − 1)·pp virtual micro-batches) and
    INTERLEAVED_PERIODS more periods, then twice as many. A count is tried where it leaves at least a
    third of the micro-batches unsimulated (a failed check costs its reduced run), half of them for the
    interleaved schedule with asynchronous tensor-parallel communication, whose reduced runs often
    meet near-ties (`dlsim.sim.ties`: GPT-3 175B on pp 8, v 3 with Megatron-LM 2022's stack stops at
    its eighth, a quarter of a full run's cost with its graph's construction, then runs in full)."""
    s = x.strategy
    if s.schedule not in ("1f1b", "interleaved") or s.pp < 2 or x.expand or x.explicit_dp or x.explicit_tp:
        return ()
    if (s.tp_async_backward or s.tp_comm_overlap) and s.tp > 1 and s.schedule == "1f1b":
        # the critical path zigzags across the stages with a stride of pp micro-batches (`_segment`): the
        # reduced run holds it in its steady part from about 2·pp micro-batches, and pp divides m − m1
        m = s.num_microbatches
        counts = {c + (m - c) % s.pp for c in (2 * s.pp + FIRST_MARGIN, 2 * s.pp + s.pp // 4 + MARGIN)}
        return tuple(m1 for m1 in sorted(counts) if 3 * m1 <= 2 * m)
    if s.schedule == "interleaved":
        if s.num_microbatches % s.pp:
            return ()
        warm = -(-(2 * (s.pp - 1) + (s.virtual_stages - 1) * s.pp) // (s.pp * s.virtual_stages))  # periods
        counts = {s.pp * (warm + INTERLEAVED_PERIODS), s.pp * (warm + 2 * INTERLEAVED_PERIODS)}
    else:
        counts = {s.pp + FIRST_MARGIN, s.pp + s.pp // 4 + MARGIN}
    if s.zero == 3 and s.dp > 1:
        counts.add(ZERO3_DEPTHS * s.pp)
    left = 2 if s.schedule == "interleaved" and (s.tp_async_backward or s.tp_comm_overlap) and s.tp > 1 else 3
    return tuple(m1 for m1 in sorted(counts) if left * m1 <= (left - 1) * s.num_microbatches)


def simulate_steady(x: IterationInputs, info: RunInfo) -> SimResult | None:
    """The record of the full iteration from a reduced simulation, or None (see the module docstring)."""
    s = x.strategy
    P = period_microbatches(s.schedule, s.pp)
    for m1 in reduced_microbatches(x):
        graph = build_iteration(replace(x, strategy=replace(s, num_microbatches=m1)))
        try:
            tl, ties = execute_tracked(graph)
        except TooManyTies:  # its steady part breaks a near-tie again and again: no count would pass
            return None
        out = extend(graph, tl, info, (s.num_microbatches - m1) // P, s.pp,
                     divergence(graph, tl, s.pp, m1, s.schedule, s.virtual_stages), s.schedule, ties)
        if out is not None:
            return out
    return None


def divergence(graph: TaskGraph, tl: Timeline, p: int, m1: int, schedule: str = "1f1b", v: int = 1) -> float:
    """A time up to which the m1-micro-batch run is the run of any more micro-batches, event for event.

    Stage r's order with m1 micro-batches shares a prefix of ops with every longer one (up to the
    end of its steady part; a longer run issues another forward where this one cools down). A task of
    the first op past that prefix depends on that op's own tasks or, for a ZeRO-3 gather
    (`dlsim.plan.syncplan`), on the first task of the op before it; so nothing differs between the
    runs before the end of the first task of the last shared op, on every stage. The graph is built in
    the same order whatever the micro-batch count, so events up to then (port requests and memory
    changes included) are the same and happen in the same order."""
    limit = tl.makespan
    first_of: dict[tuple, int] = {}
    more = period_microbatches(schedule, p)
    for sid, st in enumerate(graph.streams):
        if st.kind != "compute":
            continue
        r = graph.devices[st.device].stage
        ops, longer = stage_ops(schedule, p, m1, v, r), stage_ops(schedule, p, m1 + more, v, r)
        n = next((i for i, (a, b) in enumerate(zip(ops, longer)) if a != b), len(ops))
        if n == 0:
            return 0.0
        last = ops[n - 1]
        key = (last.kind, last.chunk * p + r, last.microbatch)
        first_of.clear()
        for tid in graph.orders[sid]:
            op = _op_of(graph.tasks[tid].label)
            if op is not None:
                first_of.setdefault(op, tid)
        if key not in first_of:
            return 0.0
        limit = min(limit, tl.end[first_of[key]])
    return limit


def _op_of(label: tuple) -> tuple | None:
    """(F | B, chunk, micro-batch) of the op a compute-stream task belongs to (recomputation and
    compression of its buckets belong to a backward); None for the end-of-iteration tasks."""
    if len(label) < 3:
        return None
    if label[0] == "F":
        return ("F", label[1], label[2])
    if label[0] in ("R", "B", "C"):
        return ("B", label[1], label[2])
    return None


class _Periodic:
    """Micro-batch tasks indexed by (stream, label without its micro-batch, ordinal) and micro-batch: the
    ordinal of a task is how many tasks of its stream with its whole label (micro-batch included)
    came before it."""

    def __init__(self, graph: TaskGraph):
        self.keys: list[tuple | None] = [None] * len(graph.tasks)
        self.index: dict[tuple, dict[int, int]] = {}
        # the micro-batch of every micro-batch task (its label's kind in MB_LABELS), else None
        self.microbatch: list[int | None] = [None] * len(graph.tasks)
        keys, index, microbatch = self.keys, self.index, self.microbatch
        repeats: dict[tuple, int] = {}  # (stream, whole label) -> the next repeat's ordinal
        for t in graph.tasks:
            label = t.label
            if len(label) < 3 or label[0] not in MB_LABELS:
                continue
            tid = t.tid
            mb = microbatch[tid] = label[2]
            stream = t.stream if t.stream >= 0 else (-1, t.device)
            # the ordinal: how many tasks of this stream and label came before (the first: 0)
            key = (stream, label[0], label[1], label[3:], 0)
            twins = index.get(key)
            if twins is None:
                index[key] = {mb: tid}
            elif mb not in twins:
                twins[mb] = tid
            else:  # a repeat of a whole label (a pass's tasks on its stream): counted
                n = repeats.get((stream, label), 1)
                repeats[(stream, label)] = n + 1
                key = (stream, label[0], label[1], label[3:], n)
                twins = index.get(key)
                if twins is None:
                    index[key] = {mb: tid}
                else:
                    twins[mb] = tid
            keys[tid] = key


def extend(graph: TaskGraph, tl: Timeline, info: RunInfo, delta: int, p: int,
           limit: float = float("inf"), schedule: str = "1f1b", ties: Ties | None = None) -> SimResult | None:
    """Extend the simulated reduced iteration by `delta` periods (of `period_microbatches` each); None
    when it is not periodic before `limit` (the time up to which the reduced run is the full one,
    `divergence`) or, with the near-ties `ties` recorded (`dlsim.sim.ties`), where one lies at or after
    the checked window's start (the full run may break it the other way in a period it repeats)."""
    P = period_microbatches(schedule, p)
    tasks, start, end = graph.tasks, tl.start, tl.end
    per = _Periodic(graph)
    mb_of = per.microbatch
    # the period and the cut: forwards of the first stage's first device, mid-way through its steady part
    cs = next(sid for sid, st in enumerate(graph.streams) if st.kind == "compute")
    forwards = {}
    for tid in graph.orders[cs]:
        if tasks[tid].label[:1] == ("F",):
            forwards.setdefault(mb_of[tid], tid)
    s_arr, e_arr = np.asarray(start, dtype=float), np.asarray(end, dtype=float)
    order = np.argsort(s_arr, kind="stable")  # (stable: as sorted(range(n), key=start.__getitem__))
    by_start, starts = order.tolist(), s_arr[order].tolist()
    longest = float(np.max(e_arr - s_arr)) if len(tasks) else 0.0
    sorted_starts = (by_start, starts, longest)
    path: list[int] | None = None
    raced = _latest_race(graph, ties)
    for c in range(p, max(forwards) - P - 2):
        found = _period(tl, per, mb_of, forwards, c, sorted_starts, limit, P)
        if found is None:
            continue
        tau, lam, tol = found
        lo, hi = tau - lam, tau + 2 * lam
        if raced >= lo:
            continue
        makespan = tl.makespan + delta * lam
        if path is None:
            path = critical_path(graph, tl)

        def periodic_to(until: float) -> bool:
            return _periodic_between(tl, per, mb_of, sorted_starts, lo, until, lam, tol, limit, P)

        # a later cut where the critical path's periodic segment does not lie inside this window
        critical = _critical(graph, tl, path, per, mb_of, lo, hi, lam, delta, makespan, P, periodic_to, ties)
        if critical is not None:
            break
    else:
        return None
    records = _records(graph, tl, tau, lam, delta, makespan, tol)
    if records is None:
        return None
    # micro-batches c.. c+P-1: one period's tasks, counted 1 + delta times
    in_period = [mb is not None and c <= mb < c + P for mb in mb_of]
    weights = [1 + delta if inside else 1 for inside in in_period]
    period_tasks = in_period.count(True)
    total, measured = segment_totals(graph, weights)
    share = measured / total if total > 0 else 0.0
    note = (f"steady-state extension (dlsim.sim.steady): {len(tasks)} tasks of {max(forwards) + 1} micro-batches "
            f"simulated, the {schedule} period of {lam:.6g} s ({P} micro-batch{'es' if P > 1 else ''}) repeated "
            f"{delta} more times")
    return summarise(graph, tl, info, records, critical, share, len(tasks) + delta * period_tasks, makespan, (note,))


def _latest_race(graph: TaskGraph, ties: Ties | None) -> float:
    """The time of the last near-tie of a contended port's requests, a device's memory changes or the
    waits for one task (`dlsim.sim.ties`), −inf where there is none or nothing was recorded."""
    if ties is None:
        return float("-inf")
    times = [t for _, t in port_races(ties, 0.0)] + [t for _, t in memory_races(ties, 0.0)] + \
        [t for _, t in wait_races(graph, ties, 0.0)]
    return max(times, default=float("-inf"))


def _period(tl: Timeline, per: _Periodic, mb_of: list, forwards: dict[int, int], c: int,
            sorted_starts: tuple[list[int], list[float], float],
            limit: float = float("inf"), P: int = 1) -> tuple[float, float, float] | None:
    """(τ, λ, tolerance) with the cut at the first stage's forward of micro-batch c, when every task
    touching [τ − λ, τ + 2λ] is a micro-batch task whose counterpart P micro-batches later is exactly
    λ later and ends before `limit`."""
    start, end = tl.start, tl.end
    if c not in forwards or c + P not in forwards:
        return None
    tau = start[forwards[c]]
    lam = start[forwards[c + P]] - tau
    tol = TOLERANCE * max(1.0, tl.makespan)
    if not lam > tol:
        return None
    if not _periodic_between(tl, per, mb_of, sorted_starts, tau - lam, tau + 2 * lam, lam, tol, limit, P):
        return None
    return tau, lam, tol


def _periodic_between(tl: Timeline, per: _Periodic, mb_of: list, sorted_starts: tuple[list[int], list[float], float],
                      lo: float, hi: float, lam: float, tol: float, limit: float, P: int) -> bool:
    """Whether every task touching [lo, hi] is a micro-batch task whose counterpart P micro-batches
    later starts and ends exactly λ later (within `tol`), before `limit`."""
    if not hi < limit:
        return False
    start, end = tl.start, tl.end
    by_start, starts, longest = sorted_starts
    for tid in by_start[bisect_left(starts, lo - longest):bisect_right(starts, hi)]:
        if end[tid] < lo:
            continue
        if mb_of[tid] is None:
            return False
        nxt = per.index[per.keys[tid]].get(mb_of[tid] + P)
        if nxt is None or abs(start[nxt] - start[tid] - lam) > tol or abs(end[nxt] - end[tid] - lam) > tol:
            return False
        if not end[nxt] < limit:
            return False
    return True


def _records(graph: TaskGraph, tl: Timeline, tau: float, lam: float, delta: int, makespan: float,
             tol: float) -> list[DeviceRecord] | None:
    spans = comm_spans(graph, tl)
    full = device_times(graph, tl, True, spans)
    window = window_times(graph, tl, tau, tau + lam, spans)
    base = device_records(graph, tl, full)
    out = []
    for rec, w in zip(base, window):
        if abs(w["compute"] + w["recompute"] + w["comm"] + w["exposed"] + w["gap"] - lam) > tol:
            return None
        b = rec.breakdown
        bd = TimeBreakdown(compute=b.compute + delta * w["compute"], recompute=b.recompute + delta * w["recompute"],
                           exposed_comm=b.exposed_comm + delta * (w["comm"] + w["exposed"]),
                           bubble=b.bubble + delta * w["gap"], idle=b.idle)
        util = (bd.compute + bd.recompute) / makespan if makespan > 0 else 0.0
        out.append(replace(rec, breakdown=bd, communication_s=rec.communication_s + delta * w["communication"],
                           utilisation=util))
    return out


def _segment(path: list[int], per: _Periodic, mb_of: list, start: list[float], end: list[float], lo: float,
             hi: float, delta: int, P: int, periodic_to) -> tuple[int, int, int] | None:
    """(a, b, k): positions on the critical path of a task and of its counterpart k periods (k·P
    micro-batches) later, the path between them inside a periodic stretch, k dividing `delta`; None
    where there is none.

    First a segment of one period inside the checked window [lo, hi]. Else a longer stride: a path
    that zigzags across the stages (a 1F1B pipeline's forward of micro-batch i through every stage,
    its backward back, then the first stage's forward of micro-batch i + pp) returns to a counterpart
    of itself only k = pp periods later; repeated delta / k times it is the full run's path as long
    as every task touching [lo, the segment's end] is periodic (`periodic_to`), checked here."""
    where = {tid: n for n, tid in enumerate(path)}
    for n, tid in enumerate(path):
        if mb_of[tid] is None or not lo <= start[tid] <= hi:
            continue
        prev = per.index[per.keys[tid]].get(mb_of[tid] - P)
        if prev is not None and prev in where and where[prev] < n and start[prev] >= lo:
            return where[prev], n, 1
    for n, tid in enumerate(path):
        if mb_of[tid] is None or start[tid] < lo:
            continue
        twins = per.index[per.keys[tid]]
        k = 2
        while k <= delta:
            prev = twins.get(mb_of[tid] - k * P)
            if prev is None or start[prev] < lo:
                break
            if delta % k == 0 and prev in where and where[prev] < n:
                if not periodic_to(max(hi, max(end[t] for t in path[where[prev]:n + 1]))):
                    return None  # the path leaves the checked periodic stretch: none further along
                return where[prev], n, k
            k += 1
    return None


def _critical(graph: TaskGraph, tl: Timeline, path: list[int], per: _Periodic, mb_of: list, lo: float, hi: float,
              lam: float, delta: int, makespan: float, P: int, periodic_to,
              ties: Ties | None = None) -> dict[str, Any] | None:
    """The reduced run's critical path with its periodic segment (from a task to its counterpart k
    periods, k·P micro-batches, later: `_segment`) repeated delta / k more times; None where there is
    none or, with `ties`, where a step of the path from the segment on had two predecessors ending
    together (`dlsim.sim.ties.critical_path_ties`: the full run may step to the other one)."""
    start, end = tl.start, tl.end
    found = _segment(path, per, mb_of, start, end, lo, hi, delta, P, periodic_to)
    if found is None:
        return None
    a, b, k = found
    if ties is not None and critical_path_ties(graph, tl, ties, path, a):
        return None
    reps = delta // k

    def seconds(tid: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for category, sec in task_seconds(graph.tasks[tid], tl):
            out[category] = out.get(category, 0.0) + sec
        return out

    by_kind: dict[str, float] = {}
    waiting = 0.0
    previous_end = 0.0
    for tid in path:
        for category, sec in seconds(tid).items():
            by_kind[category] = by_kind.get(category, 0.0) + sec
        waiting += max(0.0, start[tid] - previous_end)
        previous_end = end[tid]
    previous_end = end[path[b - 1]] - k * lam
    for tid in path[a:b]:
        for category, sec in seconds(tid).items():
            by_kind[category] = by_kind.get(category, 0.0) + reps * sec
        waiting += reps * max(0.0, start[tid] - previous_end)
        previous_end = end[tid]
    length = len(path) + reps * (b - a)
    period = b - a

    def entry(q: int) -> tuple[int, int]:
        """(task of the reduced run, periods it is shifted by) of position q of the extended path."""
        if q < b:
            return path[q], 0
        if q >= b + reps * period:
            return path[q - reps * period], delta
        j, r = divmod(q - b, period)
        return path[a + r], (j + 1) * k

    last = []
    for q in range(max(0, length - CRITICAL_PATH_TASKS), length):
        tid, shift = entry(q)
        t = graph.tasks[tid]
        name = t.name
        if shift and mb_of[tid] is not None:
            old = f"mb{mb_of[tid]}"
            at = name.rfind(old)
            if at >= 0:
                name = name[:at] + f"mb{mb_of[tid] + shift * P}" + name[at + len(old):]
        last.append({"task": name, "device": graph.devices[t.device].name, "category": t.category,
                     "start_s": start[tid] + shift * lam, "end_s": end[tid] + shift * lam})
    return {"length_s": makespan, "tasks_on_path": length, "time_by_category_s": by_kind, "waiting_s": waiting,
            "last_tasks": last}
