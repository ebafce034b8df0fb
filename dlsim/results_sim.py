"""Simulation result records: one training iteration (`SimResult`) and asynchronous training
(`AsyncResult`). Plain values with `to_dict`; reports and plots read only these records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlsim.results import SCHEMA_VERSION, TimeBreakdown


@dataclass(frozen=True)
class DeviceRecord:
    """One simulated device: which ranks it stands for, its time breakdown and memory."""

    name: str
    rank: int
    stage: int
    multiplicity: int
    breakdown: TimeBreakdown
    communication_s: float
    utilisation: float
    peak_memory_bytes: float
    memory: dict[str, float]
    capacity_bytes: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "rank": self.rank, "stage": self.stage, "multiplicity": self.multiplicity,
                "breakdown_s": self.breakdown.to_dict(), "communication_s": self.communication_s,
                "utilisation": self.utilisation, "peak_memory_bytes": self.peak_memory_bytes,
                "memory_bytes": dict(self.memory), "capacity_bytes": self.capacity_bytes,
                "fits_in_memory": self.peak_memory_bytes <= self.capacity_bytes}


@dataclass(frozen=True)
class SimResult:
    """One simulated training iteration of a model under a strategy on a cluster."""

    model: str
    cluster: str
    device: str
    strategy: dict[str, Any]
    iteration_time_s: float
    global_batch: int
    breakdown: TimeBreakdown
    communication_s: float
    devices: tuple[DeviceRecord, ...]
    critical_path: dict[str, Any]
    measured_share: float
    flops_per_iteration: float
    peak_flops: float
    total_devices: int
    simulated_devices: int
    tasks: int
    events: int
    feasible: bool = True
    infeasible_reason: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    assumed: dict[str, Any] = field(default_factory=dict)
    stack: dict[str, Any] | None = None
    """The software stack the run used (`dlsim.api.stacks.stack_record`), None when none was named."""
    tokens_per_sample: int = 0
    """Tokens of one sample (its sequence) for a token model; 0 otherwise."""

    @property
    def tokens_per_s(self) -> float | None:
        """Training tokens per second (None for a model that does not read tokens)."""
        return self.throughput_samples_per_s * self.tokens_per_sample if self.tokens_per_sample else None

    @property
    def tflops_per_gpu(self) -> float:
        """Model TFLOP/s per GPU: the model's training FLOPs per iteration (no recomputation) over the
        iteration time and the devices, as Megatron-LM and torchtitan report it."""
        t = self.iteration_time_s
        return self.flops_per_iteration / (t * self.total_devices) / 1e12 if t > 0 and self.total_devices else 0.0

    @property
    def throughput_samples_per_s(self) -> float:
        return self.global_batch / self.iteration_time_s if self.iteration_time_s > 0 else 0.0

    @property
    def peak_memory_bytes(self) -> float:
        return max((d.peak_memory_bytes for d in self.devices), default=0.0)

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: the model's training FLOPs per iteration over what every device's
        peak could do in the iteration time (PaLM, Chowdhery et al. 2022, App. B); 0 when undefined."""
        t = self.iteration_time_s
        return self.flops_per_iteration / (t * self.total_devices * self.peak_flops) if t > 0 and self.peak_flops else 0.0

    def to_dict(self) -> dict[str, Any]:
        t = self.iteration_time_s
        mfu = self.mfu
        return {
            "schema_version": SCHEMA_VERSION, "kind": "simulation",
            "model": self.model, "cluster": self.cluster, "device": self.device, "strategy": self.strategy,
            "dtype": self.strategy.get("dtype"), "stack": self.stack, "assumed": dict(self.assumed),
            "feasible": self.feasible, "infeasible_reason": self.infeasible_reason,
            "iteration_time_s": t, "throughput_samples_per_s": self.throughput_samples_per_s,
            "tokens_per_s": self.tokens_per_s, "model_tflops_per_gpu": self.tflops_per_gpu,
            "global_batch": self.global_batch,
            "breakdown_s": self.breakdown.to_dict(), "communication_s": self.communication_s,
            "utilisation": sum(d.utilisation * d.multiplicity for d in self.devices)
            / max(sum(d.multiplicity for d in self.devices), 1),
            "peak_memory_bytes": self.peak_memory_bytes,
            "flops_per_iteration": self.flops_per_iteration, "model_flops_utilisation": mfu,
            "measured_share": self.measured_share,
            "critical_path": self.critical_path,
            "devices": [d.to_dict() for d in self.devices],
            "simulation": {"total_devices": self.total_devices, "simulated_devices": self.simulated_devices,
                           "tasks": self.tasks, "events": self.events},
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class AsyncResult:
    """Many iterations of parameter-server training (synchronous, asynchronous or stale-synchronous)."""

    model: str
    cluster: str
    strategy: dict[str, Any]
    sync: str
    workers: int
    samples_per_update: int
    simulated_time_s: float
    updates: int
    worker_iterations: tuple[int, ...]
    worker_compute_s: tuple[float, ...]
    worker_wait_s: tuple[float, ...]
    worker_comm_s: tuple[float, ...]
    staleness_histogram: dict[int, int]
    iteration_compute_s: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    worker_finish_s: tuple[float, ...] = ()
    assumed: dict[str, Any] = field(default_factory=dict)
    stack: dict[str, Any] | None = None
    """The software stack the run used (`dlsim.api.stacks.stack_record`), None when none was named."""

    @property
    def throughput_samples_per_s(self) -> float:
        """Per worker clock: each worker's samples over its own finishing time, summed (all workers
        finishing together: updates x samples per update / simulated time)."""
        per_iteration = self.samples_per_update  # samples of one iteration x push_every, per update
        if self.worker_finish_s and len(self.worker_finish_s) == len(self.worker_iterations):
            pushes = [self.updates / max(len(self.worker_iterations), 1)] * len(self.worker_iterations)
            return sum(u * per_iteration / f for u, f in zip(pushes, self.worker_finish_s) if f > 0)
        return self.updates * per_iteration / self.simulated_time_s if self.simulated_time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        total = sum(self.staleness_histogram.values())
        mean = sum(k * v for k, v in self.staleness_histogram.items()) / total if total else 0.0
        return {
            "schema_version": SCHEMA_VERSION, "kind": "async_simulation",
            "model": self.model, "cluster": self.cluster, "strategy": self.strategy, "sync": self.sync,
            "dtype": self.strategy.get("dtype"), "stack": self.stack, "assumed": dict(self.assumed),
            "workers": self.workers, "simulated_time_s": self.simulated_time_s, "updates": self.updates,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "updates_per_s": self.updates / self.simulated_time_s if self.simulated_time_s > 0 else 0.0,
            "iteration_time_s": self.simulated_time_s / max(min(self.worker_iterations, default=1), 1),
            "iteration_compute_s": self.iteration_compute_s,
            "staleness_histogram": {str(k): v for k, v in sorted(self.staleness_histogram.items())},
            "staleness_mean": mean, "staleness_max": max(self.staleness_histogram, default=0),
            "workers_detail": [{"worker": i, "iterations": n, "compute_s": c, "wait_s": w, "comm_s": m,
                                "finish_s": self.worker_finish_s[i] if i < len(self.worker_finish_s) else None}
                               for i, (n, c, w, m) in enumerate(zip(self.worker_iterations, self.worker_compute_s,
                                                                     self.worker_wait_s, self.worker_comm_s))],
            "notes": list(self.notes),
        }
