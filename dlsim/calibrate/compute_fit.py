"""Roofline parameters of a device fitted to its measured tables (for shapes no table covers).

`dlsim.cost.roofline` prices an unmeasured GEMM of W FLOPs as

    t = W / (π · e(W)) + t_launch,   e(W) = e_max · W / (W + W_half),

which is linear in W: ``t = a·W + b`` with ``a = 1/(π·e_max)`` and ``b = W_half/(π·e_max) + t_launch``.
`fit_gemm` fits a and b by least squares on the *relative* error (minimise Σ ((t_i − a·W_i − b)/t_i)²,
a 2×2 linear system), so small and large kernels weigh the same. The asymptotic throughput is
π·e_max = 1/a; π is the best throughput measured in the table (or 1/a when that is higher, e_max
then 1), e_max = 1/(π·a) and W_half = (b − t_launch)/a.

Memory-bound kernels are priced ``t = Q/(B·e_mem) + t_launch``: `fit_memory` fits ``t = c·Q + d`` the
same way over the memory table and returns e_mem = 1/(B·c) (at most 1) for the measured stream
bandwidth B.

`efficiency_curve` turns the same measurements into the profile's efficiency curves
(`dlsim.spec.efficiency`): each kernel's attained fraction of the peak, W/((t − t_launch)·π) or
Q/((t − t_launch)·B), medians over log-spaced size bins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from dlsim.cost.lookup import GemmRow, MemoryRow

MIN_HALF_FLOPS = 1.0  # W_half must be positive for the profile; 1 FLOP means "no small-kernel penalty"


@dataclass(frozen=True)
class GemmFit:
    peak_flops: float
    efficiency: float
    half_flops: float
    rows: int
    median_abs_rel_error: float


@dataclass(frozen=True)
class MemoryFit:
    efficiency: float
    rows: int
    median_abs_rel_error: float


def relative_line(x: Sequence[float], t: Sequence[float]) -> tuple[float, float]:
    """(a, b) minimising Σ ((t_i − a·x_i − b)/t_i)²."""
    u = [xi / ti for xi, ti in zip(x, t)]
    v = [1.0 / ti for ti in t]
    suu, suv, svv = sum(a * a for a in u), sum(a * b for a, b in zip(u, v)), sum(b * b for b in v)
    su, sv = sum(u), sum(v)
    det = suu * svv - suv * suv
    if det == 0:
        raise ValueError("need at least two kernels of different sizes to fit a line")
    return (su * svv - sv * suv) / det, (sv * suu - su * suv) / det


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def fit_gemm(rows: Iterable[GemmRow], dtype: str, launch_s: float,
             extra: Sequence[tuple[float, float]] = ()) -> GemmFit | None:
    """Roofline compute parameters for `dtype` from single (count 1) GEMM rows and `extra` (FLOPs,
    seconds) points of other matrix-class kernels (convolutions); None with < 2 different sizes."""
    pts = [(2.0 * r.m * r.n * r.k, r.time_s) for r in rows if r.dtype == dtype and r.count == 1] + list(extra)
    if len({w for w, _ in pts}) < 2:
        return None
    best = max(w / t for w, t in pts)
    a, b = relative_line([w for w, _ in pts], [t for _, t in pts])
    peak = max(best, 1.0 / a) if a > 0 else best
    efficiency = 1.0 / (peak * a) if a > 0 else 1.0
    half = max((b - launch_s) / a, MIN_HALF_FLOPS) if a > 0 else MIN_HALF_FLOPS
    err = [abs(w / (peak * efficiency * w / (w + half)) + launch_s - t) / t for w, t in pts]
    return GemmFit(peak, efficiency, half, len(pts), _median(err))


def fit_memory(rows: Iterable[MemoryRow], bandwidth: float, launch_s: float) -> MemoryFit | None:
    """The attainable fraction of `bandwidth` for memory-bound kernels; None with < 2 sizes."""
    pts = [(r.bytes, r.time_s) for r in rows if r.bytes > 0]
    if len({q for q, _ in pts}) < 2:
        return None
    c, _ = relative_line([q for q, _ in pts], [t for _, t in pts])
    efficiency = min(1.0, 1.0 / (bandwidth * c)) if c > 0 else 1.0
    err = [abs(q / (bandwidth * efficiency) + launch_s - t) / t for q, t in pts]
    return MemoryFit(efficiency, len(pts), _median(err))


def efficiency_curve(points: Iterable[tuple[float, float]], peak: float, launch_s: float,
                     bins: int = 8) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """(sizes, efficiencies) from (size, seconds) measurements of kernels whose peak rate is `peak`
    (FLOP/s or bytes/s): per log-spaced size bin the median size and the median attained fraction
    (t − t_launch)·peak ≤ size, kept in (0, 1]; None with fewer than two bins filled."""
    pts = sorted((w, min(1.0, w / (max(t - launch_s, t * 1e-3) * peak))) for w, t in points if w > 0 and t > 0)
    if len(pts) < 2:
        return None
    low, high = math.log(pts[0][0]), math.log(pts[-1][0])
    width = (high - low) / bins or 1.0
    grouped: dict[int, list[tuple[float, float]]] = {}
    for w, e in pts:
        grouped.setdefault(min(int((math.log(w) - low) / width), bins - 1), []).append((w, e))
    sizes, values = [], []
    for k in sorted(grouped):
        sizes.append(_median([w for w, _ in grouped[k]]))
        values.append(max(_median([e for _, e in grouped[k]]), 1e-6))
    if len(sizes) < 2 or any(b <= a for a, b in zip(sizes, sizes[1:])):
        return None
    return tuple(sizes), tuple(values)
