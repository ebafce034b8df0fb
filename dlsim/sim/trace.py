"""Chrome trace-event JSON of a simulated timeline (opens in Perfetto and chrome://tracing).

One process per simulated device (process ids from 1, in device order) with one thread per stream
(compute, communication, and each point-to-point channel it sends on), and a "links" process (the
last id) with one thread per link port. Complete events ("ph": "X") carry microsecond timestamps;
format: the Trace Event Format document (Google, "Trace Event Format", the JSON Object Format with
`traceEvents`, complete events, flow events).

Every slice is named for what it runs: the pass, the layers of a compute run (``F layer3..layer7
mb0``), a collective's operation, bytes and purpose (``B allreduce 24 MiB: f: input gradient of fc1
mb0``), a transfer's bytes and ranks; its ``args`` hold the same as data (``phase`` forward /
backward / recompute / ..., ``chunk``, ``microbatch``, ``layers``, ``op``, ``bytes``, ``group``,
``ranks``) and ``source``: where its time comes from (measured, interpolated, model, or the share
measured of a mixed run). Each point-to-point send has a flow arrow (``ph`` "s" / "f", category
``p2p``) from the send to the task on the receiving device that waits for it.
"""

from __future__ import annotations

import math
from typing import AbstractSet, Any

from dlsim.plan.taskgraph import Task, TaskGraph
from dlsim.sim.engine import Timeline
from dlsim.units import US, format_bytes

PHASES = {"F": "forward", "B": "backward", "R": "recompute", "SF": "forward send", "SB": "backward send",
          "H": "host copy", "O": "optimizer", "G": "gradient sync", "AG": "parameter gather", "E": "gradient sync",
          "C": "gradient compression", "D": "gradient compression"}
"""Task label tags (`dlsim.plan.iteration`, `dlsim.plan.syncplan`) and the phase each stands for."""


def _source(measured_share: float) -> str:
    if measured_share >= 0.9995:
        return "measured"
    if measured_share <= 0.0005:
        return "model"
    return f"mixed ({100 * measured_share:.1f}% measured)"


def _args(t: Task, info: dict | None, measured_share: float) -> dict[str, Any]:
    """A slice's args: the task, its phase, chunk and micro-batch, what it runs and its time's source."""
    label = t.label
    args: dict[str, Any] = {"task": t.tid}
    if label and isinstance(label[0], str):
        args["phase"] = PHASES.get(label[0], label[0])
        if label[0] in ("F", "B", "R", "SF", "SB") and len(label) >= 3:
            args["chunk"], args["microbatch"] = label[1], label[2]
    args.update({k: v for k, v in (info or {}).items() if k != "to_task"})
    args.setdefault("source", _source(measured_share))
    if "source" in (info or {}) and 0.0 < measured_share < 1.0:
        args["measured_share"] = round(measured_share, 4)
    return args


def _name(t: Task, info: dict | None, tag: str = "") -> str:
    """The slice's name (see the module docstring)."""
    info = info or {}
    phase = t.label[0] if t.label and isinstance(t.label[0], str) and t.label[0] in ("F", "B", "R") else ""
    mb = f" mb{t.label[2]}" if phase and len(t.label) >= 3 else ""
    op = info.get("op")
    if op == "send":
        return f"{t.name} {format_bytes(info['bytes'])} rank{info['from_rank']}->rank{info['to_rank']}"
    if op == "host copy":
        return f"{t.name} {format_bytes(info['bytes'])}"
    if op:
        why = info.get("why") or (t.name[len(phase):].strip().removesuffix(mb).strip() if phase else t.name)
        why = why[len(op):].strip() if why.startswith(op) else why
        head = f"{phase} " if phase else ""
        return f"{head}{op} {format_bytes(info.get('bytes', 0.0))}{': ' + why if why else ''}{mb}"
    if "layers" in info and phase:
        return f"{phase} {info['layers']}{mb}"
    return t.name + tag


