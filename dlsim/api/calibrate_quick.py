"""`quick_check()` (``dlsim calibrate compute --quick``): does a measured CPU profile still describe this machine?

In well under 30 s: this host's identity and reference speeds (`dlsim.calibrate.host_probe`)
against the profile's ``host:`` record, and a few table entries re-timed the way the calibration
timed them (each once per pass, in `passes` shuffled passes, the calibration's statistic over the
passes) against a stated tolerance (`dlsim.calibrate.quick_check`). A profile that records no
host and whose tables hold here gets this host recorded (added to meta.yaml; nothing is replaced);
every check is appended to meta.yaml's ``checks``.
"""

from __future__ import annotations

import datetime
import random
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from dlsim.calibrate.compute_run import Backend, device_quantities
from dlsim.calibrate.compute_timer import KernelTimer, cache_flusher, check_device, set_threads, warm_allocator
from dlsim.calibrate.compute_ops import gemm_fn
from dlsim.calibrate.host_probe import compare_hosts, host_identity, host_record, reference_speeds
from dlsim.calibrate.quick_check import MAX_TOL, MEDIAN_TOL, pick_gemms, verdict
from dlsim.cost.layers import Gemm
from dlsim.errors import SpecError
from dlsim.io.files import write_atomic
from dlsim.io.kernel_tables import read_table
from dlsim.io.yamlfile import read_yaml
from dlsim.units import GBYTE_PER_S, GFLOPS


def _device_value(out: Path, quantity: str) -> float | None:
    import csv
    path = out / "device.csv"
    if not path.exists():
        return None
    with open(path) as handle:
        for row in csv.DictReader(handle):
            if row.get("quantity") == quantity:
                return float(row["value"])
    return None


def quick_check(out: str | Path, *, gemms: int = 8, passes: int = 3, median_tol: float = MEDIAN_TOL, max_tol: float = MAX_TOL,
                record_host: bool = True) -> dict[str, Any]:
    """Re-probe the host and re-time a few entries of the profile in `out` (see the module docstring); a record."""
    start = time.perf_counter()
    out = Path(out)
    meta_path = out / "meta.yaml"
    if not meta_path.exists() or not (out / "gemm.csv").exists():
        raise SpecError("has no compute calibration to check (meta.yaml and gemm.csv; run dlsim calibrate compute "
                        "first)", path=out)
    meta = read_yaml(meta_path) or {}
    if (meta.get("device") or {}).get("kind", "cpu") != "cpu":
        raise SpecError("--quick checks CPU profiles only", path=meta_path)
    check_device("cpu")
    timing = meta.get("timing") or {}
    threads = set_threads(int(timing["threads"]) if timing.get("threads") else None)
    warm_allocator()  # the regime the tables were timed in (meta.yaml allocator)
    speeds = reference_speeds(threads)
    identity = host_identity()
    recorded = meta.get("host")
    comparison = compare_hosts(recorded, identity, speeds=lambda _t: speeds) if recorded else None
    statistic = timing.get("statistic", "median")
    timer = KernelTimer("cpu", repeats=int(timing.get("repeats", 5)), statistic=statistic,
                        flush=cache_flusher("cpu") if timing.get("flush_cache", True) else None)
    backend = Backend.create("cpu")
    fns: list[tuple[str, float, Any, float]] = []  # (entry, recorded seconds, function, seconds -> ratio scale)
    for row in pick_gemms(read_table("gemm", out / "gemm.csv"), gemms):
        fns.append((f"gemm {row.m}x{row.n}x{row.k} {row.dtype}", row.time_s,
                    gemm_fn(Gemm(row.m, row.n, row.k), row.dtype, backend.device), 1.0))
    stream_bw = _device_value(out, "stream_bandwidth_bytes_per_s")
    if stream_bw:
        _, amount, _, how, fn = next(q for q in device_quantities(backend, timer)
                                     if q[0] == "stream_bandwidth_bytes_per_s")
        fns.append((f"stream ({how})", amount / stream_bw, fn, 1.0))
    times: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    for p in range(passes):  # every entry once per pass, in a new order: a disturbed second hits one entry once
        random.Random(p).shuffle(order)
        for i in order:
            times[i].append(timer.time(fns[i][2]).seconds)
    pick = min if statistic == "min" else statistics.median
    entries = [{"entry": name, "recorded_s": rec_s, "fresh_s": pick(t), "ratio": pick(t) / rec_s}
               for (name, rec_s, _, _), t in zip(fns, times)]
    if not entries:
        raise SpecError("has no GEMM between 1 ms and 30 ms nor a stream measurement to re-time", path=out / "gemm.csv")
    v = verdict([e["ratio"] for e in entries], median_tol, max_tol)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    host_note = ""
    if recorded is None and record_host and v.hold:
        meta["host"] = {**host_record(threads, lambda _t: speeds), "recorded_by": f"dlsim calibrate compute --quick "
                        f"{date}: the tables held here ({v.line()})"}
        host_note = "this host was recorded in meta.yaml (the profile recorded none and its tables hold here)"
    elif recorded is None:
        host_note = "the profile records no host; none recorded (its tables do not hold here)"
    elif comparison is not None and not comparison.same:
        host_note = comparison.line(out.name, recorded)
    else:
        host_note = "same host as recorded"
    wall = time.perf_counter() - start
    check = {"date": date, "hold": v.hold, "median_abs_deviation": round(v.median_abs, 4),
             "max_abs_deviation": round(v.max_abs, 4), "mean_time_ratio": round(v.mean_ratio, 4),
             "entries": len(entries), "cpu": identity["cpu"], "wall_s": round(wall, 1)}
    meta["checks"] = list(meta.get("checks") or []) + [check]
    write_atomic(meta_path, yaml.safe_dump(meta, sort_keys=False, width=120))
    return {"kind": "calibrate-quick", "out": str(out), "hold": v.hold, "line": v.line(),
            "tolerance": {"median_abs": median_tol, "max_abs": max_tol},
            "median_abs_deviation": v.median_abs, "max_abs_deviation": v.max_abs, "mean_time_ratio": v.mean_ratio,
            "entries": entries, "threads": threads,
            "host": {"current": {**identity, "gemm_gflop_per_s": speeds["gemm_flops_per_s"] / GFLOPS,
                                 "stream_gbyte_per_s": speeds["stream_bytes_per_s"] / GBYTE_PER_S},
                     "recorded": recorded, "same_host": None if comparison is None else comparison.same,
                     "gemm_ratio": None if comparison is None else comparison.gemm_ratio,
                     "stream_ratio": None if comparison is None else comparison.stream_ratio, "note": host_note},
            "wall_s": wall}
