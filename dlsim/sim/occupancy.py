"""Port occupancy of a run: which intervals each link port was held, derived after the run.

A task holding ports (`Task.ports`, outside a collective group) holds them for its whole run, or, as
a fused task, for its communication parts only: part n runs from `at` to `at + seconds` where `at`
is the task's start plus the seconds of the parts before it, added one by one (the parts run back to
back), or, for a task slowed by communication beside it (`Timeline.stretched`), from the actual end
of the part before it. A collective group or an expanded collective's message holds its ports for
the spans the engine gives it. The engine only logs, in the order they end, the tasks that held
ports and the spans of groups and messages (`PortLog`); the intervals are computed from the start
and end times afterwards, when something asks for them:

* `PortLog.busy`: per port, the (start, end, task) intervals in the order the holders ended (what
  the engine would have appended as they ended: `Timeline.port_busy`, the trace's link rows);
* `PortLog.device_spans`: per device, the starts and ends of all intervals of its ports as arrays,
  in no particular order (the breakdowns take their union: `dlsim.sim.analysis.comm_spans`), the
  parts of the fused tasks sharing one parts tuple (at least FEW of them) computed together with
  numpy: its additions are IEEE double additions as Python's, in the same order, so every interval
  is the same float.

tests/test_sim_occupancy.py holds the two equal (the union per device) on graphs with fused, slowed,
transfer and collective tasks.
"""

from __future__ import annotations

import numpy as np

from dlsim.plan.taskgraph import COMM, TaskGraph

Span = tuple[float, float, int]
FEW = 16  # fused tasks alike up to which their intervals are computed one by one (numpy's calls cost more)
FEW_HOLDERS = 256  # holders up to which `PortLog.device_spans` lists their intervals one by one, in lists


