"""Speed of one prediction (issue 30): the analytic evaluator's whole-strategy answer
(`dlsim.api.analytic.estimate_strategy`, `simulate --analytic`) and the event simulation
(`dlsim.api.simulate.simulate`) in process, per workload of the issue's table, and how many
candidates per CPU-second the evaluator prices on the GPT-3 175B / 1,024 A100 search space.

Workloads (the Megatron-LM runs, on the stack each paper ran):
* 22B, tp 8, 8 GPUs: Korthikanti et al. 2022's 22B (48 layers, hidden 6144, 64 heads; Table 5's
  micro-batch 4, global batch 4), selective recomputation and sequence parallelism, megatron-lm-2022;
* GPT-3 175B on 1,024 A100s, tp 8, pp 8, dp 16, global batch 1,536 (the optimize benchmark's
  workload), 1F1B and interleaved (v = 3), selective recomputation, megatron-lm-2022 (scatter-gather
  pipeline transfers);
* Megatron 1T on 3,072 A100s (Narayanan et al. SC'21 Table 1: tp 8, pp 64, dp 6, global batch 3,072
  = 512 micro-batches of 1), full recomputation, megatron-lm-2021.

Per workload, medians of `--repeats` runs (wall seconds; `min_max_s` the fastest and slowest run):
* `analytic_by_name_s`: `estimate_strategy` given the model and cluster names: loading them included;
* `analytic_loaded_s`: given a model and cluster loaded once in the process, on a fresh scenario builder
  each time (what a new strategy costs: what depends only on the model is derived once per model);
* `analytic_again_s`: the same strategy again on the builder `estimate_strategy` keeps for loaded objects
  (`dlsim.api.analytic`): its layer tables, partitions, prices and the evaluator's caches reused;
* `analytic_first_s`: given a model loaded just before (not timed), the first prediction on it;
* `simulate_loaded_s`: the event simulation, model and cluster loaded once.
Search space: every candidate of `dlsim optimize gpt3-175b --cluster dgx-a100 --gpus 1024
--global-batch 1536` sized (memory) and every one that fits timed, in one process, CPU seconds
(`time.process_time`): `candidates_per_cpu_s` (enumerated / CPU seconds of sizing and timing) and
`evaluated_per_cpu_s` (timed / CPU seconds of timing), with Python's cyclic collector paused as every
entry point that runs the evaluator pauses it (`optimize`, `sweep`, `simulate --analytic`:
`dlsim.api.gcpause`); `collector_running` repeats the pass on a fresh evaluator with the collector
running, as sessions before 2026-11-29 measured it (about a fifth more CPU over this space).

dlsim's bytecode is compiled first, as an installed package has it (`bytecode.py`; the JSON's `bytecode`).
The machine's load is printed (os.getloadavg) beside the numbers: on a shared machine compare ratios
of interleaved runs, not absolute times.
Usage: python benchmarks/bench_predict.py [--repeats 5] [--sim-repeats 3] [--only NAME] [--no-space]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections import Counter
from dataclasses import replace

from bytecode import compile_package
from dlsim.api import analytic
from dlsim.api.analytic import estimate_strategy
from dlsim.api.gcpause import paused_gc
from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import Builders, default_pricers, kernel_tables, simulate
from dlsim.api.stacks import apply_stack, choose_stack
from dlsim.plan.evaluate import Evaluator
from dlsim.plan.scenario import ScenarioBuilder
from dlsim.plan.search import SEARCHED, SearchSpace, candidates

KORTHIKANTI_22B = {"layers": 48, "hidden": 6144, "heads": 64}
GPT3_1024 = {"tp": 8, "pp": 8, "dp": 16, "global_batch": 1536, "microbatch_size": 1, "recompute": "selective",
             "stack": "megatron-lm-2022"}
ROWS = [
    {"name": "22B tp8 8 GPUs", "model": "megatron-gpt-1t", "overrides": KORTHIKANTI_22B, "cluster": "dgx-a100",
     "strategy": {"tp": 8, "pp": 1, "dp": 1, "microbatch_size": 4, "global_batch": 4, "recompute": "selective",
                  "sequence_parallel": True, "stack": "megatron-lm-2022"}},
    {"name": "175B 1F1B 1024 GPUs", "model": "gpt3-175b", "overrides": None, "cluster": "dgx-a100",
     "strategy": {**GPT3_1024, "schedule": "1f1b"}},
    {"name": "175B interleaved v3 1024 GPUs", "model": "gpt3-175b", "overrides": None, "cluster": "dgx-a100",
     "strategy": {**GPT3_1024, "schedule": "interleaved", "virtual_stages": 3}},
    {"name": "1T 3072 GPUs tp8 pp64 dp6", "model": "megatron-gpt-1t", "overrides": None, "cluster": "dgx-a100",
     "strategy": {"tp": 8, "pp": 64, "dp": 6, "global_batch": 3072, "microbatch_size": 1, "schedule": "1f1b",
                  "recompute": "full", "stack": "megatron-lm-2021"}},
]


SPREADS: dict[str, list[float]] = {}


def _median(f, repeats: int, name: str = "") -> tuple[float, object]:
    """The median wall seconds of `repeats` calls of `f` and its last result; the fastest and the
    slowest call are kept in `SPREADS[name]`."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t)
    SPREADS[name] = [min(times), max(times)]
    return statistics.median(times), out


