"""Accuracy benchmark: dlsim's predicted training iteration vs real PyTorch iterations over zoo models.

    python benchmarks/bench_validation.py --cluster hardware_profiles/cpu-epyc-2core [--calibrate]
        [--models resnet18,vgg16] [--threads 2] [--repeats 5] [--statistic min] [--rounds 5]
        [--out reports/validation-cpu]

With --rounds R the models' iterations are timed interleaved (round robin, R rounds; short models
get more iterations per round) so that drift of a shared machine hits every model alike, each model
in a process of its own as a training job runs (--shared-process: all in this process); with
--statistic min each model's time is the fastest iteration (the least disturbed), to be compared
with tables calibrated with --statistic min.

With --calibrate, first runs `dlsim calibrate compute` for exactly these models and batch sizes into
the profile (resuming whatever is there) and reports how long that took. Prints one JSON record:
per model the predicted and measured iteration time and the error, per-layer error summaries, and
the median and worst absolute error over the models. With --out, also writes <out>.json (every
record, per layer), <out>.csv (one row per model) and <out>.png (the figure).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from pathlib import Path

# (model, batch, overrides): batch sizes that keep one iteration under about a second on 2 cores
ZOO = [
    ("lenet5", 64, {}),
    ("alexnet", 4, {}),
    ("resnet18", 4, {}),
    ("resnet50", 2, {}),
    ("vgg16", 2, {}),
    ("googlenet", 4, {}),
    ("densenet121", 2, {}),
    ("bert-base", 2, {"seq_len": 128}),
    ("gpt2", 2, {"seq_len": 128}),
]


def load() -> float:
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--models", default=",".join(m for m, _, _ in ZOO))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--grid", action="store_true", help="with --calibrate: also the generic grids")
    ap.add_argument("--statistic", choices=("median", "min"), default="median")
    ap.add_argument("--no-flush-cache", action="store_true", help="with --calibrate: time kernels back to back")
    ap.add_argument("--rounds", type=int, default=0,
                    help="time the models interleaved, round robin, this many rounds (0: one model after another); "
                         "--repeats is then the number of hooked per-layer iterations")
    ap.add_argument("--warm", choices=("auto", "none", "all"), default="auto", help="with --calibrate: warm tables")
    ap.add_argument("--shared-process", action="store_true",
                    help="with --rounds: time all models in this one process (default: one process per model)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from dlsim.api.calibrate_compute import calibrate_compute
    from dlsim.api.validate import validate_model
    chosen = [z for z in ZOO if z[0] in args.models.split(",")]
    record: dict = {"kind": "bench-validation", "cluster": args.cluster, "command": " ".join(sys.argv),
                    "statistic": args.statistic,
                    "load_average_start": load()}
    if args.calibrate:
        start = time.perf_counter()
        overrides = {k: v for _, _, o in chosen for k, v in o.items()}
        cal = calibrate_compute(args.cluster, models=[m for m, _, _ in chosen], batches=[b for _, b, _ in chosen],
                                overrides=overrides, grid=args.grid, threads=args.threads, statistic=args.statistic,
                                flush_cache=not args.no_flush_cache, warm=args.warm,
                                command="benchmarks/bench_validation.py --calibrate")
        record["calibration"] = {"seconds": time.perf_counter() - start, "measured": cal["measured"],
                                 "already_measured": cal["already_measured"], "failed": cal["failed"]}
    results = []
    if args.rounds:
        from dlsim.api.validate import validate_models
        results = validate_models(chosen, args.cluster, rounds=args.rounds, threads=args.threads,
                                  statistic=args.statistic, per_layer_repeats=args.repeats,
                                  isolate=not args.shared_process,
                                  progress=lambda s: print(f"{s} (load {load():.2f})", file=sys.stderr))
        record["rounds"] = args.rounds
        record["process"] = "shared by all models" if args.shared_process else "one per model"
    else:
        for name, batch, overrides in chosen:
            results.append(validate_model(name, args.cluster, batch, overrides=overrides, threads=args.threads,
                                          repeats=args.repeats, statistic=args.statistic))
    for rec in results:
        name, batch = rec["model"], rec["batch"]
        print(f"{name} b{batch}: predicted {rec['predicted']['iteration_s']:.4f} s, measured "
              f"{rec['measured']['iteration_s']:.4f} s, error {100 * rec['error']['iteration']:+.1f}%", file=sys.stderr)
    record["load_average_end_of_timing"] = load()
    errors = [abs(r["error"]["iteration"]) for r in results]
    record.update({
        "load_average_end": load(),
        "models": [{"model": r["model"], "batch": r["batch"], "predicted_s": r["predicted"]["iteration_s"],
                    "measured_s": r["measured"]["iteration_s"], "error": r["error"]["iteration"],
                    "phase_errors": r["error"], "measured_spread": r["measured"]["spread"],
                    "measured_share": r["measured_share"], "threads": r["threads"],
                    "per_layer_median_abs_error": r["per_layer"]["layers_over_1pct"].get("median_abs"),
                    "per_layer_time_weighted_abs_error": r["per_layer"]["time_weighted_abs_error"]}
                   for r in results],
        "median_abs_error": statistics.median(errors) if errors else None,
        "worst_abs_error": max(errors) if errors else None,
    })
    if args.out:
        from dlsim.report.validation_plots import plot_zoo_validation
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps({**record, "records": results}, indent=1) + "\n")
        with open(out.with_suffix(".csv"), "w", newline="") as handle:
            w = csv.writer(handle)
            w.writerow(["model", "batch", "predicted_s", "measured_s", "error", "forward_error", "backward_error",
                        "optimizer_error", "per_layer_median_abs_error", "measured_spread"])
            for m in record["models"]:
                pe = m["phase_errors"]
                w.writerow([m["model"], m["batch"], f"{m['predicted_s']:.6g}", f"{m['measured_s']:.6g}",
                            f"{m['error']:.4f}", f"{pe['forward']:.4f}", f"{pe['backward']:.4f}",
                            f"{pe['optimizer']:.4f}", f"{m['per_layer_median_abs_error'] or float('nan'):.4f}",
                            f"{m['measured_spread']:.4f}"])
        plot_zoo_validation(results, out.with_suffix(".png"))
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
