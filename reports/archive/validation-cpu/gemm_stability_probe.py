"""How repeatable is a GEMM time on this machine, and where does MKL switch kernels? Prints JSON.

    python reports/archive/validation-cpu/gemm_stability_probe.py [--state-seconds 20] [--sweep-dim 1024] [--out FILE]

Two probes, both with PyTorch's default thread count (one per core), the way calibration times:

* state: a 1024x1024x1024 fp32 GEMM, warm (no flush), in windows of 10 back-to-back calls every
  0.5 s for `--state-seconds`; per window the throughput of the fastest and the median call.
  On a shared VM the windows fall into distinct speed states (a vCPU descheduled, an SMT sibling
  busy), which no per-kernel statistic over a few seconds can remove.
* sweep: one dimension at a time from 1 to 40 (and 48, 56, 64) with the other two at `--sweep-dim`,
  each GEMM timed after a cache flush as calibration does (min over 3 shuffled passes x 2 calls).
  A smooth curve can be interpolated; jumps between neighbouring sizes are kernel switches that
  a table on a power-of-two grid cannot see.

Run it under the measurement lock on a shared machine (`flock -x /tmp/dlsim-measure.lock ...`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

SWEEP_VALUES = tuple(range(1, 41)) + (48, 56, 64)


def state_probe(seconds: float) -> list[dict[str, float]]:
    """Throughput (FLOP/s) of the fastest and the median of 10 back-to-back calls, every 0.5 s."""
    import torch
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    flops = 2.0 * 1024**3
    windows, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        calls = []
        for _ in range(10):
            start = time.perf_counter()
            torch.mm(a, b)
            calls.append(time.perf_counter() - start)
        windows.append({"best_flops_per_s": flops / min(calls), "median_flops_per_s": flops / statistics.median(calls)})
        time.sleep(0.5)
    return windows


def sweep_probe(dim: int) -> dict[str, list[dict[str, float]]]:
    """Throughput along each axis with the other two dimensions at `dim` (flushed, min over passes)."""
    import torch

    from dlsim.api.validate import _timed_in_passes
    from dlsim.calibrate.compute_ops import gemm_fn
    from dlsim.calibrate.compute_timer import KernelTimer, cache_flusher, set_threads, warm_allocator
    from dlsim.cost.layers import Gemm
    set_threads(None)
    warm_allocator()
    timer = KernelTimer("cpu", repeats=2, statistic="min", flush=cache_flusher("cpu"))
    shapes = [(axis, Gemm(**{d: (v if d == axis else dim) for d in "mnk"})) for axis in "mnk" for v in SWEEP_VALUES]
    times = _timed_in_passes([gemm_fn(g, "fp32", torch.device("cpu")) for _, g in shapes], timer, 3, "min", 0)
    out: dict[str, list[dict[str, float]]] = {axis: [] for axis in "mnk"}
    for (axis, g), t in zip(shapes, times):
        out[axis].append({"m": g.m, "n": g.n, "k": g.k, "time_s": t, "flops_per_s": g.flops / t})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state-seconds", type=float, default=20.0)
    ap.add_argument("--sweep-dim", type=int, default=1024)
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON record here")
    args = ap.parse_args()
    windows = state_probe(args.state_seconds)
    best = sorted(w["best_flops_per_s"] for w in windows)
    record = {"probe": "gemm-stability", "state": {"gemm": [1024, 1024, 1024], "windows": windows,
                                                  "best_of_windows_quartiles_flops_per_s": statistics.quantiles(best, n=4)
                                                  if len(best) > 1 else best},
              "sweep": {"other_dims": args.sweep_dim, "axes": sweep_probe(args.sweep_dim)}}
    text = json.dumps(record, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
