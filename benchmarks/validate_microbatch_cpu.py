"""μ-cuDNN on real kernels, CPU: check and calibrate NumPy convolutions, plan WR and WD, execute the plans, measure.

Network: AlexNet's five convolutions (the single-tower variant of Krizhevsky, "One weird trick for
parallelizing convolutional neural networks", arXiv:1404.5997, as torchvision builds it: 64, 192, 384,
256, 256 channels; 224x224 input), all three passes, fp32, one BLAS thread (steadier on a shared
machine).

Each attempt N is an independent replication of the whole experiment, run back to back so that the
table and the execution see the same machine (a cloud VM whose speed drifts by several percent over
minutes; see the report):

* ``check``: every algorithm on every layer shape (batch 2) against NumPy direct and against PyTorch
  (fp64) for all three passes (`dlsim.calibrate.conv_check`) → ``microbatch-cpu-check.json``.
* ``calibrate``: direct, im2col, FFT and Winograd per layer, pass and micro-batch size (policy
  powerOfTwo) into a resumable CSV ``microbatch-cpu-runs/table-N.csv``; ``--budget-s`` stops it between
  two configurations (run again to resume); a sidecar ``.json`` marks the table complete.
* ``measure``: from table N, WR (each limit per kernel, one reused buffer) and WD (each budget in total,
  a private segment per kernel) plans and their undivided baselines under the same limit; every plan
  and baseline executed for real (`dlsim.calibrate.microbatch_exec.PlanRunner`: the planned
  micro-batches and algorithms, in an arena of the limit's size) in interleaved rounds (each round runs
  every variant once, in a shuffled order), median per variant, with a memory-bandwidth and a GEMM probe
  per round → ``microbatch-cpu-runs/attempt-N.json``.
* ``report``: the markdown report, CSV tables, one JSON record and the figures, from every attempt
  (`microbatch_cpu/report.py`).

``--stage all`` runs check (if not done), calibrate, measure and report for ``--attempt N``.
Prints a JSON summary. Usage:
    python benchmarks/validate_microbatch_cpu.py [--stage all] [--attempt 1] [--batch 16]
        [--limits 8MiB,32MiB,128MiB] [--wd-limits 64MiB,128MiB,256MiB] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import sys


def _threads_from_argv(default: str = "1") -> str:
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return default


# BLAS threads must be fixed before NumPy loads its BLAS library
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = _threads_from_argv()

import json  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from dlsim.api.microbatch import plan_from_table  # noqa: E402
from dlsim.calibrate.conv_check import TOLERANCE, check_layers  # noqa: E402
from dlsim.calibrate.microbatch_bench import bench_layers  # noqa: E402
from dlsim.calibrate.microbatch_exec import PlanRunner  # noqa: E402
from dlsim.calibrate.microbatch_holdout import HoldoutTimer  # noqa: E402
from dlsim.cost.conv_methods import conv_geometry  # noqa: E402
from dlsim.io.bench_table import append_rows, load_bench_table, resume_rows  # noqa: E402
from dlsim.io.files import write_atomic  # noqa: E402
from dlsim.plan.microbatch import batch_sizes  # noqa: E402
from dlsim.units import MIB, parse_size  # noqa: E402

ALEXNET = [  # name, per-sample geometry (n, c_in, h, w, c_out, k_h, k_w, stride, padding)
    ("conv1", conv_geometry(1, 3, 224, 224, 64, 11, 11, 4, 2)),
    ("conv2", conv_geometry(1, 64, 27, 27, 192, 5, 5, 1, 2)),
    ("conv3", conv_geometry(1, 192, 13, 13, 384, 3, 3, 1, 1)),
    ("conv4", conv_geometry(1, 384, 13, 13, 256, 3, 3, 1, 1)),
    ("conv5", conv_geometry(1, 256, 13, 13, 256, 3, 3, 1, 1)),
]
MODES = ("wr", "wd")
_PROBE: dict[str, np.ndarray] = {}


def _cpu_times() -> tuple[float, float, float]:
    """(busy seconds of the whole machine, seconds of this process, hypervisor steal seconds) so far."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    busy = (sum(fields[:7]) - fields[3] - fields[4]) / ticks
    own = os.times()
    return busy, own.user + own.system, (fields[7] if len(fields) > 7 else 0) / ticks


