"""Speed of `dlsim optimize` (issue 14 acceptance: GPT-3 175B on 1,024 A100s, global batch 1,536, under
10 s on the 2-core development machine) and a small space's evaluator-vs-simulation error.

dlsim's bytecode is compiled first, as an installed package has it (`bytecode.py`).
Prints JSON: per case the wall time of the in-process `optimize()` call split into search +
analytic evaluation and simulation, its CPU seconds (this process and the forked workers it waited
for: the figure to compare on a shared machine), the candidate counts (buildable, dropped by reason,
evaluated, simulated), the winner and its simulated time, and the evaluator's error on the simulated
ones. `--exhaustive` times every candidate that fits (no lower-bound pruning: the same ranking, more
estimates); `--only` runs the cases whose name contains it.
Usage: python benchmarks/bench_optimize.py [--top 5] [--max-simulations 24] [--jobs N] [--exhaustive] [--only S]
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from bytecode import compile_package
from dlsim.api.optimize import optimize

CASES = [
    {"name": "gpt3-175b 1024 A100 batch 1536", "model": "gpt3-175b", "cluster": "dgx-a100", "nodes": 128,
     "gpus": 1024, "global_batch": 1536, "limit_s": 10.0, "overrides": None},
    {"name": "small GPT 8 A100 batch 32", "model": "gpt3-175b", "cluster": "dgx-a100", "nodes": 1, "gpus": 8,
     "global_batch": 32, "limit_s": None,
     "overrides": {"layers": 4, "hidden": 1024, "heads": 16, "seq_len": 1024, "positions": 1024}},
]


def cpu_s() -> float:
    """CPU seconds of this process and of its finished children (the forked search and simulation workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--max-simulations", type=int, default=24)
    ap.add_argument("--jobs", type=int, default=None, help="simulation processes [default: the cores]")
    ap.add_argument("--exhaustive", action="store_true", help="time every candidate that fits (no pruning)")
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    args = ap.parse_args()
    bytecode = compile_package()
    out = []
    for case in CASES:
        if args.only not in case["name"]:
            continue
        t0, c0 = time.perf_counter(), cpu_s()
        r = optimize(case["model"], case["cluster"], nodes=case["nodes"], gpus=case["gpus"],
                     global_batch=case["global_batch"], top=args.top, max_simulations=args.max_simulations,
                     jobs=args.jobs, prune_bound=not args.exhaustive,
                     overrides=case["overrides"])
        wall, cpu = time.perf_counter() - t0, cpu_s() - c0
        errors = [c.estimate.iteration_time_s / c.result.iteration_time_s - 1 for c in r.ranked]
        out.append({"case": case["name"], "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                    "exhaustive": args.exhaustive, "bytecode": bytecode, "limit_s": case["limit_s"],
                    "within_limit": None if case["limit_s"] is None else wall <= case["limit_s"],
                    "seconds": {k: round(v, 3) for k, v in r.seconds.items()},
                    "enumerated": r.enumerated, "dropped": r.dropped, "pruned_by_bound": r.pruned,
                    "evaluated": r.evaluated,
                    "simulated": len(r.ranked), "best": r.to_dict()["best"]["label"],
                    "best_time_s": r.best.result.iteration_time_s,
                    "evaluator_error_on_simulated": {"max_abs": max(abs(e) for e in errors),
                                                     "mean": sum(errors) / len(errors)}})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
