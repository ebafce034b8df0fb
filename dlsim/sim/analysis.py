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
from functools import reduce
from operator import add

import numpy as np

from dlsim.plan.taskgraph import COMM, COMPUTE, RECOMPUTE, TaskGraph
from dlsim.results import TimeBreakdown
from dlsim.sim.engine import Timeline

STRETCH = "stretch"  # a slowed kernel's lost time inside `window_times` (exposed communication)
SMALL = 64  # a device's communication intervals up to which plain Python merges them (numpy's calls cost more)


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


def _union_arrays(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_union` of the intervals [a[i], b[i]) given as arrays: the starts and ends of the disjoint
    merged intervals, in order. No arithmetic: every bound is one of the given ones, so the union is
    `_union`'s, bit for bit (an interval starts a new one where it starts after the largest end of all
    before it in start order; ties in that order change nothing)."""
    keep = b > a
    if not keep.all():
        a, b = a[keep], b[keep]
    if not len(a):
        return a, b
    order = np.argsort(a, kind="stable")
    a, b = a[order], b[order]
    reach = np.maximum.accumulate(b)
    first = np.flatnonzero(np.concatenate(([True], a[1:] > reach[:-1])))
    last = np.concatenate((first[1:] - 1, [len(a) - 1]))
    return a[first], reach[last]


def _covered(gaps: list[tuple[float, float]], us, ue) -> tuple[list[float], list[float]]:
    """Per gap (sorted, disjoint): the length the sorted disjoint union (`us`, `ue`: arrays, or lists
    for a few) covers and the rest, each covered length summed over its union intervals in order
    from 0.0 (one scan; with arrays, the step-th interval of every gap at once)."""
    if not gaps:
        return [], []
    if isinstance(us, list):
        covered, rest = [], []
        i, n = 0, len(us)
        for a, b in gaps:
            while i < n and ue[i] <= a:
                i += 1
            c, j = 0.0, i
            while j < n and us[j] < b:
                c += min(b, ue[j]) - max(a, us[j])
                j += 1
            covered.append(c)
            rest.append((b - a) - c)
        return covered, rest
    ga, gb = (np.array(v, dtype=float) for v in zip(*gaps))
    i = np.searchsorted(ue, ga, side="right")  # the first union interval ending after the gap starts
    j = np.maximum(i, np.searchsorted(us, gb, side="left"))  # past the last one starting before it ends
    covered = np.zeros(len(ga))
    active = np.flatnonzero(j > i)
    step = 0
    while len(active):  # the step-th union interval of every gap that has one, added in order
        k = i[active] + step
        covered[active] += np.minimum(gb[active], ue[k]) - np.maximum(ga[active], us[k])
        step += 1
        active = active[j[active] > i[active] + step]
    return covered.tolist(), ((gb - ga) - covered).tolist()


def comm_spans(graph: TaskGraph, tl: Timeline) -> list[tuple[list, list]]:
    """Per device: the (starts, ends) of every interval its ports were busy (one array each,
    `dlsim.sim.occupancy.PortLog.device_spans`) and of every task of its communication streams (one
    list each), as lists; `device_times` and `window_times` take them (computed once for both) and
    use only their union."""
    starts: list[list] = [[] for _ in graph.devices]
    ends: list[list] = [[] for _ in graph.devices]
    for dev, (a, b) in enumerate(tl.port_log.device_spans(tl.start, tl.end, tl.stretched, len(graph.devices))):
        if len(a):
            starts[dev].append(a)
            ends[dev].append(b)
    for sid, st in enumerate(graph.streams):
        order = graph.orders[sid]
        if st.kind == "comm" and order:
            starts[st.device].append([tl.start[t] for t in order])
            ends[st.device].append([tl.end[t] for t in order])
    return list(zip(starts, ends))


def _clipped(starts: list, ends: list, lo: float, hi: float) -> tuple[list, list]:
    if not starts:
        return [], []
    a, b = np.concatenate(starts), np.concatenate(ends)
    inside = (b > lo) & (a < hi)
    return [np.maximum(a[inside], lo)], [np.minimum(b[inside], hi)]


def _device_union(starts: list, ends: list, extra: list[tuple[float, float]]) -> tuple:
    """The union of a device's communication intervals (`comm_spans`) and `extra` ones: (starts,
    ends) as arrays, or as lists where there are at most SMALL intervals (`_union`)."""
    if sum(len(a) for a in starts) + len(extra) <= SMALL:
        pairs = list(extra)
        for a, b in zip(starts, ends):
            pairs.extend(zip(_floats(a), _floats(b)))
        union = _union(pairs)
        return [a for a, _ in union], [b for _, b in union]
    if extra:
        xa, xb = zip(*extra)
        starts, ends = starts + [xa], ends + [xb]
    return _union_arrays(np.concatenate(starts).astype(float, copy=False),
                         np.concatenate(ends).astype(float, copy=False))


def _floats(values) -> list:
    return values.tolist() if isinstance(values, np.ndarray) else values


def _length(us, ue) -> float:
    """Σ (end − start) of a union, added left to right."""
    return sum((ue - us).tolist()) if isinstance(us, np.ndarray) else sum([b - a for a, b in zip(us, ue)])


def _category_seconds(parts) -> tuple[tuple[int, tuple[float, ...]], ...]:
    """The seconds of a fused task's parts by category (its index in `_CATEGORIES`), each in the
    parts' order."""
    out: dict[str, list[float]] = {}
    for category, seconds, _ in parts:
        out.setdefault(category, []).append(seconds)
    return tuple((_CATEGORIES.index(c), tuple(v)) for c, v in out.items())


_CATEGORIES = (COMPUTE, RECOMPUTE, COMM)  # a device's sums of task seconds by category (`device_times`)


def _total(values: list[float]) -> float:
    """0.0 + values[0] + values[1] + ..., added left to right (as `x += v` one by one would)."""
    return reduce(add, values, 0.0)


def device_times(graph: TaskGraph, tl: Timeline, pipelined: bool,
                 spans: list[tuple[list, list]] | None = None) -> list[DeviceTime]:
    """Breakdown of every simulated device (see the module docstring).

    Per category the seconds are added in the compute stream's order, as one running sum (`_total`);
    a fused task's communication parts count in the device's communication union once: where it
    holds a port of its device, they are among its ports' intervals (`comm_spans`), else added here."""
    T = tl.makespan
    stretched = tl.stretched
    comm = comm_spans(graph, tl) if spans is None else spans
    port_device = [port.device for port in graph.ports]
    compute_stream: dict[int, int] = {}
    for sid, st in enumerate(graph.streams):
        if st.kind == "compute":
            compute_stream[st.device] = sid
    tasks, start_of, end_of = graph.tasks, tl.start, tl.end
    # by id(parts): its seconds by category (`_category_seconds`), whether it has communication parts
    by_parts: dict[int, tuple[tuple[tuple[int, tuple[float, ...]], ...], bool]] = {}
    out = []
    for dev in range(len(graph.devices)):
        seconds_of: dict[str, list[float]] = {COMPUTE: [], RECOMPUTE: [], COMM: []}
        lists = tuple(seconds_of[c] for c in _CATEGORIES)
        bubble = idle = 0.0
        cursor = 0.0
        order = graph.orders[compute_stream[dev]] if dev in compute_stream else []
        gaps = []
        extra: list[tuple[float, float]] = []
        holds: dict[tuple[int, ...], bool] = {}  # whether a ports tuple holds a port of this device
        for tid in order:
            s, e = start_of[tid], end_of[tid]
            if s > cursor:
                gaps.append((cursor, s))
            task = tasks[tid]
            ends = stretched.get(tid) if stretched else None
            if ends is not None:  # slowed by communication beside it: the time lost is exposed communication
                at = s
                for n, (category, seconds, _) in enumerate(task.segments()):
                    seconds_of[category].append(seconds)
                    if category == COMM:
                        extra.append((at, ends[n]))
                    at = ends[n]
                seconds_of[COMM].append((e - s) - task.duration)
            elif task.parts:
                split = by_parts.get(id(task.parts))
                if split is None:
                    split = by_parts[id(task.parts)] = (_category_seconds(task.parts),
                                                         any(category == COMM for category, _, _ in task.parts))
                for n, values in split[0]:
                    lists[n].extend(values)
                if split[1]:
                    held = holds.get(task.ports)
                    if held is None:
                        held = holds[task.ports] = any(port_device[p] == dev for p in task.ports)
                    if not held:
                        at = s
                        for category, seconds, _ in task.parts:
                            if category == COMM:
                                extra.append((at, at + seconds))
                            at += seconds
            else:
                seconds_of[task.category].append(e - s)
                if task.category == COMM:
                    extra.append((s, e))
            if e > cursor:
                cursor = e
        if T > cursor:
            gaps.append((cursor, T))
        us, ue = _device_union(*comm[dev], extra)
        covered, rest = _covered(gaps, us, ue)
        exposed = _total(covered)
        if pipelined:
            bubble = _total(rest)
        else:
            idle = _total(rest)
        communication = _length(us, ue)
        parts = {category: _total(values) for category, values in seconds_of.items()}
        bd = TimeBreakdown(compute=parts[COMPUTE], recompute=parts[RECOMPUTE], exposed_comm=parts[COMM] + exposed,
                           bubble=bubble, idle=idle)
        util = (parts[COMPUTE] + parts[RECOMPUTE]) / T if T > 0 else 0.0
        out.append(DeviceTime(bd, communication, util))
    return out


def critical_path(graph: TaskGraph, tl: Timeline) -> list[int]:
    """Task ids from the first to the last task of the chain that decided the makespan: from the
    last task to finish, repeatedly step to whichever predecessor (`path_candidates`) finished last
    (of equal ends, the smallest id)."""
    tasks = graph.tasks
    if not tasks:
        return []
    prev_on_stream = [-1] * len(tasks)
    for order in graph.orders:
        for a, b in zip(order, order[1:]):
            prev_on_stream[b] = a
    end = tl.end
    cur = end.index(max(end))  # the last to finish, the smallest id of equal ends
    path = [cur]
    while True:
        t = tasks[cur]
        if t.group < 0:  # (`path_candidates` of a task alone: its dependencies and its stream's previous task)
            best = prev_on_stream[cur]
            best_end = end[best] if best >= 0 else 0.0
            candidates = t.deps
        else:
            best, best_end = -1, 0.0
            candidates = path_candidates(graph, prev_on_stream, cur)
        for c in candidates:  # the latest end, the smallest id of equal ends (in any order)
            if best < 0 or end[c] > best_end or (end[c] == best_end and c < best):
                best, best_end = c, end[c]
        if best < 0:
            break
        path.append(best)
        cur = best
    path.reverse()
    return path


def path_candidates(graph: TaskGraph, prev_on_stream: list[int], tid: int) -> list[int]:
    """The predecessors the critical path may step to from `tid`: the dependencies and the previous
    task on its stream of the task and, for a collective's member, of every member (members
    themselves excluded), in that order."""
    tasks = graph.tasks
    t = tasks[tid]
    members = graph.groups[t.group].members if t.group >= 0 else (tid,)
    out = []
    for mtid in members:
        out.extend(c for c in tasks[mtid].deps if c not in members)
        c = prev_on_stream[mtid]
        if c >= 0 and c not in members:
            out.append(c)
    return out


def measured_share(graph: TaskGraph) -> float:
    """Share of all task-seconds priced from measured (or interpolated) tables."""
    total, measured = segment_totals(graph)
    return measured / total if total > 0 else 0.0


def segment_totals(graph: TaskGraph, weights: list[int] | None = None) -> tuple[float, float]:
    """(Σ seconds·w, Σ measured seconds·w) over the segments (`Task.segments`) of every task, w its
    weight (1 without `weights`), each sum added left to right in task and segment order (a pass's
    parts, one tuple shared by its tasks, split once)."""
    seconds_all: list[float] = []
    measured_all: list[float] = []
    split: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = {}
    add_seconds, add_measured = seconds_all.append, measured_all.append
    for t in graph.tasks:
        w = 1 if weights is None else weights[t.tid]
        if not t.parts:  # one segment: (duration, duration · measured share)
            if w == 1:
                add_seconds(t.duration)
                add_measured(t.duration * t.measured)
            else:
                add_seconds(t.duration * w)
                add_measured(t.duration * t.measured * w)
            continue
        pair = split.get(id(t.parts))
        if pair is None:
            pair = split[id(t.parts)] = (tuple(p[1] for p in t.parts), tuple(p[2] for p in t.parts))
        seconds, measured = pair
        if w == 1:
            seconds_all.extend(seconds)
            measured_all.extend(measured)
        else:
            seconds_all.extend([x * w for x in seconds])
            measured_all.extend([x * w for x in measured])
    return _total(seconds_all), _total(measured_all)


def _clip(a: float, b: float, lo: float, hi: float) -> tuple[float, float]:
    return max(a, lo), min(b, hi)


def window_times(graph: TaskGraph, tl: Timeline, lo: float, hi: float,
                 spans: list[tuple[list, list]] | None = None) -> list[dict[str, float]]:
    """What `device_times` counts, restricted to the time window [lo, hi) of every device: compute,
    recompute and blocking-communication time of its compute stream, its exposed communication and
    other idle time (`gap`), and the length of its communication union (`communication`). Used by the
    steady-state extension (`dlsim.sim.steady`) to price one period of a periodic pipeline."""
    comm = [_clipped(a, b, lo, hi) for a, b in (comm_spans(graph, tl) if spans is None else spans)]
    compute_stream: dict[int, int] = {}
    for sid, st in enumerate(graph.streams):
        if st.kind == "compute":
            compute_stream[st.device] = sid
    out = []
    for dev in range(len(graph.devices)):
        parts = {COMPUTE: 0.0, RECOMPUTE: 0.0, COMM: 0.0}
        extra: list[tuple[float, float]] = []
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
                        extra.append((a, b))
            cursor = max(cursor, min(e, hi))
        if hi > cursor:
            gaps.append((cursor, hi))
        us, ue = _device_union(*comm[dev], extra)
        covered, rest = _covered(gaps, us, ue)
        out.append({"compute": parts[COMPUTE], "recompute": parts[RECOMPUTE], "comm": parts[COMM],
                    "exposed": _total(covered), "gap": _total(rest), "communication": _length(us, ue)})
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
