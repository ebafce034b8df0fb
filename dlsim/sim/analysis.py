"""Where the time went: per-device breakdowns, the critical path and provenance, from a timeline.

For each simulated device over [0, T] (T = the iteration's makespan) the compute stream is either
running compute, recompute or a blocking collective (exposed communication), or idle. An idle
moment while any communication involving the device is in flight (its communication stream, its
link ports) is exposed communication; other idle time is the pipeline bubble when there is more
than one stage, and idle otherwise (waiting for other replicas, stragglers). The five parts add up
to T for every device. Time a compute kernel lost to communication beside it (the overlap
slowdown, `dlsim.sim.engine`) is exposed communication: the kernel counts its nominal seconds as
compute, the rest of its run as communication it waited for.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlsim.plan.taskgraph import COMM, COMPUTE, RECOMPUTE, TaskGraph
from dlsim.results import TimeBreakdown
from dlsim.sim.engine import Timeline

STRETCH = "stretch"  # a slowed kernel's lost time inside `window_times` (exposed communication)


@dataclass(frozen=True)
class DeviceTime:
    """One device's breakdown, its total communication time (overlapped or not) and utilisation."""

    breakdown: TimeBreakdown
    communication: float
    utilisation: float


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _overlap(gap: tuple[float, float], union: list[tuple[float, float]], start: int) -> tuple[float, int]:
    """Length of `gap` covered by the sorted disjoint `union`, scanning from index `start`."""
    a, b = gap
    covered = 0.0
    i = start
    while i < len(union) and union[i][1] <= a:
        i += 1
    j = i
    while j < len(union) and union[j][0] < b:
        covered += min(b, union[j][1]) - max(a, union[j][0])
        j += 1
    return covered, i


def device_times(graph: TaskGraph, tl: Timeline, pipelined: bool) -> list[DeviceTime]:
    """Breakdown of every simulated device (see the module docstring)."""
    T = tl.makespan
    stretched = tl.stretched
    comm: list[list[tuple[float, float]]] = [[] for _ in graph.devices]
    for pid, busy in enumerate(tl.port_busy):
        dev = graph.ports[pid].device
        comm[dev].extend((a, b) for a, b, _ in busy)
    compute_stream: dict[int, int] = {}
    for sid, st in enumerate(graph.streams):
        if st.kind == "compute":
            compute_stream[st.device] = sid
        elif st.kind == "comm":
            comm[st.device].extend((tl.start[t], tl.end[t]) for t in graph.orders[sid])
    out = []
    for dev in range(len(graph.devices)):
        union = _union(comm[dev])
        parts = {COMPUTE: 0.0, RECOMPUTE: 0.0, COMM: 0.0}
        exposed = bubble = idle = 0.0
        cursor, scan = 0.0, 0
        order = graph.orders[compute_stream[dev]] if dev in compute_stream else []
        gaps = []
        for tid in order:
            s, e = tl.start[tid], tl.end[tid]
            if s > cursor:
                gaps.append((cursor, s))
            task = graph.tasks[tid]
            ends = stretched.get(tid) if stretched else None
            if ends is not None:  # slowed by communication beside it: the time lost is exposed communication
                at = s
                for n, (category, seconds, _) in enumerate(task.segments()):
                    parts[category] += seconds
                    if category == COMM:
                        union.append((at, ends[n]))
                    at = ends[n]
                parts[COMM] += (e - s) - task.duration
            elif task.parts:
                at = s
                for category, seconds, _ in task.parts:
                    parts[category] += seconds
                    if category == COMM:
                        union.append((at, at + seconds))
                    at += seconds
            else:
                parts[task.category] += e - s
                if task.category == COMM:
                    union.append((s, e))
            cursor = max(cursor, e)
        if T > cursor:
            gaps.append((cursor, T))
        union = _union(union)
        for gap in gaps:
            covered, scan = _overlap(gap, union, scan)
            exposed += covered
            rest = (gap[1] - gap[0]) - covered
            if pipelined:
                bubble += rest
            else:
                idle += rest
        communication = sum(b - a for a, b in union)
        bd = TimeBreakdown(compute=parts[COMPUTE], recompute=parts[RECOMPUTE], exposed_comm=parts[COMM] + exposed,
                           bubble=bubble, idle=idle)
        util = (parts[COMPUTE] + parts[RECOMPUTE]) / T if T > 0 else 0.0
        out.append(DeviceTime(bd, communication, util))
    return out


