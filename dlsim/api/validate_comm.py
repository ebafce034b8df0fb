"""`validate_comm()`: measured allreduce times (from `dlsim calibrate comm`) against dlsim's predictions.

The prediction uses only the calibrated profile and its measured point-to-point table: each message
of a collective is priced either by the fitted link tier (`p2p="fit"`, the default: L, o, g,
bandwidth from ping-pong and PRTT) or by the measured ping-pong curve (`p2p="table"`:
`dlsim.cost.p2p.table_model` of the profile's comm_p2p.csv ping-pong rows, one-way = RTT/2), plus γ
(1 / reduce bandwidth), through `dlsim.cost.collectives.collective_time` for each forced Open MPI
algorithm (`comm_plan.OPENMPI_ALLREDUCE` maps its label to the dlsim algorithm that models it).
No factor is tuned to the collective measurements. The record holds, per algorithm and size,
measured, predicted by both p2p models and the relative error (predicted − measured) / measured of
the chosen one; the median error over sizes ≥ `min_bytes`; the order of the algorithms per size;
and the crossover sizes, measured (interpolated in log size on log time between neighbouring
measured sizes) and predicted (bisection in log size on the closed forms), with the pairs that
stay within the tie tolerance of each other over a whole range reported as ties.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dlsim.calibrate.comm_measure import COLLECTIVE_TABLE, P2P_TABLE, REPS_FILE
from dlsim.calibrate.comm_plan import OPENMPI_ALLREDUCE
from dlsim.cost.collectives import collective_time
from dlsim.cost.p2p import PointToPoint, table_model
from dlsim.errors import SpecError
from dlsim.io.profile_yaml import load_profile
from dlsim.units import MIB


def _measured(path: Path, what: str, column: str, value: str, backend: str,
              hosts: str | None) -> list[dict[str, str]]:
    """Rows of a `dlsim calibrate comm` table whose `column` is `value`, for `backend` (and `hosts`)."""
    if not path.exists():
        raise SpecError(f"no measured {what} table; run dlsim calibrate comm first", path=path)
    with open(path) as handle:
        return [r for r in csv.DictReader(handle) if r[column] == value and r["backend"] == backend
                and (hosts is None or r["hosts"] == hosts)]


def _rows(profile: Path, backend: str, hosts: str | None) -> list[dict[str, str]]:
    rows = _measured(profile / COLLECTIVE_TABLE, "collective", "collective", "allreduce", backend, hosts)
    return [{**r, "measured_in": str(profile)} for r in rows]


def _reps(profile: Path, backend: str) -> dict[tuple[str, int, int], list[float]]:
    """Every repetition of each allreduce point (`comm_measure.REPS_FILE`), if the run kept them."""
    path = profile / REPS_FILE
    out: dict[tuple[str, int, int], list[float]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                if r["collective"] == "allreduce" and r["backend"] == backend:
                    out[(r["algorithm"], int(r["ranks"]), int(r["size_bytes"]))] = [float(v) for v in r["values_s"]]
    return out


def _merged_rows(folder: Path, remeasured: Sequence[Path], backend: str, hosts: str | None,
                 ranks: int) -> list[dict[str, Any]]:
    """The profile's rows, each (algorithm, size) replaced by the last re-measurement that has it;
    with the spread of the repetitions: IQR when they were kept, else min-max."""
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    for where in (folder, *remeasured):
        reps = _reps(where, backend)
        for r in _rows(where, backend, hosts):
            if int(r["ranks"]) != ranks:
                continue
            size = int(r["size_bytes"])
            values = reps.get((r["algorithm"], ranks, size))
            if values:
                q1, q3 = (float(x) for x in np.percentile(values, [25, 75]))
                spread = {"lo_s": q1, "hi_s": q3, "interval": "IQR", "reps": len(values)}
            else:
                spread = {"lo_s": float(r["min_s"]), "hi_s": float(r["max_s"]), "interval": "min-max",
                          "reps": int(r["reps"])}
            merged[(r["algorithm"], size)] = {**r, **spread}
    return list(merged.values())


def resolved_order(measured: dict[str, dict[str, Any]], predicted: dict[str, float]) -> list[list[str]]:
    """Pairs whose measured intervals [lo, hi] do not overlap (the data orders them) and whose
    predicted order is the opposite one. Overlapping intervals are a tie: any predicted order agrees."""
    names = sorted(measured, key=lambda n: measured[n]["measured_s"])
    bad = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if measured[a]["hi_s"] < measured[b]["lo_s"] and predicted[a] > predicted[b]:
                bad.append([a, b])
    return bad


def pingpong_table(profile: Path, backend: str, hosts: str | None) -> PointToPoint:
    """The `table` p2p model of the profile's ping-pong rows (one-way = median RTT / 2, as measured)."""
    path = profile / P2P_TABLE
    rows = _measured(path, "point-to-point", "kind", "pingpong", backend, hosts)
    if len({r["hosts"] for r in rows}) > 1:
        raise SpecError("ping-pong rows from several host sets; give hosts", path=path)
    points = {int(r["size_bytes"]): float(r["median_s"]) for r in rows}
    return table_model(list(points), list(points.values()), name=f"{backend} ping-pong")


