"""Whole-run validation (reports/validation-run.md): dlsim's expected interruptions, effective
training time, GPU-hours and energy beside what the Llama 3, LLaMA, Llama 2 and BLOOM publications and the
cluster-reliability studies report. Inputs: the published configurations (model, GPUs, parallelism,
batch, tokens) and the profiles' sourced rates; no published outcome is an input.

    PYTHONPATH=. python benchmarks/validate_run.py [--out reports/validation-run.md]

Prints the rows as JSON; writes the report."""

from __future__ import annotations

import argparse
import json
import math
import time

from scipy.stats import chi2

from dlsim.api.run import RunOptions, run
from dlsim.io.profile_run import load_run_profile
from dlsim.io.profile_yaml import load_profile

TOL = 0.15
# How much of a run's configuration its publication gives: all of it, all but the layout (tp/pp/dp, which
# dlsim's optimize then chooses), or not even the GPU count (not counted for the acceptance line).
CONFIG_LABELS = {True: "yes", "layout": "GPUs, batch, tokens (layout: dlsim optimize)", False: "no (GPU count chosen)"}
KOKOLIS_RSC2 = 2.34  # failures per 1000 node-days, Kokolis et al. 2024 §V (the lower of the two clusters)

# Llama 3 (Dubey et al., arXiv:2407.21783): §3.3.4 "during a 54-day snapshot period of pre-training ...
# 466 job interruptions ... 419 unexpected"; 16,384 H100 (Table 4); ">90% effective training time".
LLAMA3_DAYS, LLAMA3_GPUS, LLAMA3_UNEXPECTED = 54, 16384, 419

RUNS = [
    {"id": "Llama 3.1 405B", "model": "llama3-405b", "cluster": "dgx-h100", "nodes": 2048, "tokens": 15.6e12,
     # Table 4 (16,384 GPUs: TP 8, CP 1, PP 16, DP 128, sequence 8,192, 16M tokens per batch) for the whole
     # budget: §3.4.1's smaller early batches ran on fewer GPUs (Table 4's 8,192-GPU row) with an interleaved
     # schedule whose micro-batches must divide by pp, not modelled here; ZeRO-1 and two virtual stages chosen here;
     # Megatron-Core's keys stand in for Meta's own PyTorch stack except Transformer Engine's userbuffers
     # (tp_comm_overlap), which that stack does not have (§3.3.2 overlaps its collectives its own way), and
     # Megatron's uniform pipeline split, which 126 layers on 16 x 2 chunks cannot have: §3.3.2 takes one
     # transformer layer each off the first and the last stage to balance the embedding and the output (the
     # balanced split)
     "strategy": dict(dp=128, tp=8, pp=16, microbatch_size=1, num_microbatches=16, schedule="interleaved",
                      virtual_stages=2, sequence_parallel=True, zero=1, dtype="bf16", stack="megatron-core",
                      tp_comm_overlap=False, pipeline_split="balanced"),
     "tdp_w": 700, "published_gpu_hours": 30.84e6,
     "published": "Llama 3.1 model card (meta-llama/Llama-3.1-405B): 30.84M H100-80GB GPU-hours, TDP 700 W",
     "published_config": True},
    {"id": "BLOOM 176B", "model": "bloom-176b", "cluster": "benchmarks/stack_runs/jean-zay-a100", "nodes": 48,
     "tokens": 366e9,
     # BigScience, arXiv:2211.05100 §3.4-3.5: 384 A100 80GB (48 nodes of Jean Zay), TP 4, PP 12, DP 8, global
     # batch 2048 sequences of 2048, micro-batch 2, ZeRO-1 on Megatron-DeepSpeed (the deepspeed stack), 366B
     # tokens; full recomputation
     "strategy": dict(dp=8, tp=4, pp=12, microbatch_size=2, global_batch=2048, zero=1, recompute="full",
                      dtype="bf16", stack="deepspeed"),
     "pue": 1.2, "tdp_w": 400, "published_gpu_hours": 1_082_990,
     "published": "Luccioni et al., JMLR 24(253) 2023, Table 1: 1,082,990 GPU-hours; 433,196 kWh = GPU-hours x 400 W "
                  "TDP (dynamic consumption); Jean Zay PUE 1.2",
     "published_config": True},
    {"id": "LLaMA 65B", "model": "llama1-65b", "cluster": "dgx-a100", "nodes": 256, "tokens": 1.4e12,
     # Touvron et al., arXiv:2302.13971: 2,048 A100-80GB (§2.4), 1.4T tokens and 4M tokens per batch (Table 2:
     # 2,048 sequences of 2,048), model and sequence parallelism after Korthikanti et al. with selective
     # recomputation (§2.4), causal attention by xformers' memory-efficient kernel (§2.4, "available in the
     # xformers library"). The layout is not published: it is dlsim's own choice, the winner of
     # `dlsim optimize llama1-65b --cluster dgx-a100 --gpus 2048 --global-batch 2048 --stack megatron-lm-2022
     # --fix recompute=selective --fix sequence_parallel=true --fix fused_kernels=xformers_attention` (its norm,
     # gated unit and rotary run as eager chains: the paper names no fused kernels for them)
     "strategy": dict(dp=256, tp=2, pp=4, microbatch_size=1, global_batch=2048, schedule="interleaved",
                      virtual_stages=4, sequence_parallel=True, recompute="selective", zero=1,
                      fused_kernels=["xformers_attention"], stack="megatron-lm-2022"),
     "pue": 1.1, "tdp_w": 400 * 1.1, "published_gpu_hours": 1_022_362,
     "published": "Touvron et al. 2023 (arXiv:2302.13971), Table 15: 1,022,362 GPU-hours, 449 MWh = GPU-hours x "
                  "400 W x PUE 1.1",
     "published_config": "layout"},
    {"id": "Llama 2 70B", "model": "llama2-70b", "cluster": "dgx-a100", "nodes": 256, "tokens": 2e12,
     # Touvron et al., arXiv:2307.09288 §2.2: 2T tokens, 4M tokens per batch (1024 sequences of 4096), A100-80GB;
     # the GPU count and parallelism are not published: 2,048 GPUs, TP 8, PP 4, DP 64 chosen here
     "strategy": dict(dp=64, tp=8, pp=4, microbatch_size=1, global_batch=1024, schedule="interleaved",
                      virtual_stages=5, sequence_parallel=True, zero=1, dtype="bf16", stack="megatron-core"),
     "tdp_w": 400, "published_gpu_hours": 1_720_320,
     "published": "Touvron et al. 2023, Table 2: 1,720,320 GPU-hours at 400 W per GPU (peak power, PUE-adjusted)",
     "published_config": False},
]


