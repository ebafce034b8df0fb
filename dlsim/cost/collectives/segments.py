"""Choosing the segment count k of pipelined algorithms (chain, double binary tree).

A pipelined algorithm of k segments takes about (A·k + B) steps of one segment of n/k bytes (or
n/(2k) for the double binary tree). With a step price close to a + b·s this is
A·k·a + (A/k_div)·n·b + B·a + B·b·n/(k·k_div), minimised at k* = sqrt(B·b·n / (A·a·k_div)) — the
`sqrt((p−2)nβ/α)` of the pipelined chain in `reference/algorithms.md` §3.1. dlsim rounds k* to the
neighbour with the smaller exact closed-form time, within [1, max_segments] and at most n segments
(segments of at least one byte). A user-given k is used as is.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from dlsim.errors import SpecError

MAX_SEGMENTS = 1024


def linear_fit(step_price: Callable, n):
    """(a, b) of the straight line through the step price at n/2 and n (exact for α-β and LogGP)."""
    if np.ndim(n) == 0:  # one size: the same operations on numpy scalars
        n = np.float64(n)
        half, full = step_price(n / 2), step_price(n)
        return np.float64(2 * half - full), np.float64((full - half) * 2 / n if n > 0 else 0.0)
    n = np.asarray(n, dtype=float)
    half, full = step_price(n / 2), step_price(n)
    b = np.where(n > 0, (full - half) * 2 / np.where(n > 0, n, 1.0), 0.0)
    return 2 * half - full, b


def choose_segments(time_of_k: Callable, k_star, n, max_segments: int = MAX_SEGMENTS):
    """The better of ⌊k*⌋ and ⌈k*⌉ by `time_of_k`, clipped to [1, min(max_segments, n)]."""
    if np.ndim(k_star) == 0 and np.ndim(n) == 0:  # one size: the same rule on scalars
        upper = max(min(float(max_segments), math.floor(float(n))), 1.0)
        k = float(k_star)
        k = min(1.0 if math.isnan(k) or k < 1.0 else k, upper)  # upper is whole: ⌊k⌋, ⌈k⌉ clip alike
        lo, hi = float(math.floor(k)), float(math.ceil(k))
        return int(hi if time_of_k(np.float64(hi)) < time_of_k(np.float64(lo)) else lo)
    upper = np.maximum(np.minimum(float(max_segments), np.floor(np.asarray(n, dtype=float))), 1.0)
    k_star = np.nan_to_num(np.asarray(k_star, dtype=float), nan=1.0, posinf=float(max_segments))
    lo = np.clip(np.floor(k_star), 1.0, upper)
    hi = np.clip(np.ceil(k_star), 1.0, upper)
    best = np.where(time_of_k(hi) < time_of_k(lo), hi, lo)
    return int(best) if best.ndim == 0 else best.astype(np.int64)


def continuous_optimum(A, B, a, b, n, divisor: float = 1.0):
    """k* = sqrt(B·b·n / (A·a·divisor)); infinite when a = 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(np.maximum(B, 0) * b * n / (A * a * divisor))


def check_segments(segments: int | None) -> int | None:
    if segments is None:
        return None
    if isinstance(segments, bool) or not isinstance(segments, (int, np.integer)) or segments < 1:
        raise SpecError(f"segments must be a positive integer, got {segments!r}", field="segments")
    return int(segments)
