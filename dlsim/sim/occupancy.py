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
  parts of the fused tasks sharing one parts tuple computed together with numpy: its additions are
  IEEE double additions as Python's, in the same order, so every interval is the same float.

tests/test_sim_occupancy.py holds the two equal (the union per device) on graphs with fused, slowed,
transfer and collective tasks.
"""

from __future__ import annotations

import numpy as np

from dlsim.plan.taskgraph import COMM, TaskGraph

Span = tuple[float, float, int]


class PortLog:
    """What held ports during a run, in the order it ended: a task id (`Task.ports` held as the module
    docstring says) or (port, (start, end, task)) given by a collective group or message."""

    __slots__ = ("graph", "entries")

    def __init__(self, graph: TaskGraph):
        self.graph = graph
        self.entries: list[int | tuple[int, Span]] = []

    def busy(self, start: list[float], end: list[float],
             stretched: dict[int, tuple[float, ...]]) -> list[list[Span]]:
        """Per port: the intervals it was held, (start, end, task), in the order the holders ended."""
        tasks = self.graph.tasks
        out: list[list[Span]] = [[] for _ in self.graph.ports]
        for entry in self.entries:
            if isinstance(entry, tuple):
                out[entry[0]].append(entry[1])
                continue
            t = tasks[entry]
            for span in task_spans(t, start[entry], end[entry], stretched.get(entry)):
                for p in t.ports:
                    out[p].append(span)
        return out

    def device_spans(self, start: list[float], end: list[float], stretched: dict[int, tuple[float, ...]],
                     devices: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per device (a port's device modulo `devices`, as a Python index): the starts and ends of the
        intervals its ports were held, as arrays, an interval held on two ports of one device once."""
        tasks, ports = self.graph.tasks, self.graph.ports
        nd = max(1, devices)
        owners: dict[tuple[int, ...], tuple[int, ...]] = {}  # a ports tuple's distinct devices
        plain_t: list[int] = []  # (task, device) rows of tasks held whole
        plain_d: list[int] = []
        fused: dict[int, tuple[tuple, list[int], list[int]]] = {}  # by id(parts): (parts, tasks, devices)
        loose: list[tuple[float, float, int]] = []  # (start, end, device) computed one by one
        for entry in self.entries:
            if isinstance(entry, tuple):
                a, b, _ = entry[1]
                loose.append((a, b, ports[entry[0]].device % nd))
                continue
            t = tasks[entry]
            devs = owners.get(t.ports)
            if devs is None:
                devs = owners[t.ports] = tuple(sorted({ports[p].device % nd for p in t.ports}))
            if not t.parts:
                for d in devs:
                    plain_t.append(entry)
                    plain_d.append(d)
            elif entry in stretched:
                for a, b, _ in task_spans(t, start[entry], end[entry], stretched[entry]):
                    loose.extend((a, b, d) for d in devs)
            else:
                group = fused.get(id(t.parts))
                if group is None:
                    group = fused[id(t.parts)] = (t.parts, [], [])
                for d in devs:
                    group[1].append(entry)
                    group[2].append(d)
        starts_all = np.asarray(start, dtype=float)
        a_parts = [starts_all[plain_t]]
        b_parts = [np.asarray(end, dtype=float)[plain_t]]
        d_parts = [np.asarray(plain_d, dtype=np.int64)]
        for parts, tids, devs in fused.values():
            at = starts_all[tids]
            owner = np.asarray(devs, dtype=np.int64)
            for category, seconds, _ in parts:
                if category == COMM and seconds > 0:
                    a_parts.append(at)
                    b_parts.append(at + seconds)
                    d_parts.append(owner)
                at = at + seconds
        if loose:
            a, b, d = zip(*loose)
            a_parts.append(np.asarray(a, dtype=float))
            b_parts.append(np.asarray(b, dtype=float))
            d_parts.append(np.asarray(d, dtype=np.int64))
        a, b, d = np.concatenate(a_parts), np.concatenate(b_parts), np.concatenate(d_parts)
        order = np.argsort(d, kind="stable")
        cuts = np.searchsorted(d[order], np.arange(devices + 1))
        a, b = a[order], b[order]
        return [(a[cuts[dev]:cuts[dev + 1]], b[cuts[dev]:cuts[dev + 1]]) for dev in range(devices)]


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