def poisson_interval(k: int, level: float = 0.95) -> tuple[float, float]:
    """Exact (Garwood) interval of a Poisson mean given k events."""
    a = 1 - level
    return chi2.ppf(a / 2, 2 * k) / 2, chi2.ppf(1 - a / 2, 2 * (k + 1)) / 2


def interruptions() -> dict:
    rel = load_run_profile(load_profile("dgx-h100")).reliability
    nodes = LLAMA3_GPUS // 8
    seconds = LLAMA3_DAYS * 86400
    expected = rel.job_rate(nodes, LLAMA3_GPUS) * seconds
    low = KOKOLIS_RSC2 / 1000 / 86400 * nodes * seconds
    lo, hi = poisson_interval(LLAMA3_UNEXPECTED)
    return {"expected": expected, "expected_rsc2": low, "published": LLAMA3_UNEXPECTED, "interval": [lo, hi],
            "within": lo <= expected <= hi, "within_rsc2": lo <= low <= hi, "source": rel.source}


def one(spec: dict) -> dict:
    t0 = time.perf_counter()
    o = RunOptions(tokens=spec["tokens"], pue=spec.get("pue"), trials=200, seed=0)
    r = run(spec["model"], spec["cluster"], tokens=spec["tokens"], options=o, nodes=spec["nodes"],
            batch_schedule=spec.get("batch_schedule"), overrides=spec.get("overrides"), **spec["strategy"])
    gh = r.gpu_hours
    pub = spec["published_gpu_hours"]
    tdp_mwh = gh * spec["tdp_w"] / 1e6
    pub_mwh = pub * spec["tdp_w"] / 1e6
    return {"id": spec["id"], "published_config": spec["published_config"], "gpus": r.gpus,
            "iteration_s": r.iteration_time_s, "mfu": r.iteration["mfu"], "iterations": r.iterations,
            "wall_days": r.wall_s / 86400, "goodput": r.goodput, "goodput_p5": r.monte_carlo["goodput_p5"],
            "goodput_p95": r.monte_carlo["goodput_p95"], "failures": r.failures["expected_unplanned"],
            "gpu_hours": gh, "published_gpu_hours": pub, "gpu_hours_error": gh / pub - 1,
            "energy_tdp_mwh": tdp_mwh, "published_energy_mwh": pub_mwh, "energy_error": tdp_mwh / pub_mwh - 1,
            "energy_model_mwh": r.energy["facility_mwh"], "energy_model_it_mwh": r.energy["it_j"] / 3.6e9,
            "pue": r.energy["pue"], "published": spec["published"], "seconds": time.perf_counter() - t0}


