"""Fuzz every reader and command of dlsim (issues 16, 29) and print JSON counts.

    python benchmarks/fuzz.py --cases 10000 [--seed 0] [--workers 8] [--kinds indirect,special]

Each case (tests/fuzzkit.py: mutated model, profile and strategy YAML, benchmark CSV, --set values,
command-line flags and units, output paths; tests/fuzz_attacks.py: outputs aimed at inputs reached
indirectly, special files and impossible names, two sweeps writing one results file, resumed results
damaged by hand, every command's bounds) runs in-process in a worker under a 10 s CPU limit and a
4 GiB address-space limit, in a folder of its own. Prints {"cases", "tracebacks", "internal_errors",
"runs_over_10s_cpu", "invalid_accepted", "non_finite_outputs", "error_lines_over_300_chars",
"inputs_changed", "special_files_replaced", "results_lost_or_duplicated", ...}, every one of which
must be 0, the cases by kind, and the first few failures.
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

import fuzzkit  # noqa: E402
from fuzzkit import failed, make_case, run_case, summarize  # noqa: E402


def _init() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))


def _one(args: tuple[int, int, tuple[str, ...]]) -> dict:
    seed, index, kinds = args
    rng = random.Random(seed * 1_000_003 + index)
    if kinds:
        fuzzkit.KINDS = kinds
    with tempfile.TemporaryDirectory() as folder:
        try:
            case = make_case(rng, Path(folder))
        except Exception as exc:  # noqa: BLE001  (the generator's own failure: reported, not a dlsim defect)
            return {"kind": "generator", "generator_error": f"{type(exc).__name__}: {exc}"[:200], "code": None,
                    **{k: False for k in fuzzkit.COUNTERS}, "argv": []}
        outcome = run_case(case, Path(folder))
    outcome["argv"] = [a[:100] for a in case.argv]
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=min(8, multiprocessing.cpu_count()))
    parser.add_argument("--kinds", default="", help="Only these kinds of case, comma-separated (classic, "
                                                  + ", ".join(fuzzkit.ATTACKS) + ").")
    args = parser.parse_args()
    kinds = tuple(k for k in args.kinds.split(",") if k)
    with multiprocessing.get_context("fork").Pool(args.workers, initializer=_init, maxtasksperchild=200) as pool:
        outcomes = pool.map(_one, [(args.seed, i, kinds) for i in range(args.cases)], chunksize=10)
    counts = summarize(outcomes)
    counts["seed"] = args.seed
    counts["generator_errors"] = sum(bool(o.get("generator_error")) for o in outcomes)
    counts["examples"] = [{"argv": o["argv"], "kind": o["kind"], "problem": [k for k in fuzzkit.COUNTERS if o[k]],
                           "code": o["code"], "detail": o.get("detail") or o.get("exception") or o["stderr"][-200:]}
                          for o in outcomes if failed(o)][:12]
    counts["generator_examples"] = [o["generator_error"] for o in outcomes if o.get("generator_error")][:3]
    print(json.dumps(counts, indent=2))


if __name__ == "__main__":
    main()
