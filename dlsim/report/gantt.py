"""The timeline of one simulated iteration as a Gantt chart (matplotlib Agg), from its Chrome trace.

Input: the trace-event dict `dlsim simulate --trace` writes (`dlsim.sim.trace.chrome_trace`): one
process per simulated device with a thread per stream (compute, communication, point-to-point
channels), and a ``links`` process with a thread per link port (named after its device). Rows: the
first `devices` simulated devices, each with its streams and then its link ports. Colours: forward,
backward, recomputation and other compute (the optimizer step), communication (collectives and
transfers on the streams), link busy, and on each compute stream the time it waits: exposed
communication where any communication of that device is in flight, otherwise pipeline bubble
(pipelined runs) or idle — the same rule as the record's breakdown (`dlsim.sim.analysis`). A bar
narrower than `MIN_WIDTH` of the time axis (a pipeline send of microseconds in an iteration of
seconds) is drawn `MIN_WIDTH` wide, so that every span is seen.
"""

from __future__ import annotations

from typing import Any, Mapping

from dlsim.report.comm_plots import _pyplot

COLORS = {"forward": "#4c72b0", "backward": "#55a868", "recompute": "#8172b2", "compute": "#937860",
          "comm": "#dd8452", "link": "#64b5cd", "exposed": "#f3c6a5", "bubble": "#c9b38a", "idle": "#dddddd"}
LABELS = {"forward": "forward", "backward": "backward", "recompute": "recomputation",
          "compute": "other compute (optimizer step, ...)", "comm": "communication (stream)",
          "link": "link port busy", "exposed": "compute stream waiting on communication",
          "bubble": "pipeline bubble", "idle": "idle"}
DRAWN = ("forward", "backward", "recompute", "compute", "comm", "link")
"""The kinds that are work (drawn at least `MIN_WIDTH` wide); the others are the gaps between them."""
DEFAULT_DEVICES = 8
MIN_WIDTH = 0.002
"""The narrowest bar, as a share of the time axis (about 3 pixels of the 14-inch figure at 120 dpi)."""


def _kind(event: Mapping[str, Any]) -> str:
    """What a trace slice counts as in the chart: its pass for compute (forward, backward), else its category."""
    cat = event.get("cat", "compute")
    if cat == "compute":
        phase = (event.get("args") or {}).get("phase")
        return phase if phase in ("forward", "backward") else "compute"
    return cat if cat in COLORS else "comm"


def visible(spans: list[tuple[float, float]], makespan: float) -> list[tuple[float, float]]:
    """`spans` (start, duration) as drawn: spans of one kind closer than `MIN_WIDTH` of `makespan` joined
    into one bar (a pass split by its tensor-parallel collectives is one bar, not slivers that a widened
    neighbour of another kind would hide), then every bar at least `MIN_WIDTH` wide."""
    least = MIN_WIDTH * makespan
    joined: list[list[float]] = []
    for a, d in sorted(spans):
        if joined and a - joined[-1][1] < least:
            joined[-1][1] = max(joined[-1][1], a + d)
        else:
            joined.append([a, a + d])
    return [(a, max(b - a, least)) for a, b in joined]


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _split_gaps(gaps: list[tuple[float, float]], comm: list[tuple[float, float]]):
    """(covered, uncovered) pieces of `gaps` against the sorted disjoint `comm` spans."""
    covered, rest = [], []
    for a, b in gaps:
        at = a
        for c, d in comm:
            if d <= at:
                continue
            if c >= b:
                break
            if c > at:
                rest.append((at, c))
            covered.append((max(at, c), min(b, d)))
            at = min(b, d)
            if at >= b:
                break
        if at < b:
            rest.append((at, b))
    return covered, rest


