"""The record of a whole training run (`dlsim run`): iterations, time to train with failures and
checkpoints, energy and cost. Plain values with `to_dict`; reports and plots read only this."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dlsim.results import SCHEMA_VERSION


def finite(value: Any) -> Any:
    """`value` with every infinite float (no failures: an infinite MTBF, no optimal interval) as None."""
    if isinstance(value, float) and math.isinf(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


@dataclass(frozen=True)
class RunResult:
    """A run of `tokens` tokens (or samples) of a model under one strategy on a cluster."""

    model: str
    cluster: str
    gpus: int
    nodes: int
    strategy: dict[str, Any]
    stack: dict[str, Any] | None
    tokens: float
    tokens_per_sample: int
    phases: tuple[dict[str, Any], ...]
    iterations: int
    iteration_time_s: float
    work_s: float
    failures: dict[str, Any]
    checkpoint: dict[str, Any]
    expected: dict[str, float]
    monte_carlo: dict[str, Any] | None
    energy: dict[str, Any] | None
    cost: dict[str, Any] | None
    iteration: dict[str, Any]
    notes: tuple[str, ...] = field(default_factory=tuple)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def wall_s(self) -> float:
        return self.expected["wall_s"]

    @property
    def goodput(self) -> float:
        return self.expected["goodput"]

    @property
    def gpu_hours(self) -> float:
        return self.wall_s * self.gpus / 3600.0

    @property
    def energy_kwh(self) -> float | None:
        return None if self.energy is None else self.energy["facility_kwh"]

    @property
    def cost_usd(self) -> float | None:
        return None if self.cost is None else self.cost["total_usd"]

    def to_dict(self) -> dict[str, Any]:
        return finite({"schema_version": SCHEMA_VERSION, "kind": "run", "model": self.model, "cluster": self.cluster,
                "gpus": self.gpus, "nodes": self.nodes, "strategy": self.strategy, "stack": self.stack,
                "tokens": self.tokens, "tokens_per_sample": self.tokens_per_sample, "phases": list(self.phases),
                "iterations": self.iterations, "iteration_time_s": self.iteration_time_s,
                "tokens_per_s": self.tokens / self.wall_s if self.wall_s > 0 else 0.0,
                "work_s": self.work_s, "wall_s": self.wall_s, "wall_days": self.wall_s / 86400.0,
                "gpu_hours": self.gpu_hours, "goodput": self.goodput, "expected": dict(self.expected),
                "failures": dict(self.failures), "checkpoint": dict(self.checkpoint),
                "monte_carlo": self.monte_carlo, "energy": self.energy, "cost": self.cost,
                "iteration": dict(self.iteration), "sources": dict(self.sources), "notes": list(self.notes)})
