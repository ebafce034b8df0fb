"""Crossover sizes: where one algorithm overtakes another, on model curves or on measured tables."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np


def crossings(sizes: Sequence[float], first: Sequence[float], second: Sequence[float]) -> list[tuple[float, str]]:
    """Sizes where `first` and `second` swap order, interpolated on log size and log time.

    Returns (size, winner above it) with winner "first" or "second", for every sign change of
    log(first / second) between consecutive points (NaN and non-positive points skipped).
    """
    x = np.log(np.asarray(sizes, dtype=float))
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.log(np.asarray(first, dtype=float)) - np.log(np.asarray(second, dtype=float))
    ok = np.isfinite(d) & np.isfinite(x)
    x, d = x[ok], d[ok]
    out = []
    for i in range(len(d) - 1):
        if d[i] == 0 or np.sign(d[i]) == np.sign(d[i + 1]):
            continue
        frac = d[i] / (d[i] - d[i + 1])
        out.append((float(math.exp(x[i] + frac * (x[i + 1] - x[i]))), "first" if d[i + 1] < 0 else "second"))
    return out


def refine(difference: Callable[[float], float], lo: float, hi: float, iterations: int = 60) -> float:
    """Bisection on log size for the zero of `difference` between lo and hi (signs must differ)."""
    a, b = math.log(lo), math.log(hi)
    fa = difference(lo)
    for _ in range(iterations):
        mid = 0.5 * (a + b)
        fm = difference(math.exp(mid))
        if (fm < 0) == (fa < 0):
            a, fa = mid, fm
        else:
            b = mid
    return math.exp(0.5 * (a + b))
