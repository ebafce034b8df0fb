"""dlsim's attention kernels against FlashAttention-2's published A100 benchmark, kernel by kernel.

FlashAttention-2's Figure 4 (Dao 2023, arXiv 2307.08691; Dao-AILab/flash-attention@4f285b3
assets/flash2_a100_fwd_bwd_benchmark.png) times attention forward + backward on an A100 80GB SXM4 in
fp16 at 16k tokens per call (batch x sequence) and 2048 channels (heads x head dimension), head
dimensions 64 and 128, with and without the causal mask, for FlashAttention-2, xformers'
memory_efficient_attention and PyTorch's unfused attention (baddbmm with the scale as alpha, the mask
added, softmax, bmm; benchmarks/benchmark_flash_attention.py at 60499ab). Its TFLOP/s count
3.5 x 4·B·H·L²·d, halved under the causal mask.

dlsim prices the same configurations from the dgx-a100 profile: the flash kernels (`flash_attention`,
`xformers_attention`) from those measurements (`dlsim.cost.flash`: inputs, reproduced by
construction); the unfused core (`dlsim.cost.unfused`) with its batched GEMMs at the rate the
non-causal chain implies (an input) and its softmax and copies priced by the roofline, so the causal
chain, one more kernel adding the mask, is held out: the report's check. Prints JSON; --report also
writes reports/validation-attention-a100.md and .json.

Usage: python benchmarks/validate_attention_kernels.py [--report]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from dlsim.cost.flash import flash_seconds
from dlsim.cost.layers import layer_cost
from dlsim.cost.pricing import gemm_seconds, price_pass
from dlsim.cost.roofline import roofline_time
from dlsim.io.profile_yaml import load_profile
from dlsim.spec.model import build_model

ROOT = Path(__file__).resolve().parents[1]
TOKENS, CHANNELS = 16384, 2048
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
FA2_FIGURE_4 = {  # (kernel, head dim, causal): TFLOP/s by LENGTHS (None: out of memory)
    ("flash_attention", 64, False): (132, 153, 162, 171, 175, 176),
    ("flash_attention", 64, True): (88, 119, 140, 156, 165, 171),
    ("flash_attention", 128, False): (151, 173, 187, 196, 201, 203),
    ("flash_attention", 128, True): (99, 133, 155, 173, 182, 189),
    ("xformers_attention", 64, False): (68, 73, 76, 77, 75, 75),
    ("xformers_attention", 64, True): (51, 60, 66, 68, 69, 67),
    ("xformers_attention", 128, False): (83, 91, 95, 96, 97, 98),
    ("xformers_attention", 128, True): (58, 72, 82, 87, 91, 92),
    ("standard_attention", 64, False): (36, 40, 43, 45, 46, None),
    ("standard_attention", 64, True): (15, 16, 17, 18, 18, None),
    ("standard_attention", 128, False): (53, 67, 76, 79, 86, None),
    ("standard_attention", 128, True): (23, 28, 32, 32, 34, None),
}
HELD_OUT = {("standard_attention", 64, True), ("standard_attention", 128, True)}
"""The entries that are not inputs of the profile's pricing (the causal standard chain)."""


