"""What a whole training run needs beyond one iteration: device power, failure rates, the
checkpoint storage tier and the restart, as frozen data in SI units (watts, seconds, bytes/s,
failures per second). Read from a profile's ``power:``, ``reliability:``, ``storage:`` and
``restart:`` sections by `dlsim.io.profile_run`; every number carries its source there.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

DAY = 86400.0


@dataclass(frozen=True)
class DevicePower:
    """Board power of one device by what it is doing (W).

    `compute_w`: running matrix-unit kernels at the attainable rate (a large GEMM; the power limit
    on current GPUs); `memory_bound_w`: running kernels limited by memory bandwidth; `communication_w`:
    only communication kernels running (exposed communication); `waiting_w`: in the job but waiting
    (pipeline bubble, stragglers, a blocking checkpoint); `idle_w`: allocated but no process running
    (relaunch after a failure). `dlsim.cost.power` blends them by the iteration's breakdown."""

    idle_w: float
    compute_w: float
    memory_bound_w: float
    communication_w: float
    waiting_w: float
    source: str = ""


@dataclass(frozen=True)
class PowerModel:
    """Device power, what each node draws beyond its devices (CPUs, NICs, switches' share, fans,
    W per node) and the facility's power usage effectiveness (total / IT power)."""

    device: DevicePower
    node_overhead_w: float
    pue: float
    source: str = ""


@dataclass(frozen=True)
class Reliability:
    """Job-interrupting failures: per node and per device (failures per second each; a job on n
    nodes of d devices is interrupted at rate n·λ_node + n·d·λ_device, the series-system model of
    Kokolis et al. 2024 §V) and planned interruptions per second of a job (maintenance)."""

    node_rate: float
    device_rate: float = 0.0
    planned_rate: float = 0.0
    source: str = ""

    def job_rate(self, nodes: int, devices: int) -> float:
        """Unplanned interruptions per second of a job holding `nodes` nodes and `devices` devices."""
        return nodes * self.node_rate + devices * self.device_rate


@dataclass(frozen=True)
class StorageTier:
    """Where checkpoints go: write and read bandwidth per node (bytes/s, what one node's storage
    NICs and client sustain) and in aggregate (bytes/s, what the storage system sustains)."""

    name: str
    write_per_node: float
    read_per_node: float
    write_aggregate: float
    read_aggregate: float
    source: str = ""


@dataclass(frozen=True)
class Restart:
    """After a failure: `relaunch_s` to detect it, replace the node and start the processes again
    (scheduler, container, communicator set-up), then the checkpoint is read (from the storage tier)
    and `warmup_iterations` run slower than the steady state (each costs one iteration more)."""

    relaunch_s: float
    warmup_iterations: float = 0.0
    source: str = ""


@dataclass(frozen=True)
class RunProfile:
    """The profile's run sections (None where the profile has none)."""

    power: PowerModel | None = None
    reliability: Reliability | None = None
    storage: StorageTier | None = None
    restart: Restart | None = None
    path: str = ""
    sources: tuple[str, ...] = field(default_factory=tuple)

    def with_(self, **changes) -> "RunProfile":
        return replace(self, **changes)
