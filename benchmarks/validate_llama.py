"""The Llama 3.1 section of benchmarks/validate_published.py: NVIDIA's published Llama 3.1 8B, 70B and 405B
runs on DGX H100, BF16 and FP8 (issue 17), priced as the per-stack validation prices them.

Published: NVIDIA dgxc-benchmarking v24.11.1 (commit 35a9aec), llama3.1/README_8b.md, README_70b.md,
README_405b.md (NeMo 24.09; seconds per training step, the last of 50 steps) with the recipes'
configuration in llama3.1/llama3.1_{8b,70b,405b}.yaml. The runs and their configuration are those of
benchmarks/stack_runs/megatron-core.yaml; each is simulated once, by `validate_stacks.run_one`, with
``stack=megatron-core`` (stacks/megatron-core.yaml: the recipes' kernels, Transformer Engine's userbuffer
overlap, the distributed optimizer, each key with its source) and the run's own configuration, so
reports/validation-published-gpu.md and reports/validation-stacks.md give every run the same number.

Every input comes from the `dgx-h100` profile (published microbenchmarks and datasheets, each with
its source); the published step times are only compared with, never an input.

Used by benchmarks/validate_published.py (`stack_runs`, `llama_runs`, `run_stack`, `llama_markdown`); alone:
python benchmarks/validate_llama.py prints the rows as JSON.
"""

from __future__ import annotations

import json
import statistics

from dlsim.units import GIB

import validate_stacks

STACK = "megatron-core"
SOURCE = ("NVIDIA dgxc-benchmarking v24.11.1 (commit 35a9aec): llama3.1/README_{8b,70b,405b}.md (step times, "
          "NeMo 24.09) and llama3.1_{8b,70b,405b}.yaml (configuration)")


def stack_runs(prefix: str) -> list[dict]:
    """The runs of the megatron-core set (benchmarks/stack_runs/megatron-core.yaml) whose model name starts
    with `prefix`, each as {run: its id, spec: the set, entry: the run}."""
    spec = validate_stacks.load_sets([STACK])[0]
    return [{"run": r["id"], "spec": spec, "entry": r} for r in spec["runs"] if r["model"].startswith(prefix)]


def llama_runs() -> list[dict]:
    """The twelve Llama 3.1 runs (the smallest and largest published scale of each size, BF16 and FP8)."""
    return stack_runs("llama3")


def run_stack(run: dict) -> dict:
    """One run of `stack_runs` as benchmarks/validate_stacks.py simulates it (the same row, with its source)."""
    return {**validate_stacks.run_one(run["spec"], run["entry"]), "source": run["spec"]["source"]}


def llama_summary(rows: list[dict]) -> dict:
    errors = [abs(r["error"]) for r in rows]
    by = {d: [abs(r["error"]) for r in rows if r["strategy"]["dtype"] == d] for d in ("bf16", "fp8")}
    return {"runs": len(rows), "median_abs_error": statistics.median(errors), "max_abs_error": max(errors),
            "mean_abs_error": statistics.fmean(errors), "called_out_of_memory": sum(not r["fits"] for r in rows),
            **{f"median_abs_error_{d}": statistics.median(e) for d, e in by.items() if e}}


def llama_markdown(rows: list[dict]) -> list[str]:
    """The report section (lines)."""
    s = llama_summary(rows)
    fp8 = [r["error"] for r in rows if r["strategy"]["dtype"] == "fp8"] or [0.0]
    lines = ["", "## Llama 3.1 8B / 70B / 405B on DGX H100 (BF16 and FP8)", "",
             f"Published: {SOURCE}. dlsim on `dgx-h100` with `--stack {STACK}` and each run's configuration "
             "(benchmarks/stack_runs/megatron-core.yaml: context parallelism 2, interleaved pipelines with VP 5 "
             "for 70B and 7 for 405B, micro-batch 1, sequence 8192, the vocabulary padded to 128 x tp, the dtype); "
             "every other key from the stack, read from NeMo 24.09, Megatron-Core 0.9.0 and Transformer Engine "
             "1.10 (`dlsim stacks show megatron-core`). The same rows as reports/validation-stacks.md. Every "
             "input is the `dgx-h100` profile's (datasheets and published microbenchmarks); the published step "
             "times are never an input.", "",
             "| run | tp | pp | cp | vp | dp | global batch | published (s) | dlsim (s) | error | "
             "compute / exposed comm / bubble (s) | peak memory (GiB) | fits |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        st, b = r["strategy"], r["breakdown_s"]
        lines.append(f"| {r['run']} | {st['tp']} | {st['pp']} | {st['cp']} | {st.get('virtual_stages', 1)} | "
                     f"{st['dp']} | {st['global_batch']} | {r['published_s']:.2f} | {r['predicted_s']:.2f} | "
                     f"{100 * r['error']:+.1f}% | {b['compute']:.2f} / {b['exposed_comm']:.2f} / {b['bubble']:.2f} | "
                     f"{r['peak_memory_bytes'] / GIB:.1f} of {r['capacity_bytes'] / GIB:.0f} | "
                     f"{'yes' if r['fits'] else 'NO'} |")
    lines += ["", f"Llama set: median |error| {100 * s['median_abs_error']:.1f}% over {s['runs']} runs (BF16 "
              f"{100 * s['median_abs_error_bf16']:.1f}%, FP8 {100 * s['median_abs_error_fp8']:.1f}%), mean "
              f"{100 * s['mean_abs_error']:.1f}%, worst {100 * s['max_abs_error']:.1f}%; called out of memory "
              f"{s['called_out_of_memory']} of {s['runs']}.",
              "",
              f"The FP8 runs' errors range from {100 * min(fp8):+.1f}% to {100 * max(fp8):+.1f}%: only the "
              "best-shape FP8 matmul rate of the H100 is published (MAMF, 70.9% of the FP8 peak against 80.3% for "
              "BF16), so the FP8 curve is the BF16 torch.mm curve scaled by that ratio. What the stack does not "
              "model yet, and which measurement would settle the rest, is listed under megatron-core in "
              "reports/validation-stacks.md."]
    return lines


if __name__ == "__main__":
    rows = [run_stack(run) for run in llama_runs()]
    print(json.dumps({"summary": llama_summary(rows), "runs": rows}, indent=2))
