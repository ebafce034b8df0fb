"""Why does a planned execution take longer than its prediction? Per-kernel timings under four conditions.

For each chosen plan of a calibrated table (``benchmarks/validate_microbatch_cpu.py``'s ``table-N.csv``), every
(layer, pass) step of the plan is timed, interleaved round by round so that machine drift hits all
conditions alike:

* ``in_plan``:   the step inside a real execution of the whole plan (`PlanRunner.run_once`);
* ``cold``:      the step alone, right after a cache flush (same tensors and arena as the plan);
* ``warm``:      the step alone again immediately after ``cold`` (operands and workspace cache-hot);
* ``calib``:     each of the step's micro-batch kernels timed exactly as the calibration does
                 (`microbatch_bench.time_microbatches`: own tensors, a workspace of the kernel's exact
                 size, a flush before the repetition), summed over the step's micro-batches;
* ``table``:     the table's prediction for the step.

Minor page faults (getrusage) are counted per condition. Ratios of medians tell the candidates apart:
in_plan/cold (what the previous kernel leaves behind vs a flush), cold/warm (how much a cold start
costs), calib/cold (memory placement: exact-size fresh arena vs the plan's arena), table/calib (drift
since calibration, or selection bias of the planner).

    python benchmarks/microbatch_cpu/diagnose.py --table reports/microbatch-cpu-runs/table-2.csv \
        --plans wr:32MiB,wr:128MiB,wd:256MiB --rounds 7 --out reports/microbatch-cpu-runs/diagnose.json
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from validate_microbatch_cpu import ALEXNET  # noqa: E402

from dlsim.api.microbatch import plan_from_table  # noqa: E402
from dlsim.calibrate.conv_numpy import workspace_size  # noqa: E402
from dlsim.calibrate.conv_workspace import Workspace  # noqa: E402
from dlsim.calibrate.microbatch_bench import Tensors, flush_caches  # noqa: E402
from dlsim.calibrate.microbatch_exec import PlanRunner  # noqa: E402
from dlsim.io.bench_table import load_bench_table  # noqa: E402
from dlsim.io.files import write_atomic  # noqa: E402
from dlsim.units import parse_size  # noqa: E402

CONDITIONS = ("in_plan", "cold", "warm", "calib")


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class CalibStep:
    """A plan step's kernels as the calibration times them: own tensors, exact-size workspaces."""

    def __init__(self, runner: PlanRunner, index: int, cal_tensors: dict[str, Tensors]):
        layer, self.pass_name, kernels, _ = runner.steps[index]
        self.g1, self.batch = runner.geometries[layer], runner.plan.batch
        if layer not in cal_tensors:
            cal_tensors[layer] = Tensors.make(self.g1, self.batch, seed=1)
        self.t = cal_tensors[layer]
        self.kernels = list(kernels)
        self.ws = {(k.algorithm, k.size): Workspace(workspace_size(k.algorithm, self.pass_name,
                                                                   self.g1.with_batch(k.size)))
                   for k in kernels}

    def time(self) -> float:
        """Σ over the step's micro-batches of the calibration's per-micro-batch time (one repetition each)."""
        total = 0.0
        for k in self.kernels:
            g = self.g1.with_batch(k.size)
            reps = self.batch // k.size
            flush_caches()
            start = time.perf_counter()
            for i in range(reps):
                self.t.run(k.algorithm, self.pass_name, g, i * k.size, self.ws[k.algorithm, k.size], accumulate=i > 0)
            total += (time.perf_counter() - start) / reps
        return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--plans", default="wr:32MiB,wr:128MiB,wd:256MiB")
    ap.add_argument("--undivided", default="wr:128MiB", help="baselines to include too (mode:limit, comma-separated)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    table = load_bench_table(args.table)
    geoms = dict(ALEXNET)
    tensors: dict[str, Tensors] = {}
    cal_tensors: dict[str, Tensors] = {}
    variants = {}
    for spec, undivided in [(s, False) for s in args.plans.split(",")] + \
                           [(s, True) for s in args.undivided.split(",") if s]:
        mode, limit = spec.split(":")
        plan = plan_from_table(table, args.batch, parse_size(limit), mode, "powerOfTwo")
        runner = PlanRunner(plan, geoms, undivided=undivided, tensors=tensors)
        variants[f"{mode} {limit} {'undivided' if undivided else 'planned'}"] = (
            runner, [CalibStep(runner, i, cal_tensors) for i in range(len(runner.steps))])
    times = {v: {c: [[] for _ in r.steps] for c in CONDITIONS} for v, (r, _) in variants.items()}
    faults = {v: {c: 0 for c in CONDITIONS} for v in variants}
    for runner, cal in variants.values():                        # warm-up: fault every page in
        runner.run_once(record=False)
        for c in cal:
            c.time()
    for r in range(args.rounds):
        for v, (runner, cal) in variants.items():
            f0 = _faults()
            for i in range(len(runner.steps)):
                times[v]["in_plan"][i].append(runner.run_step(i))
            f1 = _faults()
            faults[v]["in_plan"] += f1 - f0
            for i in range(len(runner.steps)):
                flush_caches()
                f0 = _faults()
                times[v]["cold"][i].append(runner.run_step(i))
                f1 = _faults()
                times[v]["warm"][i].append(runner.run_step(i))
                faults[v]["cold"] += f1 - f0
                faults[v]["warm"] += _faults() - f1
            f0 = _faults()
            for i, c in enumerate(cal):
                times[v]["calib"][i].append(c.time())
            faults[v]["calib"] += _faults() - f0
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    out = {"table": args.table, "rounds": args.rounds, "variants": {}}
    for v, (runner, _) in variants.items():
        steps = []
        for i, (layer, p, ks, pred) in enumerate(runner.steps):
            med = {c: statistics.median(times[v][c][i]) for c in CONDITIONS}
            steps.append({"kernel": f"{layer} {p}", "microbatches": [[k.size, k.algorithm] for k in ks],
                          "table_s": pred, **{f"{c}_s": med[c] for c in CONDITIONS},
                          "samples": {c: times[v][c][i] for c in CONDITIONS}})
        sums = {c: sum(s[f"{c}_s"] for s in steps) for c in CONDITIONS}
        totals_in_plan = [sum(times[v]["in_plan"][i][r] for i in range(len(steps))) for r in range(args.rounds)]
        out["variants"][v] = {"table_s": runner.predicted_time_s, "sum_of_medians_s": sums,
                              "median_of_in_plan_totals_s": statistics.median(totals_in_plan),
                              "minor_faults_per_round": {c: faults[v][c] / args.rounds for c in CONDITIONS},
                              "steps": steps}
        print(f"{v}: table {runner.predicted_time_s * 1e3:.1f} ms; " +
              ", ".join(f"{c} {sums[c] * 1e3:.1f}" for c in CONDITIONS) +
              f"; in-plan/cold {sums['in_plan'] / sums['cold'] - 1:+.1%}, cold/warm {sums['cold'] / sums['warm'] - 1:+.1%},"
              f" calib/cold {sums['calib'] / sums['cold'] - 1:+.1%}, table/calib {runner.predicted_time_s / sums['calib'] - 1:+.1%};"
              f" faults/round {faults[v]}", flush=True)
    write_atomic(Path(args.out), json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