def _crossing(sizes: Sequence[float], a: Sequence[float], b: Sequence[float], tie: float) -> list[dict[str, Any]]:
    """Sizes where a − b changes sign: log a/b interpolated linearly in log size between neighbouring
    sizes. A crossing is a tie when a and b differ by less than `tie` (relative) at both neighbours:
    the measurements cannot tell which is faster there."""
    out = []
    for i in range(len(sizes) - 1):
        d0, d1 = math.log(a[i] / b[i]), math.log(a[i + 1] / b[i + 1])
        if d0 == 0 or d0 * d1 < 0:
            f = d0 / (d0 - d1) if d0 != d1 else 0.0
            x = math.exp(math.log(sizes[i]) + f * (math.log(sizes[i + 1]) - math.log(sizes[i])))
            out.append({"bytes": x, "tie": abs(d0) < math.log1p(tie) and abs(d1) < math.log1p(tie)})
    return out


def _predicted_crossing(f, g, lo: float, hi: float) -> list[float]:
    """Crossovers of two predicted curves between lo and hi (bisection in log size on a ×√2 grid)."""
    steps = int(math.ceil(2 * math.log2(hi / lo)))
    grid = [lo * (hi / lo) ** (k / steps) for k in range(steps + 1)]
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
                  min_bytes: float = MIB, model: str = "auto", p2p: str = "fit", tie: float = 0.02,
                  title: str = "", remeasured: Sequence[str | Path] = ()) -> dict[str, Any]:
    """Compare the forced-algorithm allreduce rows of `profile` with predictions (module docstring).

    `p2p`: "fit" (messages priced by the fitted link) or "table" (by the measured ping-pong curve);
    `model` is the p2p model of "fit". `tie`: relative difference below which two algorithms are
    not ordered (the measurement noise at small sizes, stated in the record). `remeasured`: profile
    directories of later runs of the same method on the same cluster whose points replace the
    profile's at the same (algorithm, size); predictions always come from `profile`. The order is
    also checked with the data's own resolution (`resolved_order`: IQR of the kept repetitions,
    else min-max).
    """
    if p2p not in ("table", "fit"):
        raise SpecError(f"unknown p2p pricing {p2p!r} (use table or fit)", field="p2p")
    folder = Path(profile)
    cluster = load_profile(folder)
    link = cluster.inter or cluster.intra
    gamma = 1.0 / cluster.reduce_bandwidth if cluster.reduce_bandwidth > 0 else None
    rows = _merged_rows(folder, [Path(x) for x in remeasured], backend, hosts, ranks)
    hosts = hosts or (rows[0]["hosts"] if rows else None)
    table = pingpong_table(folder, backend, hosts)
    models = {"table": table, "fit": model}

    def predict(name: str, size: float, how: str) -> float:
        return collective_time("allreduce", name, size, ranks, link, gamma=gamma, model=models[how]).seconds

    out: dict[str, list[dict[str, Any]]] = {}
    for name in OPENMPI_ALLREDUCE:
        pts = sorted(((int(r["size_bytes"]), r) for r in rows if r["algorithm"] == name), key=lambda x: x[0])
        if not pts:
            continue
        out[name] = []
        for size, r in pts:
            med = float(r["median_s"])
            pred = {how: predict(name, size, how) for how in models}
            out[name].append({"size_bytes": size, "measured_s": med, "min_s": float(r["min_s"]),
                              "max_s": float(r["max_s"]), "lo_s": r["lo_s"], "hi_s": r["hi_s"],
                              "interval": r["interval"], "reps": r["reps"], "measured_in": r["measured_in"],
                              "predicted_s": pred[p2p], "predicted_table_s": pred["table"],
                              "predicted_fit_s": pred["fit"], "relative_error": (pred[p2p] - med) / med,
                              "relative_error_fit": (pred["fit"] - med) / med,
                              "relative_error_table": (pred["table"] - med) / med})
    if not out:
        raise SpecError(f"no forced-algorithm allreduce rows for backend {backend} at {ranks} ranks", path=folder)

    def median_error(key: str) -> dict[str, float]:
        return {n: statistics.median([abs(r[key]) for r in rs if r["size_bytes"] >= min_bytes] or [math.nan])
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
        conflicts = resolved_order({n: at[n][s] for n in out}, {n: at[n][s]["predicted_s"] for n in out})
        order.append({"size_bytes": s, "measured": m, "predicted": p, "same": m == p,
                      "same_up_to_ties": not swapped, "swapped": swapped,
                      "same_where_resolved": not conflicts, "resolved_conflicts": conflicts})
    names = list(out)
    crossovers = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            meas = _crossing(common, [at[a][s]["measured_s"] for s in common],
                             [at[b][s]["measured_s"] for s in common], tie)
            pred = _predicted_crossing(lambda x, n=a: predict(n, x, p2p), lambda x, n=b: predict(n, x, p2p),
                                       1.0, common[-1]) if len(common) > 1 else []
            real = [c["bytes"] for c in meas if not c["tie"]]
            ratio = pred[0] / real[0] if len(real) == 1 and len(pred) == 1 else None
            first = [c["bytes"] for c in meas]
            first_ratio = pred[0] / first[0] if first and pred else None
            crossovers.append({"pair": [a, b], "measured_bytes": [c["bytes"] for c in meas],
                               "measured_ties": [c["tie"] for c in meas], "predicted_bytes": pred,
                               "measured_crossings": len(meas), "measured_crossings_beyond_ties": len(real),
                               "predicted_over_measured": ratio,
                               "within_factor_2": None if ratio is None else 0.5 <= ratio <= 2.0,
                               "predicted_over_first_measured": first_ratio,
                               "first_within_factor_2": None if first_ratio is None else 0.5 <= first_ratio <= 2.0})
    return {"kind": "comm-validation", "profile": str(folder), "backend": backend, "hosts": hosts, "ranks": ranks,
            "min_bytes_for_median": min_bytes, "model": model, "p2p": p2p,
            "p2p_table": {"sizes_bytes": list(table.table_sizes), "one_way_s": list(table.table_times)},
            "link": {"latency_s": link.latency, "overhead_s": link.overhead, "gap_s": link.gap,
                     "bandwidth_bytes_per_s": link.bandwidth, "burst_bytes": link.burst,
                     "peak_bandwidth_bytes_per_s": link.peak_bandwidth}, "gamma_s_per_byte": gamma,
            "remeasured": [str(x) for x in remeasured],
            "openmpi_settings": OPENMPI_ALLREDUCE, "algorithms": out,
            "median_abs_relative_error": median_error("relative_error"),
            "median_abs_relative_error_table": median_error("relative_error_table"),
            "median_abs_relative_error_fit": median_error("relative_error_fit"),
            "tie_tolerance": tie, "order": order, "crossovers": crossovers,
            "title": title or f"allreduce on {ranks} ranks: measured vs predicted"}
