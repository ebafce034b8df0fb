"""dlsim's speed side by side with Calculon's (issue 30): one prediction of each workload of
benchmarks/bench_predict.py, and the GPT-3 175B / 1,024 A100 / batch 1,536 search space priced
candidate by candidate, interleaved run by run, with the ratios.

Calculon: Isaev et al., "Calculon: a Methodology and Tool for High-Level Co-Design of Systems and
Large Language Models", SC'23 (github.com/calculon-ai/calculon). It runs in a venv of its own (it
needs psutil and pandas; dlsim does not depend on it): `--calculon PATH` is its checkout, `--python`
that venv's interpreter. This script runs itself there as a worker (`--worker`, reading executions
as JSON on stdin) that times Calculon in process (`Llm(app).compile(system, execution)` then
`run(system)`, as its `llm` command and its searches do, its logger quiet) and prints JSON; the worker's
start-up is not timed. Without a checkout or an interpreter that imports it, the benchmark says so
and exits 0 with {"skipped": reason}.

The same work on both sides:
* one prediction: each workload as a Calculon execution (its model file, systems/a100_80g.json,
  tensor parallelism on the first network, pipeline and data parallelism on the second; recompute
  none / attn_only / full for dlsim's none / selective / full, tensor_par_comm_type rs_ag with
  sequence parallelism else ar, optimizer sharding with ZeRO ≥ 1, no overlap or offload), and
  dlsim's `estimate_strategy` with the model and cluster loaded once (`analytic_loaded_s` of
  bench_predict) and its event simulation; wall seconds, medians of `--repeats` per round;
* the search space: every candidate `dlsim optimize gpt3-175b --cluster dgx-a100 --gpus 1024
  --global-batch 1536` enumerates, mapped one to one to Calculon executions (every `--space-sample`-th
  of them): dlsim sizes each and times those that fit (`bench_predict.space`, its collector paused as
  dlsim's entry points run predictions), Calculon compiles and
  runs each (an execution it cannot fit raises and counts as priced); CPU seconds of each process.
Rounds alternate dlsim and Calculon (`--rounds`); ratios are Calculon's time over dlsim's (above 1:
dlsim is faster) from the medians. The machine's load average is printed beside them.
Usage: python benchmarks/bench_vs_calculon.py --calculon PATH --python PATH/bin/python
       [--rounds 3] [--repeats 5] [--space-sample 1] [--no-space]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CALCULON_MODELS = {"22B tp8 8 GPUs": "megatron-22B.json", "175B 1F1B 1024 GPUs": "gpt3-175B.json",
                   "175B interleaved v3 1024 GPUs": "gpt3-175B.json", "1T 3072 GPUs tp8 pp64 dp6": "megatron-1T.json"}
"""Calculon's model file of each workload of benchmarks/bench_predict.py (the same layers, hidden size, heads)."""
RECOMPUTE = {"none": "none", "selective": "attn_only", "full": "full"}
DATATYPES = {"fp16": "float16", "bf16": "float16", "fp32": "float32"}
"""Calculon's A100 system has no bfloat16 entry: bf16 runs as float16 there (the same width and A100 peak)."""


def execution(s: dict, global_batch: int) -> dict:
    """A dlsim strategy (its `to_dict()`) as a Calculon execution (see the module docstring)."""
    return {"num_procs": s["dp"] * s["tp"] * s["pp"], "tensor_par": s["tp"], "pipeline_par": s["pp"],
            "data_par": s["dp"], "tensor_par_net": 0, "pipeline_par_net": 1, "data_par_net": 1,
            "batch_size": global_batch, "microbatch_size": s["microbatch_size"],
            "datatype": DATATYPES[s.get("dtype") or "fp16"], "fused_activation": True, "attention_type": "multihead",
            "activation_recompute": RECOMPUTE[s["recompute"]], "pipeline_interleaving": s["virtual_stages"],
            "optimizer_sharding": s["zero"] >= 1, "tensor_par_comm_type": "rs_ag" if s["sequence_parallel"] else "ar",
            "tensor_par_overlap": "none", "seq_par_ag_redo": False, "data_par_overlap": False,
            "weight_offload": False, "activations_offload": False, "optimizer_offload": False, "training": True}


