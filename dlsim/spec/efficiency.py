"""Device efficiency as data: the fraction of a peak that kernels of a given size attain.

A profile states, per device and data type, what published microbenchmarks of that device (or
`dlsim calibrate compute`) measured: matrix-unit efficiency by GEMM work (FLOPs per kernel),
vector-unit efficiency by work, and memory-bandwidth efficiency by bytes moved per kernel. Each
curve carries the source of its numbers. `dlsim.cost.roofline` interpolates them.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class EfficiencyCurve:
    """Efficiency (a fraction of peak, in (0, 1]) at increasing sizes `sizes` (FLOP or bytes per
    kernel), interpolated linearly in log(size) and held flat outside the stated points.
    `source` says where the numbers were measured."""

    sizes: tuple[float, ...]
    values: tuple[float, ...]
    source: str = ""

    def at(self, size: float) -> tuple[float, bool]:
        """(efficiency at `size`, whether `size` lies inside the stated range)."""
        xs, ys = self.sizes, self.values
        if size <= xs[0]:
            return ys[0], size == xs[0]
        if size >= xs[-1]:
            return ys[-1], size == xs[-1]
        i = bisect.bisect_right(xs, size)
        x0, x1 = math.log(xs[i - 1]), math.log(xs[i])
        f = (math.log(size) - x0) / (x1 - x0)
        return ys[i - 1] + f * (ys[i] - ys[i - 1]), True


@dataclass(frozen=True)
class AttentionEfficiency:
    """Measured throughput of one attention kernel at one head dimension (a flash kernel,
    `dlsim.cost.flash`, or the unfused chain, `dlsim.cost.unfused`) as fractions of the 16-bit matrix
    peak, by sequence length (keys per query in one call): `forward` and `backward`
    without a mask, `forward_causal` and `backward_causal` with a causal mask, their FLOPs counted as
    half the full products (the convention of the benchmarks that measure them). `backward_causal`
    may be None (not measured): `at` then scales `backward` by the forward's causal over non-causal
    ratio at the same length. `timed_together`: the source timed forward and backward
    as one (its rate R counting the backward as 2.5 forwards), and both passes hold R: with forward
    work W the two passes take W / R + 2.5 W / R = 3.5 W / R, the measured time of the pair."""

    forward: EfficiencyCurve
    forward_causal: EfficiencyCurve
    backward: EfficiencyCurve
    backward_causal: EfficiencyCurve | None = None
    source: str = ""
    timed_together: bool = False
    head_dim: int | None = None
    """The head dimension measured (None: not stated)."""

    def at(self, pass_name: str, causal: bool, length: float) -> float:
        """The fraction of peak of `pass_name` ("forward" or "backward") at `length`, with or without
        the causal mask; a causal backward without its own curve scales the plain backward by the
        forward's causal over plain ratio at that length (a modelling assumption, stated)."""
        if pass_name == "forward":
            return (self.forward_causal if causal else self.forward).at(length)[0]
        plain = self.backward.at(length)[0]
        if not causal:
            return plain
        if self.backward_causal is not None:
            return self.backward_causal.at(length)[0]
        return plain * self.forward_causal.at(length)[0] / self.forward.at(length)[0]


@dataclass(frozen=True)
class AttentionMeasurements:
    """One attention kernel measured at one or more head dimensions (`by_head_dim`, increasing; a
    single measurement may leave its head dimension unstated). Between two measured head dimensions
    the fraction of peak is interpolated linearly in log(head dimension); outside them it is held
    at the nearest (stated assumption: the measurements span 64 to 128, most models' range)."""

    by_head_dim: tuple[AttentionEfficiency, ...]

    @property
    def timed_together(self) -> bool:
        return self.by_head_dim[0].timed_together

    @property
    def source(self) -> str:
        """The measurements' sources, each once."""
        return "; ".join(dict.fromkeys(m.source for m in self.by_head_dim if m.source))

    def measured_head_dim(self, head_dim: float) -> float:
        """`head_dim` held inside the measured range (itself for a single measurement)."""
        dims = [m.head_dim for m in self.by_head_dim if m.head_dim is not None]
        return head_dim if len(dims) < 2 else min(max(head_dim, dims[0]), dims[-1])

    def at(self, pass_name: str, causal: bool, length: float, head_dim: float | None = None) -> float:
        """Fraction of peak of `pass_name` at sequence length `length` and head dimension `head_dim`."""
        ms = self.by_head_dim
        if head_dim is None or len(ms) == 1:
            return ms[0].at(pass_name, causal, length)
        dims = [float(m.head_dim or 0) for m in ms]  # all stated and increasing (`dlsim.io.profile_yaml`)
        if head_dim <= dims[0]:
            return ms[0].at(pass_name, causal, length)
        if head_dim >= dims[-1]:
            return ms[-1].at(pass_name, causal, length)
        i = bisect.bisect_left(dims, head_dim)
        f = math.log(head_dim / dims[i - 1]) / math.log(dims[i] / dims[i - 1])
        lo, hi = ms[i - 1].at(pass_name, causal, length), ms[i].at(pass_name, causal, length)
        return lo + f * (hi - lo)


@dataclass(frozen=True)
class DeviceEfficiency:
    """Efficiency curves of one device: `matrix` per data type (by FLOPs of one GEMM), `vector`
    (by FLOPs of one element-wise kernel) and `memory` (by bytes one kernel moves); any may be
    missing, and then the device's single-number parameters apply. `kernels` maps a memory-bound
    kernel, ``"<op>.<pass>"`` (e.g. ``"layernorm.backward_data"``), to the fraction of the memory
    bandwidth it attains for the bytes dlsim counts for it, and its source: kernels slower than
    streaming (reductions, two-phase backward passes) measured on their own. `attention` holds the
    measured flash-attention kernels."""

    matrix: Mapping[str, EfficiencyCurve] = field(default_factory=lambda: MappingProxyType({}))
    vector: EfficiencyCurve | None = None
    memory: EfficiencyCurve | None = None
    kernels: Mapping[str, tuple[float, str]] = field(default_factory=lambda: MappingProxyType({}))
    attention: Mapping[str, AttentionMeasurements] = field(default_factory=lambda: MappingProxyType({}))
    """Attention kernels measured on their own, by kernel name: the flash kernels (`flash_attention`,
    `cudnn_attention`) and the unfused chain (`standard_attention`, `dlsim.cost.unfused`)."""
