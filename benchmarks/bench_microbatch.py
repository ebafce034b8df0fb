"""Speed of μ-cuDNN micro-batch planning (issue 6 acceptance): prints JSON.

* WD ILP: 100 convolution layers (the first 100 of ResNet-101 = the zoo's resnet50 with depths
  [3, 4, 23, 3]), forward only (100 kernels) and all three passes (300 kernels), all their desirable
  configurations (WR DP in desirable mode, batch 256, policy powerOfTwo, times modelled for dgx-h100
  in bf16), budgets 256 MiB, 1 GiB, 4 GiB; solve time of the ILP (model construction + solver, default
  relative gap 0.1 %), CBC and HiGHS (if installed). Two variants: the modelled table as it is (many
  identical layers) and every kernel made distinct (its times scaled by a seeded factor in
  [0.95, 1.05]), the harder case for branch and bound. Target: under 1 s for 100 layers.
* WR DP: batch 256, policy all (every micro-batch size 1..256), best mode per layer (three passes);
  target under 0.1 s per layer. Desirable mode is reported too.

Usage: python benchmarks/bench_microbatch.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import pulp

from dlsim.api.microbatch import microbatch_table
from dlsim.plan.microbatch import Config, wd_ilp, wr_best, wr_desirable
from dlsim.plan.microbatch.ilp import smallest_budget
from dlsim.units import MIB

MODEL, OVERRIDES, CLUSTER, DTYPE, BATCH = "resnet50", {"depths": [3, 4, 23, 3]}, "dgx-h100", "bf16", 256


def _layers(table, count):
    names = table.layers()[:count]
    return [k for k in table.kernels if k.layer in names]


def bench_ilp(repeats: int) -> list[dict]:
    table, _ = microbatch_table(MODEL, CLUSTER, BATCH, ("powerOfTwo",), dtype=DTYPE, overrides=OVERRIDES)
    out = []
    for passes in (("forward",), ("forward", "backward_data", "backward_weight")):
        kernels = [k for k in _layers(table, 100) if k.pass_name in passes]
        for budget_mib in (256, 1024, 4096):
            budget = budget_mib * MIB
            start = time.perf_counter()
            fronts = [wr_desirable(k, BATCH, budget, "powerOfTwo") for k in kernels]
            dp_s = time.perf_counter() - start
            if smallest_budget(fronts) > budget:
                continue
            rng = random.Random(budget_mib)
            scaled = [[Config(c.kernels, c.time_s * f, c.workspace_bytes) for c in front]
                      for front, f in ((fr, rng.uniform(0.95, 1.05)) for fr in fronts)]
            for variant, fr in (("as modelled", fronts), ("distinct", scaled)):
                out += _solve_all(fr, budget, budget_mib, len(passes), variant, dp_s, repeats)
    return out


def _solve_all(fronts, budget, budget_mib, passes, variant, dp_s, repeats) -> list[dict]:
    out = []
    for solver in ["cbc"] + (["highs"] if pulp.HiGHS(msg=False).available() else []):
        times, res = [], None
        for _ in range(repeats):
            start = time.perf_counter()
            res = wd_ilp(fronts, budget, solver=solver, time_limit_s=60)
            times.append(time.perf_counter() - start)
        out.append({"layers": 100, "passes": passes, "kernels": len(fronts), "variant": variant,
                    "configurations": sum(len(f) for f in fronts), "budget_mib": budget_mib,
                    "solver": res.solver, "optimal": res.optimal, "ilp_s_median": statistics.median(times),
                    "ilp_s_max": max(times), "desirable_dp_s": dp_s, "under_1s": statistics.median(times) < 1.0})
    return out


def bench_dp(repeats: int) -> list[dict]:
    table, _ = microbatch_table(MODEL, CLUSTER, BATCH, ("all",), dtype=DTYPE, layers=["layer1.0", "layer3.0"])
    out = []
    for layer in table.layers():
        kernels = [k for k in table.kernels if k.layer == layer]
        for mode, fn in (("best", wr_best), ("desirable", wr_desirable)):
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                for k in kernels:
                    fn(k, BATCH, 64 * MIB, "all")
                times.append(time.perf_counter() - start)
            out.append({"layer": layer, "passes": len(kernels), "batch": BATCH, "policy": "all", "mode": mode,
                        "rows_per_pass": len(kernels[0].rows), "per_layer_s_median": statistics.median(times),
                        "under_0_1s": statistics.median(times) < 0.1})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps({"benchmark": "microbatch_planning", "repeats": args.repeats, "wd_ilp": bench_ilp(args.repeats),
                      "wr_dp": bench_dp(args.repeats)}, indent=2))


if __name__ == "__main__":
    main()