def timeline_rows(trace: Mapping[str, Any], devices: int = DEFAULT_DEVICES,
                  pipelined: bool | None = None) -> dict[str, Any]:
    """The chart's rows from a Chrome trace: ``{"rows": [{"label", "device", "spans": {kind: [(start_s,
    dur_s)]}}], "devices_shown", "devices_total", "makespan_s", "title"}``."""
    events = trace.get("traceEvents") or []
    pname: dict[int, str] = {}
    order: dict[int, int] = {}
    tname: dict[tuple[int, int], str] = {}
    for e in events:
        if e.get("ph") != "M":
            continue
        if e.get("name") == "process_name":
            pname[e["pid"]] = e["args"]["name"]
        elif e.get("name") == "process_sort_index":
            order[e["pid"]] = e["args"]["sort_index"]
        elif e.get("name") == "thread_name":
            tname[(e["pid"], e["tid"])] = e["args"]["name"]
    links = next((pid for pid, name in pname.items() if name == "links"), None)
    device_pids = sorted((pid for pid in pname if pid != links), key=lambda p: (order.get(p, p), p))
    shown = device_pids[:max(devices, 1)]
    if pipelined is None:
        pipelined = len({_stage(pname[p]) for p in device_pids} - {None}) > 1
    spans: dict[tuple[int, int], dict[str, list[tuple[float, float]]]] = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        key = (e["pid"], e["tid"])
        kind = _kind(e)
        spans.setdefault(key, {}).setdefault(kind, []).append((e["ts"] * 1e-6, e["dur"] * 1e-6))
    makespan = float((trace.get("otherData") or {}).get("makespan_s") or max(
        (a + d for sp in spans.values() for v in sp.values() for a, d in v), default=0.0))
    rows = []
    for pid in shown:
        dname = pname[pid]
        threads = sorted((tid for (p, tid) in tname if p == pid),
                         key=lambda t: (0 if tname[(pid, t)].endswith("compute") else 1, t))
        ports = sorted(tid for (p, tid) in tname if p == links and tname[(p, tid)].startswith(dname + " "))
        comm = _union([(a, a + d) for t in threads if not tname[(pid, t)].endswith("compute")
                       for kind, v in spans.get((pid, t), {}).items() for a, d in v]
                      + [(a, a + d) for t in ports for v in spans.get((links, t), {}).values() for a, d in v])
        for tid in threads:
            sp = {k: list(v) for k, v in spans.get((pid, tid), {}).items()}
            if tname[(pid, tid)].endswith("compute"):
                busy = _union([(a, a + d) for v in sp.values() for a, d in v])
                gaps, at = [], 0.0
                for a, b in busy:
                    if a > at:
                        gaps.append((at, a))
                    at = max(at, b)
                if makespan > at:
                    gaps.append((at, makespan))
                covered, rest = _split_gaps(gaps, comm)
                sp["exposed"] = [(a, b - a) for a, b in covered]
                sp["bubble" if pipelined else "idle"] = [(a, b - a) for a, b in rest]
            label = tname[(pid, tid)]
            short = dname.split(" ")[0]
            if label.endswith("compute") and label.startswith(short + " "):
                label = dname + label[len(short):]
            rows.append({"label": label, "device": dname, "spans": sp})
        for tid in ports:
            rows.append({"label": tname[(links, tid)].replace(dname + " ", "link ", 1), "device": dname,
                         "spans": spans.get((links, tid), {})})
    return {"rows": rows, "devices_shown": len(shown), "devices_total": len(device_pids), "makespan_s": makespan,
            "title": (trace.get("otherData") or {}).get("title", ""), "pipelined": pipelined}


def _stage(name: str) -> str | None:
    for part in name.replace("(", " ").replace(")", " ").split():
        if part.startswith("pp") and part[2:].isdigit():
            return part
    return None


def gantt_figure(trace: Mapping[str, Any], devices: int = DEFAULT_DEVICES, title: str | None = None,
                 pipelined: bool | None = None) -> Any:
    """The Gantt chart of one iteration from its Chrome trace (see the module docstring)."""
    plt = _pyplot()
    from matplotlib.patches import Patch
    data = timeline_rows(trace, devices, pipelined)
    rows = data["rows"]
    makespan = data["makespan_s"]
    unit, scale = ("ms", 1e-3) if makespan < 2.0 else ("s", 1.0)
    height = max(3.0, 0.26 * len(rows) + 1.9)
    fig, ax = plt.subplots(figsize=(14, height))
    used: set[str] = set()
    for i, row in enumerate(rows):
        for kind in ("idle", "bubble", "exposed", "comm", "link", "compute", "forward", "backward", "recompute"):
            spans = row["spans"].get(kind)
            if not spans:
                continue
            used.add(kind)
            if kind in DRAWN:
                spans = visible(spans, makespan)
            ax.broken_barh([(a / scale, d / scale) for a, d in spans], (i - 0.38, 0.76), facecolors=COLORS[kind],
                           edgecolor="none", hatch="////" if kind == "exposed" else None)
    previous = None
    for i, row in enumerate(rows):
        if previous is not None and row["device"] != previous:
            ax.axhline(i - 0.5, color="#444444", linewidth=0.6)
        previous = row["device"]
    ax.set_yticks(range(len(rows)), [r["label"] for r in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, makespan / scale if makespan > 0 else 1)
    ax.set_xlabel(f"time since the iteration started ({unit})")
    ax.set_ylabel("device streams and link ports")
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(facecolor=COLORS[k], hatch="////" if k == "exposed" else None, label=LABELS[k])
               for k in ("forward", "backward", "recompute", "compute", "comm", "link", "exposed", "bubble", "idle")
               if k in used]
    fig.legend(handles=handles, fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(len(handles), 4) or 1, frameon=False)
    what = title or data["title"] or "simulated iteration"
    shown = (f"all {data['devices_total']} simulated devices" if data["devices_shown"] == data["devices_total"]
             else f"first {data['devices_shown']} of {data['devices_total']} simulated devices")
    ax.set_title(f"Timeline of one iteration: {what} ({makespan / scale:.4g} {unit}; {shown})", fontsize=10)
    fig.subplots_adjust(left=0.16, right=0.98, top=1 - 0.5 / height, bottom=1.25 / height)
    return fig
