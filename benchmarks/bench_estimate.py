"""Speed of `dlsim estimate` (issue 2 acceptance: resnet50 and gpt2 on dgx-h100 under one second).

Prints JSON: for each case the wall time of the whole CLI process (python start-up included,
median of repeats) and of the in-process API call, and whether the case fits in device memory (the
CLI prints the estimate and exits with 1 when it does not: gpt3-175b on one H100).
Usage: python benchmarks/bench_estimate.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CASES = [("resnet50", 64), ("gpt2", 8), ("gpt3-175b", 1), ("vgg16", 64), ("bert-large", 16)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cluster", default="dgx-h100")
    args = parser.parse_args()
    from dlsim.api.estimate import estimate
    from dlsim.io.paths import list_models
    known = {p.stem for p in list_models()}
    results = []
    for model, batch in CASES:
        if model not in known:
            continue
        cmd = [sys.executable, "-m", "dlsim", "estimate", model, "--cluster", args.cluster, "--batch", str(batch)]
        cli_times, api_times, fits = [], [], True
        for _ in range(args.repeats):
            start = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            cli_times.append(time.perf_counter() - start)
            if proc.returncode not in (0, 1) or "iteration time" not in proc.stdout:
                raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-300:]}")
            fits = proc.returncode == 0
            start = time.perf_counter()
            r = estimate(model, args.cluster, batch)
            api_times.append(time.perf_counter() - start)
        results.append({"model": model, "batch": batch, "layers": len(r.layers), "fits": fits,
                        "cli_wall_s_median": statistics.median(cli_times), "cli_wall_s_max": max(cli_times),
                        "api_s_median": statistics.median(api_times),
                        "predicted_iteration_time_s": r.iteration_time_s})
    print(json.dumps({"benchmark": "estimate", "cluster": args.cluster, "repeats": args.repeats,
                      "cases": results}, indent=2))


if __name__ == "__main__":
    main()
