"""Speed of `dlsim calibrate compute` (issue 34 acceptance: the ResNet-18 calibration below in at most 5 minutes
on the 2-core machine, the same command again in at most 10 s).

Runs the command as a user would (a new process, `python -m dlsim`), into a scratch directory:

* ``cold``: an empty host cache (this host's probes and generic grid measured, as on a new machine);
* ``rerun``: the same command again into the same directory (a finished calibration: nothing to do);
* ``warm``: a new directory with the host cache the cold run filled (a second profile on the same host).

Each timed piece holds ``--lock`` exclusively (the shared machine's other timed work waits). Prints one JSON
record: per scenario the wall time, the CPU seconds of the command and its children (less sensitive to other
processes than the wall time), the command's own summary line, the load average before and after (a busy
machine makes every number slower: say so when comparing).

    flock -x /tmp/dlsim-timing.lock python benchmarks/bench_calibrate.py
    python benchmarks/bench_calibrate.py --lock /tmp/dlsim-timing.lock --scenarios cold,rerun,warm
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from validate_torch_nets import exclusive  # noqa: E402  (the benchmarks' one lock helper)
COMMAND = ["calibrate", "compute", "--device", "cpu", "--statistic", "min", "--passes", "2", "--model", "resnet18",
           "--batch", "4"]


def timed(out: Path, cache: Path, lock: str | None, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "dlsim", *COMMAND, *extra, "--out", str(out), "-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DLSIM_CACHE_DIR": str(cache)}
    with exclusive(lock):
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        after = os.getloadavg()[0]
    cpu = (used.ru_utime - before.ru_utime) + (used.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 1), "load_average_before": round(load, 2),
            "load_average_after": round(after, 2),
            "summary": done.stdout.strip().splitlines(), "warnings": done.stderr.strip().splitlines()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lock", default=None, help="a file to flock exclusively around every timed run")
    ap.add_argument("--scenarios", default="cold,rerun,warm")
    ap.add_argument("--workdir", default=None, help="scratch directory (default: a new temporary one, removed)")
    ap.add_argument("--extra", default="", help="extra arguments for the command, e.g. '--no-grid'")
    args = ap.parse_args()
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="dlsim-bench-calibrate-"))
    cache, first, second = work / "host-cache", work / "profile", work / "profile-2"
    extra = args.extra.split()
    results = {}
    try:
        for scenario in args.scenarios.split(","):
            if scenario == "cold":
                shutil.rmtree(cache, ignore_errors=True)
                shutil.rmtree(first, ignore_errors=True)
                results["cold"] = timed(first, cache, args.lock, extra)
            elif scenario == "rerun":
                results["rerun"] = timed(first, cache, args.lock, extra)
            elif scenario == "warm":
                shutil.rmtree(second, ignore_errors=True)
                results["warm"] = timed(second, cache, args.lock, extra)
            else:
                raise SystemExit(f"error: unknown scenario {scenario!r} (use cold, rerun, warm)")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"benchmark": "calibrate", "command": " ".join(["dlsim", *COMMAND, *extra]),
                      "cpus": os.cpu_count(), "acceptance": {"cold_or_warm_max_s": 300, "rerun_max_s": 10},
                      "scenarios": results}, indent=2))


if __name__ == "__main__":
    main()
