"""Result records: estimates with provenance, time breakdowns that add up, serialisable results.

Nothing here computes a cost; these are the values that flow from cost and sim to report and io.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from functools import cached_property
from typing import Any, Mapping

SCHEMA_VERSION = 1


class Source(str, Enum):
    """Where a number came from."""

    MEASURED = "measured"
    """An exact hit in a measured table."""
    INTERPOLATED = "interpolated"
    """Between measured points of a table."""
    EXTRAPOLATED = "extrapolated"
    """Outside a measured table's range, scaled from its nearest point."""
    MODEL = "model"
    """An analytic model (roofline, LogGP, ...) with datasheet or fitted parameters."""


_WEAKEST_LAST = (Source.MEASURED, Source.INTERPOLATED, Source.EXTRAPOLATED, Source.MODEL)
FROM_TABLES = frozenset({Source.MEASURED, Source.INTERPOLATED})
"""Sources that are measurements of the device (exact or between measured points)."""


@dataclass(frozen=True)
class Estimate:
    """A time in seconds and where it came from; `note` says which table or model. A sum of parts of
    different provenance keeps, in `split`, the seconds of each source (empty: all from `source`)."""

    seconds: float
    source: Source
    note: str = ""
    split: tuple[tuple[Source, float], ...] = ()

    def by_source(self) -> dict[Source, float]:
        """Seconds per source."""
        return dict(self.split) if self.split else {self.source: self.seconds}

    @cached_property
    def table_share(self) -> float:
        """The share of the seconds that come from measured tables (`FROM_TABLES`); computed once per
        estimate (a layer's estimates are read by every schedule built on its table)."""
        if self.seconds <= 0:
            return 1.0 if self.source in FROM_TABLES else 0.0
        return sum(t for src, t in self.by_source().items() if src in FROM_TABLES) / self.seconds

    def __add__(self, other: "Estimate") -> "Estimate":
        """The sum is labelled with the weakest source (model < extrapolated < interpolated < measured) and
        keeps the seconds of each source in `split`."""
        worst = max(self.source, other.source, key=_WEAKEST_LAST.index)
        seconds = self.by_source()
        for src, t in other.by_source().items():
            seconds[src] = seconds.get(src, 0.0) + t
        split = tuple(sorted(seconds.items(), key=lambda kv: _WEAKEST_LAST.index(kv[0]))) if len(seconds) > 1 else ()
        return Estimate(self.seconds + other.seconds, worst, self.note if worst == self.source else other.note, split)


@dataclass(frozen=True)
class TimeBreakdown:
    """Where one iteration's time goes, per device; the fields add up to `total`.

    compute: useful forward/backward/optimizer kernels; recompute: forward kernels re-run for
    activation recomputation; exposed_comm: communication not hidden behind compute; bubble:
    pipeline fill/drain; idle: any other waiting (stragglers, dependencies).
    """

    compute: float = 0.0
    recompute: float = 0.0
    exposed_comm: float = 0.0
    bubble: float = 0.0
    idle: float = 0.0

    @property
    def total(self) -> float:
        return self.compute + self.recompute + self.exposed_comm + self.bubble + self.idle

    def __add__(self, other: "TimeBreakdown") -> "TimeBreakdown":
        return TimeBreakdown(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __radd__(self, other: Any) -> "TimeBreakdown":
        return self if other == 0 else self.__add__(other)

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


@dataclass(frozen=True)
class LayerTiming:
    """Predicted time of one layer in one training iteration on one device."""

    name: str
    type: str
    forward: Estimate
    backward_data: Estimate
    backward_weight: Estimate
    flops: float
    params: int
    activation_bytes: float
    out_shape: tuple[int, ...] = ()

    @property
    def total_seconds(self) -> float:
        return self.forward.seconds + self.backward_data.seconds + self.backward_weight.seconds

    def to_dict(self) -> dict[str, Any]:
        def est(e: Estimate) -> dict[str, Any]:
            return {"time_s": e.seconds, "source": e.source.value, **({"note": e.note} if e.note else {})}
        return {"name": self.name, "type": self.type, "out_shape": list(self.out_shape),
                "forward": est(self.forward), "backward_data": est(self.backward_data),
                "backward_weight": est(self.backward_weight), "time_s": self.total_seconds,
                "flops": self.flops, "params": self.params, "activation_bytes": self.activation_bytes}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes one device needs; `total` is the peak of a plain (non-pipelined) iteration."""

    weights: float = 0.0
    gradients: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    workspace: float = 0.0
    buffers: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.workspace + self.buffers

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


@dataclass(frozen=True)
class EstimateResult:
    """One device, one training iteration: the record `dlsim estimate` prints."""

    model: str
    cluster: str
    device: str
    batch: int
    dtype: str
    optimizer: str
    layers: tuple[LayerTiming, ...]
    optimizer_step: Estimate
    memory: MemoryBreakdown
    memory_capacity: float
    flops: float
    params: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    assumed: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = field(default_factory=tuple)
    host: Mapping[str, Any] = field(default_factory=dict)
    fresh_pages_s: float = 0.0
    """Seconds of the iteration that are fresh pages of the allocator (already in the layers' passes)."""

    @property
    def iteration_time_s(self) -> float:
        return sum(layer.total_seconds for layer in self.layers) + self.optimizer_step.seconds

    def time_by_source(self) -> dict[str, float]:
        """Seconds of the iteration per provenance (measured, interpolated, ..., model)."""
        shares: dict[str, float] = {s.value: 0.0 for s in Source}
        for e in (*(p for layer in self.layers for p in (layer.forward, layer.backward_data, layer.backward_weight)),
                  self.optimizer_step):
            for src, seconds in e.by_source().items():
                shares[src.value] += seconds
        return shares

    def to_dict(self) -> dict[str, Any]:
        total = self.iteration_time_s
        by_source = self.time_by_source()
        return {
            "schema_version": SCHEMA_VERSION, "kind": "estimate",
            "model": self.model, "cluster": self.cluster, "device": self.device,
            "batch": self.batch, "dtype": self.dtype, "optimizer": self.optimizer, "assumed": dict(self.assumed),
            "iteration_time_s": total,
            "throughput_samples_per_s": self.batch / total if total > 0 else 0.0,
            "forward_time_s": sum(layer.forward.seconds for layer in self.layers),
            "backward_time_s": sum(layer.backward_data.seconds + layer.backward_weight.seconds for layer in self.layers),
            "optimizer_time_s": self.optimizer_step.seconds,
            "flops": self.flops, "params": self.params,
            "achieved_flops_per_s": self.flops / total if total > 0 else 0.0,
            "time_by_source_s": by_source, "fresh_pages_s": self.fresh_pages_s,
            "measured_share": (by_source["measured"] + by_source["interpolated"]) / total if total > 0 else 0.0,
            "memory_bytes": self.memory.to_dict(),
            "memory_capacity_bytes": self.memory_capacity,
            "fits_in_memory": self.memory.total <= self.memory_capacity,
            "notes": list(self.notes),
            **({"warnings": list(self.warnings)} if self.warnings else {}),
            **({"host": dict(self.host)} if self.host else {}),
            "layers": [layer.to_dict() for layer in self.layers],
        }
