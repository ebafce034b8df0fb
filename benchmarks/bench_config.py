"""Load time of the configuration files: a hardware profile, zoo models, a strategy file and a sweep
spec, each read, validated and converted into its frozen dataclass; prints one JSON record.

Per case: the median and the minimum of `--repeats` timed loads (seconds), after one warm-up load
(which pays the imports). Also the strategy validation the search runs per candidate
(`dlsim.spec.strategy.make_strategy`), in microseconds. Run:
``python benchmarks/bench_config.py [--repeats 30] [--json-out F]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _time(fn, repeats: int) -> dict[str, float]:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "min_s": min(times), "repeats": repeats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    import yaml

    from dlsim.io.model_yaml import load_model
    from dlsim.io.profile_yaml import load_profile
    from dlsim.io.strategy_yaml import load_strategy
    from dlsim.io.sweep_spec import load_sweep
    from dlsim.spec.strategy import make_strategy

    cases = {
        "profile dgx-h100": lambda: load_profile("dgx-h100"),
        "profile cpu-epyc-2core": lambda: load_profile("cpu-epyc-2core"),
        "model gpt2": lambda: load_model("gpt2"),
        "model resnet50": lambda: load_model("resnet50"),
        "profile dgx-h100 + model gpt2": lambda: (load_profile("dgx-h100"), load_model("gpt2")),
        "strategy examples/gpt3-megatron-3d.yaml": lambda: load_strategy(ROOT / "examples/gpt3-megatron-3d.yaml"),
        "sweep examples/sweeps/gpt2-llama3-8b.yaml": lambda: load_sweep(ROOT / "examples/sweeps/gpt2-llama3-8b.yaml"),
    }
    record: dict = {"benchmark": "config load", "libyaml": bool(getattr(yaml, "__with_libyaml__", False)),
                    "cases": {name: _time(fn, args.repeats) for name, fn in cases.items()}}
    fields = dict(dp=8, tp=2, pp=2, microbatch_size=1, num_microbatches=8, schedule="1f1b", zero=1,
                  fused_kernels=("scale_mask_softmax",), recompute="selective")
    timed = _time(lambda: [make_strategy(**fields) for _ in range(1000)], max(3, args.repeats // 10))
    record["make_strategy_us"] = {"median": timed["median_s"] * 1e3, "min": timed["min_s"] * 1e3}
    text = json.dumps(record, indent=2)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
