"""How well does a flushed GEMM timing repeat on this machine, and can the timing method make it repeat better?

Held-out GEMM shapes (`dlsim.validate.compute_heldout.heldout_gemms`, the validation's own draw) are timed
in `--passes` shuffled passes, each timing the minimum of `--repeats` calls (the calibration's timer and
statistic). The *repeatability* of a method is the median over shapes of |log(min of the first half of the
passes / min of the second half)|: the error a perfect lookup would show if the table and the validation
were each one of those halves. Methods (what runs, outside the timing, before each timed call):

* `flush`        — rewrite a buffer of twice the last-level cache (the calibration's method),
* `flush+tiny`   — the flush, then an 8×8×8 GEMM on other operands (brings the BLAS entry code back),
* `flush+mid`    — the flush, then a 96×96×96 GEMM on other operands,
* `flush+decoy`  — the flush, then the same GEMM shape on other operands (kernel code and the library's
  packing buffers warm, the timed operands still cold),
* `flush/ref256` — the flush method divided by a 256³ reference GEMM timed right before and after the
  kernel (geometric mean): whether a paired reference cancels the machine's speed state.

Prints one JSON object (per method: repeatability overall and by FLOP range, and the median time
relative to `flush`). Reading: reports/validation-cpu.md, section "Session 5".

    flock -x /tmp/dlsim-measure.lock python reports/archive/validation-cpu/gemm_noise_probe.py --seed 6 --gemms 80 --passes 6
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "reports" / "archive" / "comm-validation"))  # emulated_probe.one_line_errors

from emulated_probe import one_line_errors  # noqa: E402

BINS = ((1e5, "<1e5"), (1e7, "1e5-1e7"), (1e9, "1e7-1e9"), (math.inf, ">=1e9"))


def flop_bin(flops: float) -> str:
    return next(label for edge, label in BINS if flops < edge)


def repeatability(samples: list[list[float]], flops: list[float]) -> dict:
    half = len(samples[0]) // 2
    spread = [abs(math.log(min(s[:half]) / min(s[half:]))) for s in samples]
    by_bin: dict[str, list[float]] = {}
    for value, f in zip(spread, flops):
        by_bin.setdefault(flop_bin(f), []).append(value)
    return {"median": round(statistics.median(spread), 4),
            "by_flops": {b: {"shapes": len(v), "median": round(statistics.median(v), 4)} for b, v in by_bin.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=str(ROOT / "hardware_profiles" / "cpu-epyc-2core"))
    ap.add_argument("--seed", type=int, default=6)
    ap.add_argument("--gemms", type=int, default=80)
    ap.add_argument("--passes", type=int, default=6, help="at least 2 (the passes are split in two halves)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the JSON (with every sample) here")
    args = ap.parse_args()
    if args.passes < 2 or args.gemms < 1 or args.repeats < 1:
        ap.error("--passes must be at least 2, --gemms and --repeats at least 1")

    import torch
    from dlsim.calibrate.compute_ops import gemm_fn
    from dlsim.calibrate.compute_timer import KernelTimer, cache_flusher, set_threads, warm_allocator
    from dlsim.cost.layers import Gemm
    from dlsim.io.kernel_tables import read_table
    from dlsim.io.profile_yaml import load_profile
    from dlsim.validate.compute_heldout import heldout_gemms

    set_threads(args.threads)
    warm_allocator()
    cpu = torch.device("cpu")
    cluster = load_profile(args.profile)
    held = heldout_gemms(read_table("gemm", cluster.tables["gemm"]), "fp32", args.gemms, args.seed)
    flops = [2.0 * g.m * g.n * g.k for g in held]
    flush = cache_flusher("cpu")

    def then(fn):
        return lambda: (flush(), fn())

    warmers = {"flush": flush, "flush+tiny": then(gemm_fn(Gemm(8, 8, 8), "fp32", cpu)),
               "flush+mid": then(gemm_fn(Gemm(96, 96, 96), "fp32", cpu))}
    kernels = [gemm_fn(g, "fp32", cpu) for g in held]
    decoy_ops = []
    for g in held:  # operands made once, outside the timing
        a, b = torch.randn(g.m, g.k), torch.randn(g.k, g.n)
        decoy_ops.append(then(lambda a=a, b=b: torch.mm(a, b)))
    reference = gemm_fn(Gemm(256, 256, 256), "fp32", cpu)
    methods = list(warmers) + ["flush+decoy", "flush/ref256"]
    samples = {m: [[] for _ in held] for m in methods}
    jobs = [(i, m) for i in range(len(held)) for m in methods if m != "flush/ref256"]
    rng = random.Random(args.seed)

    def timed(fn, warm) -> float:
        return KernelTimer("cpu", repeats=args.repeats, statistic="min", flush=warm).time(fn).seconds

    for p in range(args.passes):
        rng.shuffle(jobs)
        for i, m in jobs:
            if m == "flush":
                before = timed(reference, flush)
                t = timed(kernels[i], flush)
                after = timed(reference, flush)
                samples["flush/ref256"][i].append(t / math.sqrt(before * after))
            else:
                t = timed(kernels[i], decoy_ops[i] if m == "flush+decoy" else warmers[m])
            samples[m][i].append(t)
        print(f"pass {p + 1}/{args.passes}", file=sys.stderr)

    result = {"profile": args.profile, "seed": args.seed, "gemms": len(held), "passes": args.passes,
              "repeats": args.repeats, "threads": args.threads, "methods": {}}
    for m in methods:
        entry = {"repeatability": repeatability(samples[m], flops)}
        if m not in ("flush", "flush/ref256"):
            ratio = [min(s) / min(f) for s, f in zip(samples[m], samples["flush"])]
            entry["time_vs_flush"] = round(statistics.median(ratio), 3)
        result["methods"][m] = entry
    print(json.dumps(result, indent=1))
    if args.out:
        full = {**result, "shapes": [[g.m, g.n, g.k] for g in held], "samples_s": samples}
        Path(args.out).write_text(json.dumps(full))


if __name__ == "__main__":
    one_line_errors(main)
