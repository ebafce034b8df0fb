"""Speed of `dlsim sweep` (issue 14 acceptance: a 10,000-point sweep in under 60 s on the local
process pool of the 2-core development machine; issue 30: under 15 s, and `--analytic` under 3 s).

The grid (10,240 points, every one a real `simulate()` event simulation, none skipped or cached):
models alexnet, vgg16, lstm-lm, gpt2 x clusters dgx-a100, dgx-h100 x gpus 8..128 x global
batch 64, 128 x tp 1, 2, 4, 8 x pp 1, 2 x micro-batch 1, 2, 4, 8 x recompute none, selective x
ZeRO 0, 1. Small models keep one simulation at a few milliseconds (measured serially on this
machine: lstm-lm ~3 ms, alexnet ~6, vgg16 ~7, gpt2 ~11; googlenet ~21 and resnet18/bert-base ~10
were left out); points that cannot be built (tp not dividing the heads, a batch that does not
divide) are infeasible or invalid records, counted apart. Each worker keeps its scenario builders
(`dlsim.api.simulate.Builders`: measured tables, layer tables, remembered comm prices, the analytic
evaluator; a test holds the records equal to fresh builders'). With `--analytic` every point is
priced by the analytic evaluator (`dlsim sweep --analytic`; none of these points needs the fallback
simulation, the JSON counts them). Each record is appended and fsynced as its batch finishes, as in a real
sweep. On a shared machine the wall time depends on what else runs: the JSON says the load.

dlsim's bytecode is compiled first, as an installed package has it (`bytecode.py`; the JSON's `bytecode`).
Prints JSON: points, wall time, points per second, records by status, the backend, then a resume
check (the finished file run again: 0 points recomputed).
Usage: python benchmarks/bench_sweep.py [--jobs 2] [--out FILE] [--analytic]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from bytecode import compile_package
from dlsim.api.sweep import run_sweep
from dlsim.io.sweep_spec import parse_sweep

SPEC = {
    "name": "bench-10k",
    "models": ["alexnet", "vgg16", "lstm-lm", "gpt2"],
    "clusters": ["dgx-a100", "dgx-h100"],
    "gpus": [8, 16, 32, 64, 128],
    "global_batch": [64, 128],
    "grid": {"tp": [1, 2, 4, 8], "pp": [1, 2], "microbatch_size": [1, 2, 4, 8],
             "recompute": ["none", "selective"], "zero": [0, 1]},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", default=None, help="results file (default: a temporary one, removed)")
    ap.add_argument("--analytic", action="store_true", help="price the points with the analytic evaluator")
    args = ap.parse_args()
    bytecode = compile_package()
    spec = parse_sweep(SPEC)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp) / "bench.jsonl"
        if out.exists():
            out.unlink()
        load_before = os.getloadavg()[0]
        t0 = time.perf_counter()
        engine = {"analytic": True} if args.analytic else {}  # (a tree without engines runs the plain sweep)
        r = run_sweep(spec, out, jobs=args.jobs, **engine)
        wall = time.perf_counter() - t0
        t1 = time.perf_counter()
        again = run_sweep(spec, out, jobs=args.jobs, **engine)
        resume_s = time.perf_counter() - t1
        lines = sum(1 for _ in out.open())
        status = Counter(rec["status"] for rec in r.records)
        print(json.dumps({
            "case": "10k-point sweep, local process pool" + (", analytic" if args.analytic else ""),
            "points": r.total, "jobs": args.jobs, "engine": getattr(r, "engine", "simulation"),
            "simulated_instead": sum(r.fallbacks.values()) if hasattr(r, "fallbacks") else 0,
            "backend": r.backend, "cpu_count": os.cpu_count(), "bytecode": bytecode, "wall_s": round(wall, 2),
            "limit_s": 3.0 if args.analytic else 15.0,
            "points_per_s": round(r.total / wall, 1), "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)], "status": dict(status),
            "file_lines": lines, "rerun": {"computed": again.computed, "resumed": again.resumed,
                                          "wall_s": round(resume_s, 2)},
        }, indent=1))


if __name__ == "__main__":
    main()
