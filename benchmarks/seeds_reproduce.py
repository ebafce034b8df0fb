"""The seeds' results, reproduced with dlsim (issue 14 item 4): one report per result in reports/seeds/.

Usage: python benchmarks/seeds_reproduce.py [NAME ...|all] [--tiny] [--out DIR]

NAME is one of dp-knee, distbelief, ps-allreduce, compression, crossover, staleness, microbatch, dryden
(`all`, the default, runs every one and rewrites the index reports/seeds-reproduced.md). Each writes
reports/seeds/NAME.md (the seed's numbers beside the simulated ones, the commands, why they
disagree), NAME.png (drawn by dlsim's plotting code) and the JSON records it was drawn from.
`--tiny` runs a reduced size into --out (the tests use it) and writes no markdown. Prints a JSON
summary of the numbers compared.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "seeds"))

from common import REPORTS, SEEDS, write_report  # noqa: E402

NAMES = {"dp-knee": "dp_knee", "distbelief": "distbelief", "ps-allreduce": "ps_allreduce",
         "compression": "compression", "crossover": "crossover", "staleness": "staleness",
         "microbatch": "microbatch", "dryden": "dryden"}


def reproduce(name: str, out: Path = SEEDS, tiny: bool = False) -> dict:
    """Run one reproduction; its summary (the numbers its report compares)."""
    if name not in NAMES:
        raise SystemExit(f"error: unknown reproduction {name!r} (use {', '.join(NAMES)} or all)")
    return importlib.import_module(NAMES[name]).run(out, tiny)


def write_index(results: dict[str, dict]) -> None:
    """reports/seeds-reproduced.md: one row per reproduction, with its regenerate command."""
    rows = ["| reproduction | seed | dlsim | report | regenerate |", "|---|---|---|---|---|"]
    for name in NAMES:
        mod = importlib.import_module(NAMES[name])
        seed, sim = mod.headline(results[name]) if name in results else ("", "")
        rows.append(f"| {mod.TITLE} | {seed} | {sim} | [seeds/{name}.md](seeds/{name}.md) | "
                    f"`python benchmarks/seeds_reproduce.py {name}` |")
    write_report(REPORTS, "seeds-reproduced", [
        "# The seeds' results, reproduced", "",
        "Each row is one published result of the seeds (the Ben-Nun & Hoefler survey and the lectures in "
        "`/work/shared/seeds`, indexed in seeds-inventory.md) beside what dlsim simulates from its profiles "
        "(datasheets and published microbenchmarks; nothing tuned to the seed's number). Each report gives the "
        "dlsim commands, the figure and why the two disagree where they do. "
        "`python benchmarks/seeds_reproduce.py` regenerates all of them and this index.", "", *rows])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=["all"])
    ap.add_argument("--tiny", action="store_true", help="reduced sizes, no markdown (tests)")
    ap.add_argument("--out", type=Path, default=SEEDS, help="output folder (default reports/seeds)")
    args = ap.parse_args(argv)
    names = list(NAMES) if args.names == ["all"] else args.names
    results = {n: reproduce(n, args.out, args.tiny) for n in names}
    if args.names == ["all"] and not args.tiny and args.out == SEEDS:
        write_index(results)
    print(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