# -- the worker, run by Calculon's interpreter --------------------------------------------------
def worker() -> None:
    """Read {"checkout", "model", "executions", "repeats", "mode"} on stdin; time Calculon; print JSON."""
    import logging
    job = json.load(sys.stdin)
    root = Path(job["checkout"])
    sys.path.insert(0, str(root))
    import calculon
    from calculon.llm import Llm
    log = logging.getLogger("calculon-bench")
    log.setLevel(logging.ERROR)
    app = Llm.Application(calculon.io.read_json_file(str(root / "models" / job["model"])))
    system = calculon.System(calculon.io.read_json_file(str(root / "systems" / "a100_80g.json")))

    def price(cfg: dict) -> float | None:
        try:
            llm = Llm(app, log)
            llm.compile(system, Llm.Execution.from_json(cfg))
            llm.run(system)
            return llm.get_stats_json(False)["total_time"]
        except Exception:  # an execution Calculon cannot build or fit
            return None

    if job["mode"] == "one":
        cfg = job["executions"][0]
        times, total = [], None
        for _ in range(job["repeats"]):
            t = time.perf_counter()
            total = price(cfg)
            times.append(time.perf_counter() - t)
        print(json.dumps({"median_s": statistics.median(times), "total_time_s": total}))
    else:
        t = time.process_time()
        priced = [price(cfg) for cfg in job["executions"]]
        cpu = time.process_time() - t
        print(json.dumps({"cpu_s": cpu, "candidates": len(priced), "feasible": sum(p is not None for p in priced)}))


# -- dlsim's side ---------------------------------------------------------------------------------
def _calculon(args, job: dict) -> dict:
    job = {**job, "checkout": str(Path(args.calculon).resolve())}
    out = subprocess.run([args.python, __file__, "--worker"], input=json.dumps(job), capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def _usable(args) -> str:
    """'' when Calculon can be run, else why not."""
    if not args.calculon or not (Path(args.calculon) / "calculon" / "llm").is_dir():
        return f"no Calculon checkout at {args.calculon!r} (give --calculon PATH: github.com/calculon-ai/calculon)"
    if not args.python:
        return "no interpreter for Calculon (give --python: a venv with psutil and pandas)"
    probe = subprocess.run([args.python, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import calculon.llm",
                            str(Path(args.calculon).resolve())], capture_output=True, text=True)
    if probe.returncode:
        return f"Calculon does not import with {args.python}: {probe.stderr.strip().splitlines()[-1:]}"
    return ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--calculon", default=os.environ.get("CALCULON"), help="Calculon checkout")
    ap.add_argument("--python", default=os.environ.get("CALCULON_PYTHON"), help="Calculon's venv interpreter")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--space-sample", type=int, default=1, help="every n-th candidate of the space")
    ap.add_argument("--no-space", action="store_true")
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    why = _usable(args)
    if why:
        print(json.dumps({"skipped": why}))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from collections import Counter
    from dataclasses import replace

    from bench_predict import ROWS, space
    from dlsim.api.analytic import estimate_strategy
    from dlsim.api.models import as_cluster, as_model
    from dlsim.api.stacks import apply_stack, choose_stack
    from dlsim.plan.search import SEARCHED, SearchSpace, candidates

    out: dict = {"load_average": os.getloadavg(), "cpus": os.cpu_count(), "rows": []}
    for case in ROWS:
        model, cluster = as_model(case["model"], case["overrides"]), as_cluster(case["cluster"])
        fields = case["strategy"]
        rec = estimate_strategy(model, cluster, **fields)
        job = {"model": CALCULON_MODELS[case["name"]], "mode": "one",
               "repeats": args.repeats, "executions": [execution(rec["strategy"], fields["global_batch"])]}
        ours, theirs = [], []
        for _ in range(args.rounds):
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                estimate_strategy(model, cluster, **fields)
                times.append(time.perf_counter() - t)
            ours.append(statistics.median(times))
            got = _calculon(args, job)
            theirs.append(got["median_s"])
        d, c = statistics.median(ours), statistics.median(theirs)
        out["rows"].append({"workload": case["name"], "dlsim_analytic_s": d, "calculon_s": c,
                            "calculon_over_dlsim": c / d, "dlsim_iteration_s": rec["iteration_time_s"],
                            "calculon_iteration_s": got["total_time_s"]})
    if not args.no_space:
        model = as_model("gpt3-175b")
        cluster = replace(as_cluster("dgx-a100"), nodes=128)
        stack, _ = choose_stack(None, model)
        fixed = apply_stack(stack, {}, set(SEARCHED), model, cluster)
        pool = list(candidates(model, SearchSpace(1024, 1536, cluster.devices_per_node, fixed=fixed), Counter()))
        job = {"model": "gpt3-175B.json", "mode": "space",
               "executions": [execution({**s.to_dict(), "dtype": fixed.get("dtype", "bf16")}, 1536)
                              for s in pool[::args.space_sample]]}
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(space())
            theirs.append(_calculon(args, job))
        d = statistics.median(r["candidates_per_cpu_s"] for r in ours)
        c = statistics.median(r["candidates"] / r["cpu_s"] for r in theirs)
        out["search"] = {"space": ours[0]["space"], "candidates": ours[0]["candidates"],
                         "calculon_candidates": theirs[0]["candidates"], "calculon_feasible": theirs[0]["feasible"],
                         "dlsim_candidates_per_cpu_s": d, "calculon_candidates_per_cpu_s": c,
                         "dlsim_over_calculon": d / c}
    out["load_average_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
