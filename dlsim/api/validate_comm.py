"""`validate_comm()`: measured allreduce times (from `dlsim calibrate comm`) against dlsim's predictions.

The prediction uses only the calibrated profile: its link tier (L, o, g, bandwidth fitted from
ping-pong and PRTT) and γ (1 / reduce bandwidth), priced by `dlsim.cost.collectives.collective_time`
for each forced Open MPI algorithm (`comm_plan.OPENMPI_ALLREDUCE` says which label is which). The
record holds, per algorithm and size, measured, predicted and the relative error
(predicted − measured) / measured; the median error over sizes ≥ `min_bytes`; the order of the
algorithms per size; and the crossover sizes, measured (log-log interpolation between measured
sizes) and predicted (bisection on the closed forms).
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path
from typing import Any, Sequence

from dlsim.calibrate.comm_measure import COLLECTIVE_TABLE
from dlsim.calibrate.comm_plan import OPENMPI_ALLREDUCE
from dlsim.cost.collectives import collective_time
from dlsim.errors import SpecError
from dlsim.io.profile_yaml import load_profile
from dlsim.units import MIB


def _rows(profile: Path, backend: str, hosts: str | None) -> list[dict[str, str]]:
    path = profile / COLLECTIVE_TABLE
    if not path.exists():
        raise SpecError("no measured collective table; run dlsim calibrate comm first", path=path)
    with open(path) as handle:
        return [r for r in csv.DictReader(handle) if r["collective"] == "allreduce" and r["backend"] == backend
                and (hosts is None or r["hosts"] == hosts)]


def _crossing(sizes: Sequence[float], a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Sizes where a − b changes sign, log-log interpolated between neighbouring sizes."""
    out = []
    for i in range(len(sizes) - 1):
        d0, d1 = math.log(a[i] / b[i]), math.log(a[i + 1] / b[i + 1])
        if d0 == 0 or d0 * d1 < 0:
            f = d0 / (d0 - d1) if d0 != d1 else 0.0
            out.append(math.exp(math.log(sizes[i]) + f * (math.log(sizes[i + 1]) - math.log(sizes[i]))))
    return out


def _predicted_crossing(f, g, lo: float, hi: float) -> list[float]:
    """Crossovers of two predicted curves between lo and hi (bisection in log size on a ×2 grid)."""
    grid = [lo * 2 ** k for k in range(int(math.log2(hi / lo)) + 1)]
    out = []
    for x0, x1 in zip(grid, grid[1:]):
        s0, s1 = f(x0) - g(x0), f(x1) - g(x1)
        if s0 * s1 < 0:
            a, b = math.log(x0), math.log(x1)
            for _ in range(60):
                m = (a + b) / 2
                if (f(math.exp(m)) - g(math.exp(m))) * s0 > 0:
                    a = m
                else:
                    b = m
            out.append(math.exp((a + b) / 2))
    return out


def validate_comm(profile: str | Path, *, backend: str = "mpi", hosts: str | None = None, ranks: int = 4,
                  min_bytes: float = MIB, model: str = "auto", tie: float = 0.02, title: str = "") -> dict[str, Any]:
    """Compare the forced-algorithm allreduce rows of `profile` with predictions (module docstring)."""
    folder = Path(profile)
    cluster = load_profile(folder)
    link = cluster.inter or cluster.intra
    gamma = 1.0 / cluster.reduce_bandwidth if cluster.reduce_bandwidth > 0 else None
    rows = [r for r in _rows(folder, backend, hosts) if int(r["ranks"]) == ranks]
    out: dict[str, list[dict[str, Any]]] = {}
    for name in OPENMPI_ALLREDUCE:
        pts = sorted((int(r["size_bytes"]), float(r["median_s"]), float(r["min_s"]), float(r["max_s"]))
                     for r in rows if r["algorithm"] == name)
        if not pts:
            continue
        out[name] = []
        for size, med, lo, hi in pts:
            pred = collective_time("allreduce", name, size, ranks, link, gamma=gamma, model=model).seconds
            out[name].append({"size_bytes": size, "measured_s": med, "min_s": lo, "max_s": hi, "predicted_s": pred,
                              "relative_error": (pred - med) / med})
    if not out:
        raise SpecError(f"no forced-algorithm allreduce rows for backend {backend} at {ranks} ranks", path=folder)
    medians = {n: statistics.median([abs(r["relative_error"]) for r in rs if r["size_bytes"] >= min_bytes] or [math.nan])
               for n, rs in out.items()}
    common = sorted(set.intersection(*[{r["size_bytes"] for r in rs} for rs in out.values()]))
    at = {n: {r["size_bytes"]: r for r in rs} for n, rs in out.items()}
    order = []
    for s in common:
        m = sorted(out, key=lambda n: at[n][s]["measured_s"])
        p = sorted(out, key=lambda n: at[n][s]["predicted_s"])
        # pairs closer than `tie` (relative) in the measurement or the prediction are ties: their
        # order is decided by noise (ring and Rabenseifner differ by 2α only at 4 ranks)
        swapped = []
        for i, a in enumerate(m):
            for b in m[i + 1:]:
                ma, mb = at[a][s]["measured_s"], at[b][s]["measured_s"]
                pa, pb = at[a][s]["predicted_s"], at[b][s]["predicted_s"]
                if pa > pb and (mb - ma) > tie * ma and (pa - pb) > tie * pb:
                    swapped.append([a, b])
        order.append({"size_bytes": s, "measured": m, "predicted": p, "same": m == p,
                      "same_up_to_ties": not swapped, "swapped": swapped})
    names = list(out)
    crossovers = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            meas = _crossing(common, [at[a][s]["measured_s"] for s in common], [at[b][s]["measured_s"] for s in common])
            fa = lambda x, n=a: collective_time("allreduce", n, x, ranks, link, gamma=gamma, model=model).seconds  # noqa: E731
            fb = lambda x, n=b: collective_time("allreduce", n, x, ranks, link, gamma=gamma, model=model).seconds  # noqa: E731
            pred = _predicted_crossing(fa, fb, 1.0, common[-1]) if common else []
            ratio = pred[0] / meas[0] if len(meas) == 1 and len(pred) == 1 else None
            crossovers.append({"pair": [a, b], "measured_bytes": meas, "predicted_bytes": pred,
                               "predicted_over_measured": ratio,
                               "within_factor_2": None if ratio is None else 0.5 <= ratio <= 2.0})
    return {"kind": "comm-validation", "profile": str(folder), "backend": backend, "ranks": ranks,
            "min_bytes_for_median": min_bytes, "model": model,
            "link": {"latency_s": link.latency, "overhead_s": link.overhead, "gap_s": link.gap,
                     "bandwidth_bytes_per_s": link.bandwidth}, "gamma_s_per_byte": gamma,
            "openmpi_settings": OPENMPI_ALLREDUCE, "algorithms": out, "median_abs_relative_error": medians,
            "tie_tolerance": tie, "order": order, "crossovers": crossovers, "title": title or f"allreduce on {ranks} ranks: measured vs predicted"}
