"""Energy of one iteration from where its time goes, per device, node and facility.

A device's board power follows what it is doing (`dlsim.spec.run.DevicePower`, per profile and
sourced there). Over one iteration a device spends (the simulated `TimeBreakdown`):

- compute (+ recompute) seconds running kernels: a share u at matrix-unit speed, the rest in
  memory-bound kernels, u = min(1, F_d / (t_compute · P_attainable)), F_d the model FLOPs the
  device does in the iteration and P_attainable the device's attainable matrix rate (peak × its
  best measured GEMM efficiency): power u·P_compute + (1 − u)·P_memory;
- exposed communication seconds at P_communication;
- bubble and idle seconds at P_waiting,

    E_device = t_c·(u·P_compute + (1−u)·P_memory) + t_comm·P_communication + (t_bubble + t_idle)·P_waiting

Communication hidden behind compute is counted in the compute power (the kernels run anyway).
Each node adds its overhead (CPUs, NICs, NVSwitches, fans) for the whole iteration, and the
facility multiplies the IT energy by its PUE:

    E_IT = Σ_devices E_device + nodes · P_node · t_iteration,     E_facility = PUE · E_IT
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlsim.results import TimeBreakdown
from dlsim.spec.run import DevicePower, PowerModel


@dataclass(frozen=True)
class DeviceEnergy:
    """One device's iteration: seconds and joules per activity, its matrix share u, its average power."""

    name: str
    multiplicity: int
    seconds: dict[str, float]
    joules: dict[str, float]
    matrix_share: float

    @property
    def total_j(self) -> float:
        return sum(self.joules.values())

    @property
    def mean_power_w(self) -> float:
        t = sum(self.seconds.values())
        return self.total_j / t if t > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "multiplicity": self.multiplicity, "seconds": dict(self.seconds),
                "energy_j": dict(self.joules), "total_energy_j": self.total_j, "mean_power_w": self.mean_power_w,
                "matrix_share": self.matrix_share}


def device_energy(name: str, multiplicity: int, b: TimeBreakdown, flops: float, attainable_flops: float,
                  p: DevicePower) -> DeviceEnergy:
    """The energy of one device over an iteration split as `b` (module docstring)."""
    tc = b.compute + b.recompute
    u = min(1.0, flops / (tc * attainable_flops)) if tc > 0 and attainable_flops > 0 else 0.0
    seconds = {"matrix": tc * u, "memory_bound": tc * (1 - u), "communication": b.exposed_comm,
               "waiting": b.bubble + b.idle}
    watts = {"matrix": p.compute_w, "memory_bound": p.memory_bound_w, "communication": p.communication_w,
             "waiting": p.waiting_w}
    return DeviceEnergy(name, multiplicity, seconds, {k: seconds[k] * watts[k] for k in seconds}, u)


@dataclass(frozen=True)
class IterationEnergy:
    """The devices' energy, the nodes' overhead and the facility's total for one iteration (J)."""

    devices: tuple[DeviceEnergy, ...]
    node_j: float
    pue: float
    iteration_s: float

    @property
    def device_j(self) -> float:
        return sum(d.total_j * d.multiplicity for d in self.devices)

    @property
    def it_j(self) -> float:
        return self.device_j + self.node_j

    @property
    def facility_j(self) -> float:
        return self.it_j * self.pue

    @property
    def it_power_w(self) -> float:
        return self.it_j / self.iteration_s if self.iteration_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"devices_j": self.device_j, "nodes_j": self.node_j, "it_j": self.it_j, "pue": self.pue,
                "facility_j": self.facility_j, "it_power_w": self.it_power_w,
                "per_device": [d.to_dict() for d in self.devices]}


def iteration_energy(devices: list[DeviceEnergy], nodes: int, iteration_s: float, power: PowerModel) -> IterationEnergy:
    """The iteration's energy from its devices' (`device_energy`) and `nodes` nodes' overhead."""
    return IterationEnergy(tuple(devices), nodes * power.node_overhead_w * iteration_s, power.pue, iteration_s)


def cluster_power(power: PowerModel, devices: int, nodes: int, state: str) -> float:
    """IT power (W) of `devices` devices on `nodes` nodes all `waiting` (a blocking checkpoint, reading
    a checkpoint) or `idle` (relaunching after a failure)."""
    per = {"waiting": power.device.waiting_w, "idle": power.device.idle_w}[state]
    return devices * per + nodes * power.node_overhead_w