def chrome_trace(graph: TaskGraph, tl: Timeline, title: str = "", devices: AbstractSet[int] | None = None,
                 window: tuple[float, float] | None = None) -> dict[str, Any]:
    """The trace of `tl` as a JSON-serialisable dict: only `devices` (indices into graph.devices)
    and their streams and link ports when given, only spans overlapping `window` (seconds) when given."""
    events: list[dict[str, Any]] = []
    links_pid = len(graph.devices) + 1
    keep = devices if devices is not None else range(len(graph.devices))
    lo, hi = window if window is not None else (-math.inf, math.inf)

    def pid(device: int) -> int:
        return device + 1

    for i, dev in enumerate(graph.devices):
        if i not in keep:
            continue
        events.append({"ph": "M", "name": "process_name", "pid": pid(i), "tid": 0, "args": {"name": dev.name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid(i), "tid": 0, "args": {"sort_index": pid(i)}})
    events.append({"ph": "M", "name": "process_name", "pid": links_pid, "tid": 0, "args": {"name": "links"}})
    for sid, st in enumerate(graph.streams):
        if st.device not in keep:
            continue
        events.append({"ph": "M", "name": "thread_name", "pid": pid(st.device), "tid": sid, "args": {"name": st.name}})
    for port_id, port in enumerate(graph.ports):
        if port.device not in keep:
            continue
        events.append({"ph": "M", "name": "thread_name", "pid": links_pid, "tid": port_id, "args": {"name": port.name}})
    flows: list[Task] = []
    for sid, order in enumerate(graph.orders):
        dev = graph.streams[sid].device
        if dev not in keep:
            continue
        for tid in order:
            t = graph.tasks[tid]
            if tl.start[tid] > hi or tl.end[tid] < lo:
                continue
            if t.info and "to_task" in t.info:
                flows.append(t)
            if not t.parts:
                events.append({"ph": "X", "name": _name(t, t.info), "cat": t.category, "pid": pid(dev), "tid": sid,
                               "ts": tl.start[tid] / US, "dur": (tl.end[tid] - tl.start[tid]) / US,
                               "args": _args(t, t.info, t.measured)})
                continue
            at = tl.start[tid]
            ends = tl.stretched.get(tid)  # slowed by communication beside it: the parts as they ran
            for n, (category, seconds, measured) in enumerate(t.parts):
                dur = ends[n] - at if ends is not None else seconds
                info = t.part_info[n] if n < len(t.part_info) else None
                if at <= hi and at + dur >= lo:
                    args = _args(t, info, measured / seconds if seconds > 0 else t.measured)
                    args["part"] = n
                    events.append({"ph": "X", "name": _name(t, info, f" [{category} {n}]"), "cat": category,
                                   "pid": pid(dev), "tid": sid, "ts": at / US, "dur": dur / US, "args": args})
                at = ends[n] if ends is not None else at + seconds
    for t in flows:  # send -> the task on the receiving device that waits for it
        dst = graph.tasks[t.info["to_task"]]
        if dst.device not in keep or dst.stream < 0:
            continue
        events.append({"ph": "s", "id": t.tid, "name": "p2p", "cat": "p2p", "pid": pid(t.device), "tid": t.stream,
                       "ts": tl.start[t.tid] / US})
        events.append({"ph": "f", "bp": "e", "id": t.tid, "name": "p2p", "cat": "p2p", "pid": pid(dst.device),
                       "tid": dst.stream, "ts": max(tl.start[dst.tid], tl.end[t.tid]) / US})
    for port_id, busy in enumerate(tl.port_busy):
        if graph.ports[port_id].device not in keep:
            continue
        for a, b, tid in busy:
            if a > hi or b < lo:
                continue
            t = graph.tasks[tid]
            held = [i for i in ([t.info] if t.info else list(t.part_info)) if i and "op" in i]
            name = _name(t, t.info) if t.info or not t.parts else f"{t.name}: link held for {len(held)} collective(s)"
            events.append({"ph": "X", "name": name, "cat": "link", "pid": links_pid, "tid": port_id, "ts": a / US,
                           "dur": (b - a) / US, "args": {"task": tid, "ops": [i["op"] for i in held],
                                                         "bytes": sum(i.get("bytes", 0.0) for i in held)}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "dlsim simulate", "title": title, "makespan_s": tl.makespan}}
