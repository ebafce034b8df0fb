"""Fuzz every reader and command of dlsim (issue 16) and print JSON counts.

    python benchmarks/fuzz.py --cases 10000 [--seed 0] [--workers 8]

Each case (tests/fuzzkit.py: mutated model, profile and strategy YAML, benchmark CSV, --set values,
command-line flags and units, output paths) runs in-process in a worker under a 10 s alarm and a
4 GiB address-space limit. Prints {"cases", "tracebacks", "runs_over_10s", "invalid_accepted",
"non_finite_outputs", "error_lines_over_300_chars", ...} and the first few failures; all five
counts must be 0.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fuzzkit import make_case, run_case, summarize  # noqa: E402


def _init() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))


def _one(args: tuple[int, int]) -> dict:
    seed, index = args
    rng = random.Random(seed * 1_000_003 + index)
    with tempfile.TemporaryDirectory() as folder:
        argv, invalid = make_case(rng, Path(folder))
        outcome = run_case(argv, invalid)
    outcome["argv"] = [a[:100] for a in argv]
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=min(8, multiprocessing.cpu_count()))
    args = parser.parse_args()
    with multiprocessing.get_context("fork").Pool(args.workers, initializer=_init, maxtasksperchild=200) as pool:
        outcomes = pool.map(_one, [(args.seed, i) for i in range(args.cases)], chunksize=20)
    counts = summarize(outcomes)
    counts["seed"] = args.seed
    keys = ("traceback", "slow", "invalid_accepted", "non_finite", "long_error")
    counts["examples"] = [{"argv": o["argv"], "problem": [k for k in keys if o[k]], "code": o["code"],
                           "detail": o.get("exception") or o["stderr"][-200:]}
                          for o in outcomes if any(o[k] for k in keys)][:10]
    print(json.dumps(counts, indent=2))


if __name__ == "__main__":
    main()