def work(length: int, head_dim: int) -> float:
    """The benchmark's forward FLOPs W = 4·B·H·L²·d (full products)."""
    return 4 * (TOKENS // length) * (CHANNELS // head_dim) * length * length * head_dim


def core(length: int, head_dim: int, causal: bool, fused: frozenset[str]):
    """(forward, backward) of one attention layer in the benchmark's configuration."""
    layer = build_model("a", "fp16", (length, CHANNELS), "tokens", [
        {"name": "a", "type": "attention", "heads": CHANNELS // head_dim, "causal": causal, "bias": False}]).layers[0]
    cost = layer_cost(layer, TOKENS // length, "fp16", fused)
    return cost.forward, cost.backward_data


def unfused_seconds(device, length: int, head_dim: int, causal: bool) -> float:
    """The unfused chain's forward and backward as dlsim prices them, the projections left out: the
    benchmark's non-causal chain is baddbmm (scale as alpha) and softmax, one kernel each way as
    `scale_mask_softmax` counts them; its causal chain adds the mask as one more kernel reading and
    writing the scores (its backward passes the gradient through)."""
    seconds = 0.0
    for name, p in zip(("forward", "backward_data"), core(length, head_dim, False, frozenset({"scale_mask_softmax"}))):
        projections = sum(gemm_seconds(g, device, "fp16") for g in p.gemms if g.count == 1)
        seconds += price_pass(p, "attention", name, device, "fp16").seconds - projections
    if causal:
        scores = (TOKENS // length) * (CHANNELS // head_dim) * length * length
        seconds += roofline_time(0.0, 2 * 2 * scores, device, "fp16", matrix=False).seconds
    return seconds


def predicted_tflops(device, kernel: str, length: int, head_dim: int, causal: bool) -> float:
    """dlsim's TFLOP/s for the benchmark's configuration, counted as the benchmark counts them."""
    if kernel == "standard_attention":
        seconds = unfused_seconds(device, length, head_dim, causal)
    else:
        seconds = sum(flash_seconds(p, device, "fp16").seconds
                      for p in core(length, head_dim, causal, frozenset({kernel})))
    return 3.5 * work(length, head_dim) / (2 if causal else 1) / seconds / 1e12


def rows(device) -> list[dict]:
    out = []
    for (kernel, head_dim, causal), published in FA2_FIGURE_4.items():
        for length, tflops in zip(LENGTHS, published):
            if tflops is None:
                continue
            p = predicted_tflops(device, kernel, length, head_dim, causal)
            out.append({"kernel": kernel, "head_dim": head_dim, "causal": causal, "seq": length,
                        "published_tflops": tflops, "dlsim_tflops": p, "error": p / tflops - 1,
                        "held_out": (kernel, head_dim, causal) in HELD_OUT})
    return out


def summary(table: list[dict]) -> dict:
    def stats(sel):
        errs = [abs(r["error"]) for r in sel]
        return {"entries": len(errs), "median_abs_error": statistics.median(errs), "max_abs_error": max(errs)}
    return {"inputs": stats([r for r in table if not r["held_out"]]),
            "held_out": stats([r for r in table if r["held_out"]])}


def markdown(table: list[dict], summ: dict) -> str:
    intro = ("Generated by `python benchmarks/validate_attention_kernels.py --report`. Published: FlashAttention-2's "
             "Figure 4 (Dao 2023, arXiv 2307.08691), forward + backward TFLOP/s on A100 80GB SXM4, fp16, 16k tokens, "
             "2048 channels. dlsim: the `dgx-a100` profile. The flash kernels and the non-causal standard chain are "
             "the profile's inputs (reproduced by construction, within the launch overhead dlsim adds: "
             "`dlsim.cost.flash`, `dlsim.cost.unfused`); the causal standard chain is held out: the unfused core's "
             "GEMM rate from the non-causal chain, its softmax, copies and the added mask priced by the roofline.")
    totals = (f"Inputs: {summ['inputs']['entries']} entries, median |error| {summ['inputs']['median_abs_error']:.1%}, "
              f"worst {summ['inputs']['max_abs_error']:.1%}. Held out: {summ['held_out']['entries']} entries, median "
              f"|error| {summ['held_out']['median_abs_error']:.1%}, worst {summ['held_out']['max_abs_error']:.1%} "
              "(all fast: the benchmark also builds the L x L mask in fp32 and casts it on every call, which dlsim "
              "does not count).")
    lines = ["# dlsim's attention kernels against FlashAttention-2's A100 benchmark", "", intro, "", totals, "",
             "| kernel | head dim | causal | sequence | published TFLOP/s | dlsim TFLOP/s | error | held out |",
             "|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['kernel']} | {r['head_dim']} | {'yes' if r['causal'] else 'no'} | {r['seq']} | "
                     f"{r['published_tflops']} | {r['dlsim_tflops']:.1f} | {r['error']:+.1%} | "
                     f"{'yes' if r['held_out'] else ''} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", action="store_true", help="write reports/validation-attention-a100.md/.json")
    args = parser.parse_args()
    table = rows(load_profile("dgx-a100").device)
    record = {"profile": "dgx-a100", "source": "FlashAttention-2 (arXiv 2307.08691) Figure 4", "summary": summary(table),
              "rows": table}
    text = json.dumps(record, indent=1)
    print(text)
    if args.report:
        (ROOT / "reports" / "validation-attention-a100.json").write_text(text + "\n")
        (ROOT / "reports" / "validation-attention-a100.md").write_text(markdown(table, record["summary"]))


if __name__ == "__main__":
    main()