def probe() -> dict[str, float]:
    """The machine's state now: seconds to copy 256 MiB (memory bandwidth, beyond any cache) and for ten
    256x256x256 fp32 GEMMs (in-cache compute); the two resources the kernels compete for."""
    if not _PROBE:
        _PROBE["src"] = np.ones(int(256 * MIB) // 4, np.float32)
        _PROBE["dst"] = np.empty_like(_PROBE["src"])
        _PROBE["a"] = np.ones((256, 256), np.float32)
        _PROBE["c"] = np.empty((256, 256), np.float32)
        np.copyto(_PROBE["dst"], _PROBE["src"])        # fault the pages in outside the timing
    start = time.perf_counter()
    np.copyto(_PROBE["dst"], _PROBE["src"])
    mem = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(10):
        np.matmul(_PROBE["a"], _PROBE["a"], out=_PROBE["c"])
    return {"copy_256mib_s": mem, "gemm_s": time.perf_counter() - start}


def measure(runners: dict[str, PlanRunner], rounds: int, seed: int, log,
            holdout: HoldoutTimer | None = None, holdout_before: bool = False) -> dict:
    """Interleaved rounds with a probe before each: every variant once and (with `holdout`) one sample of every
    configuration the variants use, all in one shuffled order; the foreign CPU load and steal during them, and
    the probes. With `holdout_before`, all hold-out rounds run first and the executions after them, so that
    the hold-out prediction is complete before any plan is executed."""
    if holdout is not None and holdout_before:
        log("  hold-out re-timing before any execution")
        before = measure({}, rounds, seed, log, holdout)
        after = measure(runners, rounds, seed + 1, log)
        return {**after, "holdout_before": before}
    rng = random.Random(seed)
    items = [("run", key) for key in runners] + [("holdout", key) for key in (holdout.keys if holdout else [])]
    for kind, key in items:                            # warm-up: page in arenas, workspaces and operands
        runners[key].run_once(record=False) if kind == "run" else holdout.time(key, record=False)
    busy0, own0, steal0 = _cpu_times()
    wall0 = time.perf_counter()
    probes = []
    for r in range(rounds):
        probes.append(probe())
        rng.shuffle(items)
        for kind, key in items:
            runners[key].run_once() if kind == "run" else holdout.time(key)
        log(f"  round {r + 1}/{rounds} done")
    wall = time.perf_counter() - wall0
    busy1, own1, steal1 = _cpu_times()
    return {"wall_s": wall, "foreign_cores": max(0.0, (busy1 - busy0) - (own1 - own0)) / wall,
            "steal_cores": (steal1 - steal0) / wall, "probes": probes}


def _key(mode: str, limit: float, variant: str) -> str:
    return f"{mode} {limit:.0f} {variant}"


def stage_check(args, out: Path, log) -> dict:
    """Every algorithm against direct and PyTorch on the AlexNet shapes."""
    start = time.perf_counter()
    rows = check_layers(ALEXNET, batch=args.check_batch, seed=args.seed)
    rec = {"batch": args.check_batch, "tolerance": TOLERANCE, "seconds": time.perf_counter() - start,
           "all_ok": all(r.ok for r in rows), "torch": all(r.vs_torch is not None for r in rows),
           "rows": [{"layer": r.layer, "pass": r.pass_name, "algorithm": r.algorithm, "vs_direct": r.vs_direct,
                     "vs_torch": r.vs_torch, "ok": r.ok} for r in rows]}
    write_atomic(out / "microbatch-cpu-check.json", json.dumps(rec, indent=1) + "\n")
    worst = max(rows, key=lambda r: max(r.vs_direct, r.vs_torch or 0.0))
    log(f"check: {len(rows)} (layer, pass, algorithm), all within {TOLERANCE:g}: {rec['all_ok']}; largest error "
        f"{max(worst.vs_direct, worst.vs_torch or 0.0):.2e} ({worst.layer} {worst.pass_name} {worst.algorithm})")
    return rec


def _marker(table_path: Path) -> Path:
    return table_path.with_suffix(".json")


def stage_calibrate(args, table_path: Path, limits: dict[str, list[float]], log) -> bool:
    """Calibrate until the table is complete or the time budget is spent; True when complete."""
    started = time.perf_counter()
    marker = _marker(table_path)
    meta = json.loads(marker.read_text()) if marker.exists() else {"seconds": 0.0, "probes": []}
    stopped = []

    def stop() -> bool:
        if args.budget_s and time.perf_counter() - started > args.budget_s:
            stopped.append(True)
            return True
        return False
    log(f"calibrating into {table_path} (resumable)")
    meta["probes"].append(probe())
    done = resume_rows(table_path)
    bench_layers(ALEXNET, args.batch, batch_sizes("powerOfTwo", args.batch), done=done,
                 emit=lambda rows: append_rows(table_path, rows), max_workspace=_largest(limits), repeats=args.repeats,
                 min_samples=args.batch, progress=log, stop=stop)
    meta["probes"].append(probe())
    meta.update({"batch": args.batch, "max_workspace_bytes": _largest(limits), "repeats": args.repeats,
                 "blas_threads": args.threads, "complete": not stopped,
                 "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "seconds": meta["seconds"] + time.perf_counter() - started})
    write_atomic(marker, json.dumps(meta, indent=1) + "\n")
    return not stopped


def _plans(table, batch: int, limits: dict[str, list[float]]) -> dict:
    return {(mode, limit): plan_from_table(table, batch, limit, mode, "powerOfTwo")
            for mode in MODES for limit in limits[mode]}


def stage_measure(args, out: Path, table_path: Path, limits: dict[str, list[float]], log) -> dict:
    """Plan from table N, execute every plan and its undivided baseline in interleaved rounds; attempt N's record."""
    meta = json.loads(_marker(table_path).read_text()) if _marker(table_path).exists() else {}
    if not meta.get("complete") or meta.get("batch") != args.batch or meta.get("max_workspace_bytes") != _largest(limits):
        raise SystemExit(f"{table_path}: calibration for batch {args.batch} up to {_largest(limits):.0f} bytes is "
                         "not complete; run --stage calibrate")
    table = load_bench_table(table_path)
    plans, runners, tensors = _plans(table, args.batch, limits), {}, {}
    geoms = dict(ALEXNET)
    for (mode, limit), plan in plans.items():
        runners[_key(mode, limit, "planned")] = PlanRunner(plan, geoms, tensors=tensors, seed=args.seed)
        if plan.undivided_time_s is not None:
            runners[_key(mode, limit, "undivided")] = PlanRunner(plan, geoms, undivided=True, tensors=tensors)
    holdout = HoldoutTimer(runners.values()) if args.holdout else None
    log(f"attempt {args.attempt}: measuring {len(runners)} variants"
        + (f" and re-timing their {len(holdout.keys)} configurations (hold-out)" if holdout else "")
        + f", {args.rounds} interleaved rounds")
    load = measure(runners, args.rounds, args.seed + args.attempt, log, holdout, args.holdout_order == "before")
    rec = {"attempt": args.attempt, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "table": str(table_path), "calibration": meta, "rounds": args.rounds, "load": load,
           "holdout_order": args.holdout_order if holdout else None,
           "plans": {f"{mode} {limit:.0f}": plan.to_dict() for (mode, limit), plan in plans.items()},
           "records": {key: r.record() for key, r in runners.items()}}
    if holdout:
        rec["holdout"] = {key: holdout.record(r) for key, r in runners.items()}
        rec["holdout_samples"] = [[*key, holdout.samples[key]] for key in holdout.keys]
    write_atomic(out / "microbatch-cpu-runs" / f"attempt-{args.attempt}.json", json.dumps(rec, indent=1) + "\n")
    return rec


def _largest(limits: dict[str, list[float]]) -> float:
    return max(v for vs in limits.values() for v in vs)


def _command(args) -> str:
    return (f"python benchmarks/validate_microbatch_cpu.py --stage all --attempt N --batch {args.batch} "
            f"--limits {args.limits} --wd-limits {args.wd_limits} --rounds {args.rounds} --repeats {args.repeats} "
            f"--threads {args.threads} --out {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stage", choices=("check", "calibrate", "measure", "report", "all"), default="all")
    parser.add_argument("--attempt", type=int, default=1, help="which independent replication (table and run) this is")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--limits", default="8MiB,32MiB,128MiB", help="WR: workspace limits per kernel")
    parser.add_argument("--wd-limits", default="64MiB,128MiB,256MiB", help="WD: total workspace budgets")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=7, help="calibration repetitions per configuration")
    parser.add_argument("--budget-s", type=float, default=0.0, help="calibrate: stop after this many seconds (0: never)")
    parser.add_argument("--check-batch", type=int, default=2)
    parser.add_argument("--holdout", action=argparse.BooleanOptionalAction, default=True,
                        help="also re-time every configuration the plans use, interleaved with the executions "
                             "(a prediction free of the planner's selection bias; see microbatch_holdout)")
    parser.add_argument("--holdout-order", choices=("interleaved", "before"), default="interleaved",
                        help="interleaved: hold-out samples shuffled in with the executions (same machine state); "
                             "before: the whole hold-out re-timing first, so the prediction exists before any run")
    parser.add_argument("--threads", default="1")
    parser.add_argument("--out", default="reports")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    (out / "microbatch-cpu-runs").mkdir(parents=True, exist_ok=True)
    table_path = out / "microbatch-cpu-runs" / f"table-{args.attempt}.csv"
    limits = {"wr": [parse_size(v) for v in args.limits.split(",")],
              "wd": [parse_size(v) for v in args.wd_limits.split(",")]}

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    summary: dict = {}
    if args.stage == "check" or (args.stage == "all" and not (out / "microbatch-cpu-check.json").exists()):
        summary["check_all_ok"] = stage_check(args, out, log)["all_ok"]
    if args.stage in ("calibrate", "all"):
        summary["calibration_complete"] = stage_calibrate(args, table_path, limits, log)
    if args.stage in ("measure", "all"):
        rec = stage_measure(args, out, table_path, limits, log)
        summary["errors"] = {k: v["error"] for k, v in rec["records"].items()}
        if "holdout" in rec:
            summary["holdout_errors"] = {k: v["error"] for k, v in rec["holdout"].items()}
    if args.stage in ("report", "all"):
        from microbatch_cpu.report import write_report
        summary = write_report(out, args.batch, limits, _command(args), args.threads, ALEXNET)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