def critical_path(graph: TaskGraph, tl: Timeline) -> list[int]:
    """Task ids from the first to the last task of the chain that decided the makespan: from the
    last task to finish, repeatedly step to whichever predecessor (a dependency, the previous task
    on its stream, or a fellow member's of its collective) finished last."""
    if not graph.tasks:
        return []
    prev_on_stream: dict[int, int] = {}
    for order in graph.orders:
        for a, b in zip(order, order[1:]):
            prev_on_stream[b] = a
    end = tl.end
    cur = max(range(len(graph.tasks)), key=lambda t: (end[t], -t))
    path = [cur]
    while True:
        t = graph.tasks[cur]
        members = graph.groups[t.group].members if t.group >= 0 else [cur]
        cands = []
        for mtid in members:
            cands.extend(graph.tasks[mtid].deps)
            if mtid in prev_on_stream:
                cands.append(prev_on_stream[mtid])
        cands = [c for c in cands if c not in members]
        if not cands:
            break
        best = max(cands, key=lambda c: (end[c], -c))
        path.append(best)
        cur = best
    path.reverse()
    return path


def measured_share(graph: TaskGraph) -> float:
    """Share of all task-seconds priced from measured (or interpolated) tables."""
    total = measured = 0.0
    for t in graph.tasks:
        for _, seconds, from_table in t.segments():
            total += seconds
            measured += from_table
    return measured / total if total > 0 else 0.0


def _clip(a: float, b: float, lo: float, hi: float) -> tuple[float, float]:
    return max(a, lo), min(b, hi)


def window_times(graph: TaskGraph, tl: Timeline, lo: float, hi: float) -> list[dict[str, float]]:
    """What `device_times` counts, restricted to the time window [lo, hi) of every device: compute,
    recompute and blocking-communication time of its compute stream, its exposed communication and
    other idle time (`gap`), and the length of its communication union (`communication`). Used by the
    steady-state extension (`dlsim.sim.steady`) to price one period of a periodic pipeline."""
    comm: list[list[tuple[float, float]]] = [[] for _ in graph.devices]
    for pid, busy in enumerate(tl.port_busy):
        dev = graph.ports[pid].device
        comm[dev].extend(_clip(a, b, lo, hi) for a, b, _ in busy if b > lo and a < hi)
    compute_stream: dict[int, int] = {}
    for sid, st in enumerate(graph.streams):
        if st.kind == "compute":
            compute_stream[st.device] = sid
        elif st.kind == "comm":
            comm[st.device].extend(_clip(tl.start[t], tl.end[t], lo, hi) for t in graph.orders[sid]
                                   if tl.end[t] > lo and tl.start[t] < hi)
    out = []
    for dev in range(len(graph.devices)):
        parts = {COMPUTE: 0.0, RECOMPUTE: 0.0, COMM: 0.0}
        union = comm[dev]
        gaps = []
        cursor = lo
        for tid in graph.orders[compute_stream[dev]] if dev in compute_stream else []:
            s, e = tl.start[tid], tl.end[tid]
            if e <= lo and s < lo:
                continue
            if s >= hi:
                break
            if s > cursor:
                gaps.append((cursor, min(s, hi)))
            task = graph.tasks[tid]
            for category, a, b in _segments(task, s, e, tl.stretched.get(tid)):
                a, b = _clip(a, b, lo, hi)
                if b > a:
                    if category == STRETCH:
                        parts[COMM] += b - a
                        continue
                    parts[category] += b - a
                    if category == COMM:
                        union.append((a, b))
            cursor = max(cursor, min(e, hi))
        if hi > cursor:
            gaps.append((cursor, hi))
        union = _union(union)
        exposed = gap = 0.0
        scan = 0
        for g in gaps:
            covered, scan = _overlap(g, union, scan)
            exposed += covered
            gap += (g[1] - g[0]) - covered
        out.append({"compute": parts[COMPUTE], "recompute": parts[RECOMPUTE], "comm": parts[COMM],
                    "exposed": exposed, "gap": gap, "communication": sum(b - a for a, b in union)})
    return out


def _segments(task, s: float, e: float, ends: tuple[float, ...] | None = None):
    """(category, start, end) of a task's pieces; a slowed task's piece is its nominal seconds
    followed by the time it lost (`STRETCH`, counted as exposed communication)."""
    if ends is not None:
        at = s
        for n, (category, seconds, _) in enumerate(task.segments()):
            if ends[n] - at > seconds:
                yield category, at, at + seconds
                yield STRETCH, at + seconds, ends[n]
            else:
                yield category, at, ends[n]
            at = ends[n]
        return
    if not task.parts:
        yield task.category, s, e
        return
    at = s
    for category, seconds, _ in task.parts:
        yield category, at, at + seconds
        at += seconds


def task_seconds(task, tl: Timeline) -> list[tuple[str, float]]:
    """(category, seconds) of a task's run: its parts' nominal seconds (or its whole run), and for a
    task slowed by communication beside it the time lost, as communication."""
    tid = task.tid
    ends = tl.stretched.get(tid)
    if ends is not None:
        out = [(category, seconds) for category, seconds, _ in task.segments()]
        out.append((COMM, (tl.end[tid] - tl.start[tid]) - task.duration))
        return out
    if task.parts:
        return [(category, seconds) for category, seconds, _ in task.parts]
    return [(task.category, tl.end[tid] - tl.start[tid])]
