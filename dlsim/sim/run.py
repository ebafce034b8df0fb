"""Simulate one iteration graph and turn its timeline into a `SimResult` (memory verdict included)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlsim.plan.taskgraph import TaskGraph
from dlsim.results import TimeBreakdown
from dlsim.results_sim import DeviceRecord, SimResult
from dlsim.sim.analysis import critical_path, device_times, measured_share, task_seconds
from dlsim.sim.engine import Timeline, execute
from dlsim.units import format_bytes

CRITICAL_PATH_TASKS = 60


@dataclass(frozen=True)
class RunInfo:
    """Names and totals the record carries besides the timeline."""

    model: str
    cluster: str
    device: str
    strategy: dict[str, Any]
    global_batch: int
    pipelined: bool
    flops_per_iteration: float
    peak_flops: float
    total_devices: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    tokens_per_sample: int = 0


def memory_verdict(records: list[DeviceRecord]) -> str:
    """'' when every device fits, else one line naming the worst device, its need and capacity."""
    over = [r for r in records if r.peak_memory_bytes > r.capacity_bytes]
    if not over:
        return ""
    worst = max(over, key=lambda r: (r.peak_memory_bytes / r.capacity_bytes, -r.rank))
    need, cap = worst.peak_memory_bytes, worst.capacity_bytes
    return (f"out of memory on {worst.name}: needs {format_bytes(need)}, capacity {format_bytes(cap)} "
            f"(over by {format_bytes(need - cap)}, {need / cap:.0%} of capacity; {len(over)} of {len(records)} "
            f"simulated devices over)")


def _critical(graph: TaskGraph, tl: Timeline) -> dict[str, Any]:
    path = critical_path(graph, tl)
    by_kind: dict[str, float] = {}
    waiting = 0.0
    previous_end = 0.0
    start, end, stretched = tl.start, tl.end, tl.stretched
    for tid in path:
        t = graph.tasks[tid]
        if t.parts or tid in stretched:
            for category, seconds in task_seconds(t, tl):
                by_kind[category] = by_kind.get(category, 0.0) + seconds
        else:  # (`task_seconds` of a task run whole)
            by_kind[t.category] = by_kind.get(t.category, 0.0) + (end[tid] - start[tid])
        waiting += max(0.0, start[tid] - previous_end)
        previous_end = end[tid]
    tasks = [{"task": graph.tasks[tid].name, "device": graph.devices[graph.tasks[tid].device].name,
              "category": graph.tasks[tid].category, "start_s": tl.start[tid], "end_s": tl.end[tid]}
             for tid in path[-CRITICAL_PATH_TASKS:]]
    return {"length_s": tl.makespan, "tasks_on_path": len(path), "time_by_category_s": by_kind,
            "waiting_s": waiting, "last_tasks": tasks}


def simulate_graph(graph: TaskGraph, info: RunInfo) -> tuple[SimResult, Timeline]:
    """Execute `graph` and summarise it."""
    tl = execute(graph)
    times = device_times(graph, tl, info.pipelined)
    records = device_records(graph, tl, times)
    return summarise(graph, tl, info, records, _critical(graph, tl), measured_share(graph), len(graph.tasks),
                     tl.makespan), tl


def device_records(graph: TaskGraph, tl: Timeline, times) -> list[DeviceRecord]:
    """One record per simulated device: its breakdown (`times`) and its memory at the timeline's peak."""
    records = []
    for i, dev in enumerate(graph.devices):
        static = dict(dev.static)
        dynamic = tl.memory_at_peak[i]
        memory = {**static, **{k: static.get(k, 0.0) + v for k, v in dynamic.items()}}  # a kind may be both
        peak = sum(static.values()) + tl.memory_peak[i]
        dt = times[i]
        records.append(DeviceRecord(dev.name, dev.rank, dev.stage, dev.multiplicity, dt.breakdown, dt.communication,
                                    dt.utilisation, peak, memory, dev.capacity))
    return records


def summarise(graph: TaskGraph, tl: Timeline, info: RunInfo, records: list[DeviceRecord], critical: dict[str, Any],
              share: float, tasks: int, makespan: float, notes: tuple[str, ...] = ()) -> SimResult:
    """The result record from per-device records and the run's totals."""
    weights = [r.multiplicity for r in records]
    total_w = sum(weights) or 1
    mean = TimeBreakdown(*(sum(getattr(r.breakdown, f) * w for r, w in zip(records, weights)) / total_w
                           for f in ("compute", "recompute", "exposed_comm", "bubble", "idle")))
    comm = sum(r.communication_s * w for r, w in zip(records, weights)) / total_w
    verdict = memory_verdict(records)
    return SimResult(info.model, info.cluster, info.device, info.strategy, makespan, info.global_batch, mean,
                     comm, tuple(records), critical, share, info.flops_per_iteration,
                     info.peak_flops, info.total_devices, len(graph.devices), tasks, tl.events,
                     feasible=not verdict, infeasible_reason=verdict, notes=info.notes + tuple(graph.notes) + notes,
                     tokens_per_sample=info.tokens_per_sample)