def row(case: dict, repeats: int, sim_repeats: int) -> dict:
    name, overrides, fields = case["model"], case["overrides"], case["strategy"]
    model, cluster = as_model(name, overrides), as_cluster(case["cluster"])
    estimate_strategy(model, cluster, **fields)  # the model's derived facts, once
    by_name, rec = _median(lambda: estimate_strategy(name, case["cluster"], overrides=overrides, **fields), repeats,
                           "analytic_by_name_s")
    def on_fresh_builder():
        analytic._KEPT = Builders()  # nothing this strategy priced before is kept
        return estimate_strategy(model, cluster, **fields)
    loaded, _ = _median(on_fresh_builder, repeats, "analytic_loaded_s")
    again, _ = _median(lambda: estimate_strategy(model, cluster, **fields), repeats, "analytic_again_s")
    first = []
    for _ in range(repeats):
        fresh = as_model(name, overrides)
        t = time.perf_counter()
        estimate_strategy(fresh, cluster, **fields)
        first.append(time.perf_counter() - t)
    out = {"workload": case["name"], "analytic_by_name_s": by_name, "analytic_loaded_s": loaded,
           "analytic_again_s": again,
           "analytic_first_s": statistics.median(first), "iteration_time_s": rec["iteration_time_s"],  # type: ignore[index]
           "min_max_s": {"analytic_by_name_s": SPREADS["analytic_by_name_s"],
                         "analytic_loaded_s": SPREADS["analytic_loaded_s"],
                         "analytic_again_s": SPREADS["analytic_again_s"], "analytic_first_s": [min(first), max(first)]},
           "approximate": rec["approximate"]}  # type: ignore[index]
    if sim_repeats:
        sim_s, sim = _median(lambda: simulate(model, cluster, **fields), sim_repeats, "simulate_loaded_s")
        out["min_max_s"]["simulate_loaded_s"] = SPREADS["simulate_loaded_s"]  # type: ignore[index]
        out.update({"simulate_loaded_s": sim_s, "simulated_time_s": sim.iteration_time_s,  # type: ignore[union-attr]
                    "analytic_vs_simulated": rec["iteration_time_s"] / sim.iteration_time_s - 1})  # type: ignore
    return out


def space() -> dict:
    """The evaluator over the GPT-3 175B / 1,024 A100 / batch 1,536 space, as `optimize` builds it and
    runs it (collector paused), then again with the collector running."""
    out = _paused_space()
    if gc.isenabled():
        out["collector_running"] = _space()
    return out


@paused_gc
def _paused_space() -> dict:
    return _space()


def _space() -> dict:
    """One pass over the space on a fresh evaluator (layer tables, partitions and prices built anew)."""
    model = as_model("gpt3-175b")
    cluster = replace(as_cluster("dgx-a100"), nodes=128)
    stack, _ = choose_stack(None, model)
    fixed = apply_stack(stack, {}, set(SEARCHED), model, cluster)
    t0 = time.process_time()
    ev = Evaluator.of(ScenarioBuilder(model, cluster, fixed.get("dtype", model.dtype), default_pricers(cluster),
                                      kernel_tables(cluster)[0]))
    pool = list(candidates(model, SearchSpace(1024, 1536, cluster.devices_per_node, fixed=fixed), Counter()))
    fit = [s for s in pool if max(x.total for x in ev.memory(s)) <= ev.capacity]
    t1 = time.process_time()
    for s in fit:
        ev.evaluate(s)
    t2 = time.process_time()
    return {"space": "gpt3-175b dgx-a100 1024 GPUs global batch 1536", "collector": "running" if gc.isenabled()
            else "paused (dlsim.api.gcpause)", "candidates": len(pool), "fit": len(fit),
            "cpu_s": t2 - t0, "sizing_cpu_s": t1 - t0, "timing_cpu_s": t2 - t1,
            "candidates_per_cpu_s": len(pool) / (t2 - t0), "evaluated_per_cpu_s": len(fit) / (t2 - t1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sim-repeats", type=int, default=3, help="0: no simulations")
    ap.add_argument("--only", default="", help="run only the workloads whose name contains this text")
    ap.add_argument("--no-space", action="store_true", help="skip the search-space throughput")
    args = ap.parse_args()
    out: dict = {"load_average": os.getloadavg(), "cpus": os.cpu_count(), "bytecode": compile_package(), "rows": []}
    for case in ROWS:
        if args.only in case["name"]:
            out["rows"].append(row(case, args.repeats, args.sim_repeats))
    if not args.no_space:
        out["search"] = space()
    out["load_average_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
