"""Micro-batch plan records: per convolution layer and pass, the micro-batches, time and workspace.

Plain frozen dataclasses (no solver import), so that the simulator and the report side can use a
plan without the planner. Built by `dlsim.plan.microbatch.plan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlsim.plan.microbatch.configs import Config, Kernel

MODES = ("wr", "wd")


@dataclass(frozen=True)
class PassPlan:
    """The plan of one kernel: micro-batches (size, algorithm, time, workspace) in execution order."""

    pass_name: str
    microbatches: tuple[Kernel, ...]
    time_s: float
    workspace_bytes: float
    undivided: Kernel | None
    source: str
    pareto: tuple[Config, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        def mb(k: Kernel) -> dict[str, Any]:
            return {"size": k.size, "algorithm": k.algorithm, "time_s": k.time_s, "workspace_bytes": k.workspace_bytes}
        out = {"time_s": self.time_s, "workspace_bytes": self.workspace_bytes, "source": self.source,
               "microbatches": [mb(k) for k in self.microbatches],
               "undivided": mb(self.undivided) if self.undivided else None}
        if self.pareto:
            out["pareto"] = [{"time_s": c.time_s, "workspace_bytes": c.workspace_bytes,
                              "microbatches": [mb(k) for k in c.kernels]} for c in self.pareto]
        return out


@dataclass(frozen=True)
class LayerPlan:
    """A convolution layer's passes; workspace is the max over passes (WR) or their sum (WD)."""

    name: str
    passes: tuple[PassPlan, ...]
    workspace_bytes: float

    @property
    def time_s(self) -> float:
        return sum(p.time_s for p in self.passes)

    def get(self, pass_name: str) -> PassPlan | None:
        return next((p for p in self.passes if p.pass_name == pass_name), None)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "time_s": self.time_s, "workspace_bytes": self.workspace_bytes,
                "microbatches": {p.pass_name: p.to_dict()["microbatches"] for p in self.passes},
                "passes": {p.pass_name: p.to_dict() for p in self.passes}}


@dataclass(frozen=True)
class MicrobatchPlan:
    """Per convolution layer and pass: micro-batch sizes, algorithms, time and workspace; totals and baseline.

    `workspace_bytes` is the device memory the plan needs for convolution workspace (WR: the largest
    kernel's, one reused buffer; WD: the sum of the kernels' segments). `undivided_time_s` is None when
    the undivided baseline does not fit the limit.
    """

    mode: str
    policy: str
    batch: int
    workspace_limit: float
    layers: tuple[LayerPlan, ...]
    time_s: float
    undivided_time_s: float | None
    workspace_bytes: float
    source: str
    solver: str = ""
    optimal: bool = True
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def speedup(self) -> float | None:
        return self.undivided_time_s / self.time_s if self.undivided_time_s and self.time_s > 0 else None

    def layer(self, name: str) -> LayerPlan:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    def pass_time_s(self, layer: str, pass_name: str) -> float | None:
        """Planned seconds of one layer's pass, None when the plan does not cover it."""
        for lp in self.layers:
            if lp.name == layer:
                p = lp.get(pass_name)
                return p.time_s if p else None
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": 1, "kind": "microbatch_plan", "mode": self.mode, "policy": self.policy,
                "batch": self.batch, "workspace_limit_bytes": self.workspace_limit, "source": self.source,
                "time_s": self.time_s, "undivided_time_s": self.undivided_time_s, "speedup": self.speedup,
                "workspace_bytes": self.workspace_bytes, "solver": self.solver, "optimal": self.optimal,
                "notes": list(self.notes), "layers": [layer.to_dict() for layer in self.layers]}
