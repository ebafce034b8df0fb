"""Running a communication calibration: the launches, then the fits from the measured tables.

One launch measures the point-to-point tables (ping-pong, PRTT, reduction speed) and every
collective with the library's own algorithm choice ("default"); for MPI one more launch per forced
allreduce algorithm (Open MPI coll/tuned settings in `comm_plan.OPENMPI_ALLREDUCE`) measures
allreduce only. Every launch resumes: points already in the tables are skipped.
"""

from __future__ import annotations

import csv
import platform
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from dlsim.calibrate.comm_fit import (fit_alpha_beta, fit_burst, fit_gamma, fit_hockney, fit_loggp, fit_piecewise,
                                       link_parameters)
from dlsim.calibrate.comm_launch import Hosts, run_gloo, run_mpi
from dlsim.calibrate.comm_measure import P2P_TABLE, check_idle_gap
from dlsim.calibrate.comm_plan import OPENMPI_ALLREDUCE, CommPlan
from dlsim.errors import SpecError

# Open MPI spins while it waits; with more ranks than cores a spinning rank keeps the kernel's
# network softirq thread off the CPU for a whole tick (4 ms here). Yielding fixes it.
# Every message up to 32 MiB is sent eagerly: with the TCP BTL's default 64 KiB eager limit a large
# message first waits for a clear-to-send reply, and on a loaded link that reply queues behind the
# receiver's own outgoing data (head-of-line blocking in the NIC queue), an effect the alpha-beta and
# LogGP models do not have (measured on the emulated cluster: ring allreduce 1.38x -> 1.09x).
MPI_BASE_MCA = {"mpi_yield_when_idle": "1", "btl_tcp_eager_limit": "33554432", "btl_tcp_rndv_eager_limit": "33554432", "btl_tcp_max_send_size": "33554432"}


@dataclass(frozen=True)
class Launch:
    label: str
    mca: dict
    plan: CommPlan


def launches(plan: CommPlan, algorithms: Sequence[str]) -> list[Launch]:
    """The default launch, then one per forced allreduce algorithm (MPI only)."""
    out = [Launch("default", dict(MPI_BASE_MCA), plan)]
    if plan.backend != "mpi" and algorithms:
        raise SpecError(f"forcing allreduce algorithms needs --backend mpi (got {plan.backend})", field="algorithms")
    for name in algorithms:
        if name not in OPENMPI_ALLREDUCE:
            raise SpecError(f"no Open MPI setting forces {name!r} (use {', '.join(OPENMPI_ALLREDUCE)})",
                            field="algorithms")
        settings = {"coll_tuned_use_dynamic_rules": "1", **OPENMPI_ALLREDUCE[name]}
        forced = replace(plan, algorithm=name, setting=";".join(f"{k}={v}" for k, v in settings.items()),
                         point_to_point=False, collectives=("allreduce",))
        out.append(Launch(name, {**MPI_BASE_MCA, **settings}, forced))
    return out


def run_launches(items: Sequence[Launch], ranks: int, hosts: Hosts, out: Path, *, quiet: bool = False,
                 timeout: float | None = None) -> list[dict[str, Any]]:
    """Run every launch in order; returns one summary per launch. Refuses (before starting any) to
    add collectives measured with one idle gap to a table holding another (`check_idle_gap`)."""
    for item in items:
        check_idle_gap(out, item.plan.backend, item.plan.hosts, item.plan.idle_gap_s)
    done = []
    for item in items:
        plan_path = out / f".plan-{item.plan.backend}-{item.label}.json"
        plan_path.write_text(item.plan.to_json())
        start = time.perf_counter()
        if item.plan.backend == "mpi":
            run_mpi(plan_path, ranks, hosts, item.mca, quiet=quiet, timeout=timeout)
        else:
            run_gloo(plan_path, ranks, hosts, quiet=quiet, timeout=timeout)
        plan_path.unlink(missing_ok=True)
        done.append({"launch": item.label, "mca": item.mca, "seconds": round(time.perf_counter() - start, 1),
                     "idle_gap_s": item.plan.idle_gap_s})
    return done


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path) as handle:
        return list(csv.DictReader(handle))


def fit_tables(out: Path, backend: str, hosts: str) -> dict[str, Any]:
    """All fits for one backend and host set, from the tables in `out`."""
    rows = [r for r in read_rows(out / P2P_TABLE) if r["backend"] == backend and r["hosts"] == hosts]

    def medians(kind: str) -> dict[float, float]:
        return {float(r["size_bytes"]): float(r["median_s"]) for r in rows if r["kind"] == kind}
    ping = medians("pingpong")
    if len(ping) < 2:
        raise SpecError(f"{out / P2P_TABLE}: fewer than two ping-pong sizes for {backend} on {hosts}; nothing to fit")
    sizes, times = zip(*sorted(ping.items()))
    hockney = fit_hockney(sizes, times)
    result: dict[str, Any] = {"hockney": asdict(hockney), "relative_least_squares": asdict(fit_alpha_beta(sizes, times)),
                              "piecewise": [asdict(p) for p in fit_piecewise(sizes, times)]}
    loggp = None
    n = max((int(r["messages"]) for r in rows if r["kind"] == "prttn"), default=0)
    if n > 1:
        delays = {float(r["size_bytes"]): float(r["delay_s"]) for r in rows if r["kind"] == "prttd"}
        try:
            loggp = fit_loggp(medians("prtt1"), medians("prttn"), medians("prttd"), delays, n)
            result["loggp_netgauge"] = asdict(loggp)
        except ValueError as exc:
            result["loggp_netgauge"] = {"error": str(exc)}
    link = link_parameters(hockney, loggp)
    result["link"] = asdict(link)
    burst = fit_burst(sizes, times, hockney.alpha, hockney.beta)
    if burst is not None:
        result["burst"] = asdict(burst)
    red = medians("reduce")
    if red:
        rs, rt = zip(*sorted(red.items()))
        result["gamma_s_per_byte"] = fit_gamma(rs, rt)
        result["stream_add_bytes_per_s"] = 3 * rs[-1] / rt[-1]
    return result


def system_info(backend: str) -> dict[str, Any]:
    """Versions and machine for meta.yaml."""
    info: dict[str, Any] = {"python": platform.python_version(), "os": platform.platform(),
                            "machine": platform.machine(), "cpu": _cpu_name(), "logical_cpus": _cpus()}
    if backend == "mpi" and shutil.which("mpirun"):
        try:
            text = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=20).stdout
            info["mpi"] = text.splitlines()[0].strip() if text else "unknown"
        except (OSError, subprocess.TimeoutExpired):
            info["mpi"] = "unknown"
        try:
            import mpi4py
            info["mpi4py"] = mpi4py.__version__
        except ImportError:
            pass
    if backend in ("gloo", "nccl"):
        try:
            import torch
            info["torch"] = str(torch.__version__)
        except ImportError:
            pass
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _cpus() -> int:
    import os
    return os.cpu_count() or 1


def quick_gemm_flops(n: int = 1024, reps: int = 5) -> float:
    """FLOP/s of a NumPy float32 n×n matmul (best of `reps`): the device line of a new comm-only profile."""
    import numpy as np
    a = np.ones((n, n), dtype=np.float32)
    a @ a
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    return 2.0 * n ** 3 / best
