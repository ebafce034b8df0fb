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
    """Measured throughput of one flash-attention kernel (`dlsim.cost.flash`) as fractions of the
    16-bit matrix peak, by sequence length (keys per query in one call): `forward` and `backward`
    without a mask, `forward_causal` and `backward_causal` with a causal mask, their FLOPs counted as
    half the full products (the convention of the benchmarks that measure them). `backward_causal`
    may be None (not measured): `dlsim.cost.flash` then scales `backward` by the forward's causal
    over non-causal ratio at the same length. `timed_together`: the source timed forward and backward
    as one (its rate R counting the backward as 2.5 forwards), and both passes hold R: with forward
    work W the two passes take W / R + 2.5 W / R = 3.5 W / R, the measured time of the pair."""

    forward: EfficiencyCurve
    forward_causal: EfficiencyCurve
    backward: EfficiencyCurve
    backward_causal: EfficiencyCurve | None = None
    source: str = ""
    timed_together: bool = False


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
    attention: Mapping[str, AttentionEfficiency] = field(default_factory=lambda: MappingProxyType({}))
    """Flash-attention kernels measured on their own, by kernel name (`flash_attention`,
    `cudnn_attention`)."""
