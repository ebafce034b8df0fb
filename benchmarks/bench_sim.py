"""Speed of `dlsim simulate` (issue 4 acceptance): one iteration of GPT-3 175B on 4,096 GPUs
(tp 8, pp 16, dp 32, 1F1B, 64 micro-batches) under 2 s; ResNet-50 data parallel on 1,024 GPUs
under 0.5 s; issue 13: Megatron 1T on 3,072 GPUs (tp 8, pp 64, dp 6, 512 micro-batches) under 1 s; events per
second (of the events processed: the steady-state extension, dlsim.sim.steady, simulates fewer).
Issue 17: a mixture-of-experts model with ep 8 on 1,024 GPUs under 2 s (Mixtral 8x7B, sequence 4096
as in NeMo's Mixtral recipes, tp 2, pp 8, dp 64, ep 8: 128 DGX H100 nodes).

Prints JSON: per case the median (and max) wall time of the whole in-process `simulate()` call
(model loading, pricing, graph building, simulation, analysis), of the event loop alone, the
events and tasks, and the CLI process wall time (Python start-up included).
Issue 17: Llama 3 405B on 16,384 H100s (tp 8, pp 16, cp 2, dp 64) under 2 s.
Usage: python benchmarks/bench_sim.py [--repeats 5] [--only mixtral]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import dlsim.sim.run as sim_run
import dlsim.sim.steady as sim_steady

CASES = [
    {"name": "gpt3-175b 4096 GPUs", "model": "gpt3-175b", "cluster": "dgx-h100", "nodes": 512, "limit_s": 2.0,
     "strategy": {"dp": 32, "tp": 8, "pp": 16, "schedule": "1f1b", "microbatch_size": 1, "num_microbatches": 64}},
    {"name": "resnet50 DP 1024 GPUs", "model": "resnet50", "cluster": "dgx-h100", "nodes": 128, "limit_s": 0.5,
     "strategy": {"dp": 1024, "microbatch_size": 32}},
    {"name": "gpt3-175b interleaved v=2", "model": "gpt3-175b", "cluster": "dgx-h100", "nodes": 512, "limit_s": None,
     "strategy": {"dp": 32, "tp": 8, "pp": 16, "schedule": "interleaved", "virtual_stages": 2,
                  "microbatch_size": 1, "num_microbatches": 64, "recompute": "selective"}},
    # issue 13: Megatron 1T on 3,072 A100s as Narayanan et al. SC'21 Table 1 ran it (tp 8, pp 64, global batch
    # 3072 = dp 6 x 512 micro-batches of 1), 1F1B, full recomputation; limit 1 s
    {"name": "megatron-1t 3072 GPUs", "model": "megatron-gpt-1t", "cluster": "dgx-a100", "nodes": 384, "limit_s": 1.0,
     "strategy": {"dp": 6, "tp": 8, "pp": 64, "schedule": "1f1b", "microbatch_size": 1, "num_microbatches": 512,
                  "recompute": "full"}},
    # issue 17: Llama 3 405B on 16,384 H100s (tp 8, pp 16, cp 2, dp 64; 2,048 DGX H100 nodes), sequence 8192,
    # global batch 2048 sequences (16M tokens, Dubey et al. 2024 Table 4) = 32 micro-batches of 1 per replica
    {"name": "llama3-405b cp 2 16384 GPUs", "model": "llama3-405b", "cluster": "dgx-h100", "nodes": 2048,
     "limit_s": 2.0,
     "strategy": {"dp": 64, "tp": 8, "pp": 16, "cp": 2, "schedule": "1f1b", "microbatch_size": 1,
                  "num_microbatches": 32, "sequence_parallel": True, "dtype": "bf16",
                  "fused_kernels": "flash_attention"}},
    {"name": "mixtral-8x7b ep 8 1024 GPUs", "model": "mixtral-8x7b", "cluster": "dgx-h100", "nodes": 128,
     "limit_s": 2.0, "set": {"seq_len": 4096},
     "strategy": {"dp": 64, "tp": 2, "pp": 8, "ep": 8, "schedule": "1f1b", "microbatch_size": 1,
                  "num_microbatches": 32, "sequence_parallel": True, "recompute": "selective"}},
]


def _cli_args(case: dict) -> list[str]:
    args = [sys.executable, "-m", "dlsim", "simulate", case["model"], "--cluster", case["cluster"],
            "--nodes", str(case["nodes"])]
    for key, value in case.get("set", {}).items():
        args += ["--set", f"{key}={value}"]
    for key, value in case["strategy"].items():
        flag = key.replace('_', '-')
        args += [f"--{flag}" if value else f"--no-{flag}"] if isinstance(value, bool) else [f"--{flag}", str(value)]
    return args


def _api_fields(strategy: dict) -> dict:
    """Strategy fields as `simulate()` takes them (comma-separated fused kernels as a tuple)."""
    out = dict(strategy)
    if isinstance(out.get("fused_kernels"), str):
        out["fused_kernels"] = tuple(out["fused_kernels"].split(","))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default="", help="run only the cases whose name contains this text")
    args = parser.parse_args()
    from dlsim.api.simulate import simulate
    engine_times: list[float] = []
    real_execute = sim_run.execute

    def timed_execute(graph):
        start = time.perf_counter()
        out = real_execute(graph)
        engine_times.append(time.perf_counter() - start)
        return out

    sim_run.execute = timed_execute
    sim_steady.execute = timed_execute
    results = []
    for case in [c for c in CASES if args.only in c["name"]]:
        walls, engines = [], []
        result = None
        for _ in range(args.repeats):
            engine_times.clear()
            start = time.perf_counter()
            result = simulate(case["model"], case["cluster"], nodes=case["nodes"], overrides=case.get("set"),
                              **_api_fields(case["strategy"]))
            walls.append(time.perf_counter() - start)
            engines.append(engine_times[0])
        cli = []
        for _ in range(max(1, args.repeats // 2)):
            start = time.perf_counter()
            subprocess.run(_cli_args(case), check=False, capture_output=True)
            cli.append(time.perf_counter() - start)
        wall, engine = statistics.median(walls), statistics.median(engines)
        results.append({
            "case": case["name"], "devices": result.total_devices, "simulated_devices": result.simulated_devices,
            "tasks": result.tasks, "events": result.events,
            "simulate_s_median": wall, "simulate_s_max": max(walls), "engine_s_median": engine,
            "events_per_s_engine": result.events / engine if engine > 0 else None,
            "events_per_s_overall": result.events / wall if wall > 0 else None,
            "cli_wall_s_median": statistics.median(cli),
            "limit_s": case["limit_s"], "within_limit": None if case["limit_s"] is None else wall < case["limit_s"],
            "predicted_iteration_time_s": result.iteration_time_s, "feasible": result.feasible,
            "predicted_throughput_samples_per_s": result.throughput_samples_per_s,
        })
    sim_run.execute = real_execute
    sim_steady.execute = real_execute
    print(json.dumps({"benchmark": "simulate", "repeats": args.repeats, "cases": results}, indent=2))


if __name__ == "__main__":
    main()