def report(intr: dict, rows: list[dict]) -> str:
    lo, hi = intr["interval"]
    ok = [r for r in rows if r["published_config"] and abs(r["gpu_hours_error"]) <= TOL and abs(r["energy_error"]) <= TOL]
    lines = ["# Whole-run validation: interruptions, effective training time, GPU-hours, energy", "",
             "Generated by `PYTHONPATH=. python benchmarks/validate_run.py` (`dlsim run` on each published "
             "configuration). Inputs: the published configuration (model, GPUs, parallelism, batch, tokens) and the "
             "profiles' sourced failure, storage, restart and power sections; no published outcome (interruptions, "
             "GPU-hours, energy, effective training time) is an input.", "",
             "## Interruptions of a 54-day, 16,384-GPU run (Llama 3)", "",
             "| failure rate per node (source) | expected unplanned interruptions | published (Llama 3, §3.3.4) | "
             "95% Poisson interval of the published count | within |", "|---|---|---|---|---|",
             f"| 6.50 / 1000 node-days (Kokolis et al. 2024, RSC-1; the dgx-h100 profile) | {intr['expected']:.0f} | "
             f"{intr['published']} | {lo:.0f} - {hi:.0f} | {'yes' if intr['within'] else 'no'} |",
             f"| 2.34 / 1000 node-days (Kokolis et al. 2024, RSC-2; sensitivity) | {intr['expected_rsc2']:.0f} | "
             f"{intr['published']} | {lo:.0f} - {hi:.0f} | {'yes' if intr['within_rsc2'] else 'no'} |", "",
             "The two A100 research clusters of Kokolis et al. bracket Llama 3's H100 production run: RSC-1's rate "
             f"predicts {intr['expected'] / intr['published']:.2f}x the published unexpected interruptions, RSC-2's "
             f"{intr['expected_rsc2'] / intr['published']:.2f}x. No H100 per-node job-failure rate independent of "
             "Llama 3 was found; the acceptance line (expected count within the published count's Poisson interval) "
             + ("holds." if intr["within"] else "does not hold with the profile's rate."), "",
             "## GPU-hours, energy, effective training time", "",
             "| run | published configuration | GPUs | MFU | iterations | days | goodput (MC 5-95%) | expected failures | "
             "GPU-hours (dlsim / published, error) | energy at the publication's accounting, MWh (dlsim / published, "
             "error) | dlsim modelled facility energy, MWh (PUE) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['id']} | {CONFIG_LABELS[r['published_config']]} | {r['gpus']:,} | "
                     f"{r['mfu']:.1%} | {r['iterations']:,} | {r['wall_days']:.1f} | {r['goodput']:.1%} "
                     f"({r['goodput_p5']:.1%}-{r['goodput_p95']:.1%}) | {r['failures']:.0f} | "
                     f"{r['gpu_hours'] / 1e6:.3f}M / {r['published_gpu_hours'] / 1e6:.3f}M ({r['gpu_hours_error']:+.1%}) | "
                     f"{r['energy_tdp_mwh']:,.0f} / {r['published_energy_mwh']:,.0f} ({r['energy_error']:+.1%}) | "
                     f"{r['energy_model_mwh']:,.0f} ({r['pue']:g}) |")
    lines += ["", "Sources of the published numbers: " + "; ".join(f"{r['id']}: {r['published']}" for r in rows) + ".", "",
              "The publications state energy as GPU-hours x a per-GPU power (the TDP, or a PUE-adjusted peak), so "
              "the comparison at their accounting is dlsim's GPU-hours x the same power; dlsim's own energy (power "
              "by activity from the simulated breakdown, node overhead, PUE; `dlsim.cost.power`) is listed beside "
              "it. Llama 3 reports more than 90% effective training time (§3.3.4) against dlsim's goodput of the "
              f"405B run ({rows[0]['goodput']:.1%}).", "",
              f"Acceptance (published GPU-hours and energy of at least two runs from their published configurations "
              f"within {TOL:.0%}; a run whose publication omits only the layout counts, one without its GPU count "
              f"does not): {len(ok)} run(s) ({', '.join(r['id'] for r in ok) or 'none'}) - "
              + ("holds." if len(ok) >= 2 else "does not hold."), ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="reports/validation-run.md")
    args = ap.parse_args()
    intr = interruptions()
    rows = [one(s) for s in RUNS]
    print(json.dumps({"interruptions": intr, "runs": rows}, indent=1, default=float))
    with open(args.out, "w") as fh:
        fh.write(report(intr, rows))


if __name__ == "__main__":
    main()