class PortLog:
    """What held ports during a run, in the order it ended: the ids of the tasks that held their
    `Task.ports` as the module docstring says (`tasks`), and the (start, end, task) spans a collective
    group or message held a port for (`spans`: (how many tasks ended before it, port, span))."""

    __slots__ = ("graph", "spans", "tasks")

    def __init__(self, graph: TaskGraph):
        self.graph = graph
        self.tasks: list[int] = []
        self.spans: list[tuple[int, int, Span]] = []

    def span(self, port: int, span: Span) -> None:
        """A collective group or message held `port` for `span`."""
        self.spans.append((len(self.tasks), port, span))

    def busy(self, start: list[float], end: list[float],
             stretched: dict[int, tuple[float, ...]]) -> list[list[Span]]:
        """Per port: the intervals it was held, (start, end, task), in the order the holders ended."""
        tasks = self.graph.tasks
        out: list[list[Span]] = [[] for _ in self.graph.ports]
        spans = iter(self.spans + [(len(self.tasks) + 1, -1, (0.0, 0.0, -1))])
        before, port, span = next(spans)
        for n, tid in enumerate(self.tasks + [-1]):
            while before == n:
                out[port].append(span)
                before, port, span = next(spans)
            if tid < 0:
                break
            t = tasks[tid]
            for held in task_spans(t, start[tid], end[tid], stretched.get(tid)):
                for p in t.ports:
                    out[p].append(held)
        return out

    def device_spans(self, start: list[float], end: list[float], stretched: dict[int, tuple[float, ...]],
                     devices: int) -> list[tuple[np.ndarray | list[float], np.ndarray | list[float]]]:
        """Per device (a port's device modulo `devices`, as a Python index): the starts and ends of the
        intervals its ports were held, as arrays, an interval held on two ports of one device once.
        The holders are taken by (ports, parts) alike: one array operation per part of each; up to
        FEW_HOLDERS holders, one by one, as lists (`_device_spans_listed`)."""
        tasks, ports = self.graph.tasks, self.graph.ports
        nd = max(1, devices)
        if len(self.tasks) <= FEW_HOLDERS:
            return self._device_spans_listed(start, end, stretched, nd, devices)
        alike: dict[tuple, list[int]] = {}  # (ports, id(parts)) -> tasks held so
        for tid in self.tasks:
            t = tasks[tid]
            key = (t.ports, id(t.parts))
            same = alike.get(key)
            if same is None:
                alike[key] = [tid]
            else:
                same.append(tid)
        starts_all, ends_all = np.asarray(start, dtype=float), np.asarray(end, dtype=float)
        a_parts: list[np.ndarray] = []
        b_parts: list[np.ndarray] = []
        owners: list[int] = []  # the device of each array in a_parts, b_parts
        loose: list[tuple[float, float, int]] = [(span[0], span[1], ports[p].device % nd) for _, p, span in self.spans]
        for (held, _), tids in alike.items():
            devs = tuple(sorted({ports[p].device % nd for p in held}))
            parts = tasks[tids[0]].parts
            if parts:  # one by one: the slowed tasks, or all where only a few are alike
                alone = [x for x in tids if x in stretched] if stretched else []
                if len(tids) - len(alone) < FEW:
                    alone = tids
                for tid in alone:
                    for a, b, _ in task_spans(tasks[tid], start[tid], end[tid], stretched.get(tid)):
                        loose.extend((a, b, d) for d in devs)
                if alone is tids:
                    continue
                if alone:
                    tids = [x for x in tids if x not in stretched]
            at = starts_all[tids]
            spans = [(at, ends_all[tids])] if not parts else []
            for category, seconds, _ in parts:
                if category == COMM and seconds > 0:
                    spans.append((at, at + seconds))
                at = at + seconds
            for d in devs:
                for a, b in spans:
                    a_parts.append(a)
                    b_parts.append(b)
                    owners.append(d)
        if loose:  # last, their devices row by row
            a, b, d = zip(*loose)
            a_parts.append(np.asarray(a, dtype=float))
            b_parts.append(np.asarray(b, dtype=float))
            owners.append(-1)
            loose_devices = np.asarray(d, dtype=np.int64)
        if not a_parts:
            empty = np.zeros(0)
            return [(empty, empty) for _ in range(devices)]
        lengths = [len(x) for x in a_parts]
        d = np.repeat(np.asarray(owners, dtype=np.int64), lengths)
        if loose:
            d[len(d) - len(loose_devices):] = loose_devices
        a, b = np.concatenate(a_parts), np.concatenate(b_parts)
        order = np.argsort(d, kind="stable")
        cuts = np.searchsorted(d[order], np.arange(devices + 1))
        a, b = a[order], b[order]
        return [(a[cuts[dev]:cuts[dev + 1]], b[cuts[dev]:cuts[dev + 1]]) for dev in range(devices)]

    def _device_spans_listed(self, start: list[float], end: list[float], stretched: dict[int, tuple[float, ...]],
                             nd: int, devices: int) -> list[tuple[list[float], list[float]]]:
        """`device_spans` task by task (`task_spans`): the same intervals, as lists (for a few holders,
        numpy's calls cost more than they save)."""
        tasks, ports = self.graph.tasks, self.graph.ports
        out: list[tuple[list[float], list[float]]] = [([], []) for _ in range(devices)]
        for _, p, span in self.spans:
            a, b = out[ports[p].device % nd]
            a.append(span[0])
            b.append(span[1])
        owners: dict[tuple[int, ...], tuple[int, ...]] = {}  # by a task's ports: their devices
        for tid in self.tasks:
            t = tasks[tid]
            devs = owners.get(t.ports)
            if devs is None:
                devs = owners[t.ports] = tuple(sorted({ports[p].device % nd for p in t.ports}))
            if t.parts:
                held = task_spans(t, start[tid], end[tid], stretched.get(tid))
            else:
                held = ((start[tid], end[tid], tid),)
            for d in devs:
                a, b = out[d]
                for span in held:
                    a.append(span[0])
                    b.append(span[1])
        return out


def task_spans(t, start: float, end: float, ends: tuple[float, ...] | None) -> list[Span]:
    """The intervals a task that ran from `start` to `end` held its ports (`ends`: the actual end of
    each part of a slowed task, None where it was not slowed): see the module docstring."""
    if not t.parts:
        return [(start, end, t.tid)]
    out = []
    if ends is not None:  # slowed: the communication parts where they actually ran
        for n, (category, seconds, _) in enumerate(t.parts):
            if category == COMM and seconds > 0:
                at = ends[n - 1] if n else start
                out.append((at, at + seconds, t.tid))
        return out
    at = start  # accumulated part by part from the start, as the parts run back to back
    for category, seconds, _ in t.parts:
        if category == COMM and seconds > 0:
            out.append((at, at + seconds, t.tid))
        at += seconds
    return out

