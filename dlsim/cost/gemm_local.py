"""GEMM time between measured shapes by local linear regression in log space (LOESS).

For a query ``(m, n, k)`` the `neighbours` measured single GEMMs nearest to it in
``x = (log m, log n, log k)`` (every measured shape of the data type: the calibration grid, the
off-power-of-two "odd" set, a model's own shapes) are fitted by weighted least squares with

    log t ≈ β0 + β·(x − x_q),   weights w_i = (1 − (d_i / h)^3)^3   (tricube, d_i ≤ h),

h just beyond the farthest of the neighbours, and the estimate is ``t = exp(β0)``: the locally
weighted regression of W. S. Cleveland, "Robust locally weighted regression and smoothing
scatterplots", JASA 74(368), 1979, with the degree-1 multivariate form of Cleveland & Devlin, JASA
83(403), 1988. Since ``log F = log 2 + Σ x`` is linear in x, fitting ``log t`` is the same as
fitting the log throughput (algorithms.md §8.3: interpolate efficiency, not time).

Why beside the grid's multilinear interpolant: a shape off the power-of-two grid runs at an
efficiency the grid's eight corners do not see, and each table row carries its own measurement
noise. The regression averages over `neighbours` rows, off-grid rows included, so a single noisy
corner moves the estimate by about 1/`neighbours` instead of up to all of it. The neighbour count
was chosen by leave-one-out prediction of the calibration's own odd set (the 2-core EPYC profile,
4 shuffled passes: median |error| multilinear 10.4%, 16 neighbours 9.3%, 24: 9.0%, 32: 8.7%);
see reports/validation-cpu.md.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

NEIGHBOURS = 32


def nearest_shapes(points: Iterable[tuple[int, int, int]], m: int, n: int, k: int,
                   count: int) -> list[tuple[int, int, int]]:
    """The `count` shapes of `points` nearest to (m, n, k) in (log m, log n, log k), nearest first
    (the distance the regression's neighbours are chosen by)."""
    q = (math.log(m), math.log(n), math.log(k))
    def distance(p: tuple[int, int, int]) -> float:
        return sum((math.log(a) - b) ** 2 for a, b in zip(p, q))
    return sorted(points, key=distance)[:count]


class LocalGemmModel:
    """Local linear regression of log time over measured (m, n, k) → seconds of one data type."""

    def __init__(self, shapes: Iterable[tuple[int, int, int, float]], neighbours: int = NEIGHBOURS):
        rows = [(m, n, k, t) for m, n, k, t in shapes if t > 0]
        self.neighbours = min(neighbours, len(rows))
        self._x = np.log(np.array([r[:3] for r in rows], dtype=float)).reshape(-1, 3)
        self._y = np.log(np.array([r[3] for r in rows], dtype=float))
        self._cache: dict[tuple[int, int, int], tuple[float, float]] = {}

    def __len__(self) -> int:
        return len(self._y)

    def seconds(self, m: int, n: int, k: int) -> tuple[float, float]:
        """(estimated seconds, log-space distance to the farthest neighbour used)."""
        key = (m, n, k)
        if key not in self._cache:
            self._cache[key] = self._fit(m, n, k)
        return self._cache[key]

    def _fit(self, m: int, n: int, k: int) -> tuple[float, float]:
        q = np.log(np.array([m, n, k], dtype=float))
        d = np.sqrt(((self._x - q) ** 2).sum(axis=1))
        count = self.neighbours
        idx = np.argpartition(d, count - 1)[:count] if count < len(d) else np.arange(len(d))
        dist = d[idx]
        h = float(dist.max()) * 1.0001 + 1e-12
        w = np.sqrt((1.0 - (dist / h) ** 3) ** 3)
        design = np.column_stack([np.ones(len(idx)), self._x[idx] - q])
        if len(idx) < 4 or np.linalg.matrix_rank(design * w[:, None]) < 4:
            design = design[:, :1]  # too few or collinear neighbours: a weighted mean of log t
        coef, *_ = np.linalg.lstsq(design * w[:, None], self._y[idx] * w, rcond=None)
        return math.exp(float(coef[0])), float(dist.max())
