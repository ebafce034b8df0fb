"""Do a profile's tables still hold on this machine? A few table entries re-timed against a tolerance.

`pick_gemms` chooses `count` single GEMMs of the profile's grid whose recorded time lies between
`min_s` and `max_s` (long enough that the clock and Python do not matter, short enough to re-time
in a fraction of a second), spread evenly over their FLOP range. Each is re-timed exactly as the
calibration timed it (meta.yaml ``timing``: cache flush, statistic, repeats); the stream kernel of
``device.csv`` is re-timed too. `verdict` compares fresh / recorded per entry:

    the tables hold  ⇔  median |fresh / recorded − 1| ≤ `median_tol`  and  max |fresh / recorded − 1| ≤ `max_tol`

The default tolerances (10% median, 25% worst) sit above the repeatability of flushed GEMM
timings on the project's shared 2-core machine, whose re-timed table entries scatter by a few per
cent (`reports/archive/validation-cpu/gemm_noise_probe.py`), and below the error a stale profile causes (a
profile from another host of the same CPU family mispredicted a ResNet-18 step by +66%, issue 15).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

MEDIAN_TOL = 0.10
MAX_TOL = 0.25


def pick_gemms(rows: Sequence[Any], count: int = 8, min_s: float = 1e-3, max_s: float = 3e-2,
               dtype: str = "fp32") -> list[Any]:
    """`count` grid GEMM rows (single, `dtype`, time in [min_s, max_s]) spread evenly in log FLOPs."""
    usable = sorted((r for r in rows if r.dtype == dtype and r.count == 1 and r.set == "grid"
                     and min_s <= r.time_s <= max_s), key=lambda r: (r.m * r.n * r.k, r.m, r.n, r.k))
    if len(usable) <= count:
        return usable
    lo, hi = math.log(usable[0].m * usable[0].n * usable[0].k), math.log(usable[-1].m * usable[-1].n * usable[-1].k)
    chosen: list[Any] = []
    for i in range(count):
        target = lo + (hi - lo) * i / max(count - 1, 1)
        best = min((r for r in usable if r not in chosen), key=lambda r: abs(math.log(r.m * r.n * r.k) - target))
        chosen.append(best)
    return chosen


@dataclass(frozen=True)
class Verdict:
    hold: bool
    median_abs: float
    max_abs: float
    mean_ratio: float
    median_tol: float
    max_tol: float

    def line(self) -> str:
        state = "still hold" if self.hold else "no longer hold"
        return (f"the tables {state}: re-timed entries differ by median {100 * self.median_abs:.1f}% "
                f"(tolerance {100 * self.median_tol:.0f}%), worst {100 * self.max_abs:.1f}% "
                f"(tolerance {100 * self.max_tol:.0f}%); this machine is now {self.mean_ratio:.2f}x the recorded "
                f"time on average")


def verdict(ratios: Sequence[float], median_tol: float = MEDIAN_TOL, max_tol: float = MAX_TOL) -> Verdict:
    """Whether fresh / recorded time `ratios` are within the tolerances (see the module docstring)."""
    if not ratios:
        raise ValueError("no entries to compare")
    dev = [abs(r - 1.0) for r in ratios]
    med, worst = statistics.median(dev), max(dev)
    mean = math.exp(statistics.fmean(math.log(r) for r in ratios))
    return Verdict(med <= median_tol and worst <= max_tol, med, worst, mean, median_tol, max_tol)
