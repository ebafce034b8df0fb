"""Chrome trace-event JSON of a simulated timeline (opens in Perfetto and chrome://tracing).

One process per simulated device with one thread per stream (compute, communication, and each
point-to-point channel it sends on), and a "links" process with one thread per link port.
Complete events ("ph": "X") carry microsecond timestamps; format: the Trace Event Format document
(Google, "Trace Event Format", the JSON Object Format with `traceEvents`).
"""

from __future__ import annotations

import math
from typing import AbstractSet, Any

from dlsim.plan.taskgraph import TaskGraph
from dlsim.sim.engine import Timeline
from dlsim.units import US


def chrome_trace(graph: TaskGraph, tl: Timeline, title: str = "", devices: AbstractSet[int] | None = None,
                 window: tuple[float, float] | None = None) -> dict[str, Any]:
    """The trace of `tl` as a JSON-serialisable dict: only `devices` (indices into graph.devices)
    and their streams and link ports when given, only spans overlapping `window` (seconds) when given."""
    events: list[dict[str, Any]] = []
    links_pid = len(graph.devices)
    keep = devices if devices is not None else range(len(graph.devices))
    lo, hi = window if window is not None else (-math.inf, math.inf)
    for i, dev in enumerate(graph.devices):
        if i not in keep:
            continue
        events.append({"ph": "M", "name": "process_name", "pid": i, "tid": 0, "args": {"name": dev.name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": i, "tid": 0, "args": {"sort_index": i}})
    events.append({"ph": "M", "name": "process_name", "pid": links_pid, "tid": 0, "args": {"name": "links"}})
    for sid, st in enumerate(graph.streams):
        if st.device not in keep:
            continue
        events.append({"ph": "M", "name": "thread_name", "pid": st.device, "tid": sid, "args": {"name": st.name}})
    for pid, port in enumerate(graph.ports):
        if port.device not in keep:
            continue
        events.append({"ph": "M", "name": "thread_name", "pid": links_pid, "tid": pid, "args": {"name": port.name}})
    for sid, order in enumerate(graph.orders):
        dev = graph.streams[sid].device
        if dev not in keep:
            continue
        for tid in order:
            t = graph.tasks[tid]
            if tl.start[tid] > hi or tl.end[tid] < lo:
                continue
            args: dict[str, Any] = {"task": tid, "label": list(t.label)}
            if t.measured:
                args["measured_share"] = t.measured
            if not t.parts:
                events.append({"ph": "X", "name": t.name, "cat": t.category, "pid": dev, "tid": sid,
                               "ts": tl.start[tid] / US, "dur": (tl.end[tid] - tl.start[tid]) / US, "args": args})
                continue
            at = tl.start[tid]
            ends = tl.stretched.get(tid)  # slowed by communication beside it: the parts as they ran
            for n, (category, seconds, _) in enumerate(t.parts):
                dur = ends[n] - at if ends is not None else seconds
                if at <= hi and at + dur >= lo:
                    events.append({"ph": "X", "name": f"{t.name} [{category} {n}]", "cat": category, "pid": dev,
                                   "tid": sid, "ts": at / US, "dur": dur / US, "args": args})
                at = ends[n] if ends is not None else at + seconds
    for pid, busy in enumerate(tl.port_busy):
        if graph.ports[pid].device not in keep:
            continue
        for a, b, tid in busy:
            if a > hi or b < lo:
                continue
            events.append({"ph": "X", "name": graph.tasks[tid].name, "cat": "link", "pid": links_pid, "tid": pid,
                           "ts": a / US, "dur": (b - a) / US, "args": {"task": tid}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "dlsim simulate", "title": title, "makespan_s": tl.makespan}}
