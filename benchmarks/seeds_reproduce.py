"""The seeds' results, reproduced with dlsim (issue 14 item 4): one report per result in reports/seeds/.

Usage: python benchmarks/seeds_reproduce.py [NAME ...|all] [--tiny] [--out DIR]

NAME is one of dp-knee, distbelief, ps-allreduce, compression, crossover, staleness, microbatch, dryden, hybrid
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "seeds"))

from common import REPORTS, SEEDS, TOLERANCE, write_report  # noqa: E402

NAMES = {"dp-knee": "dp_knee", "distbelief": "distbelief", "ps-allreduce": "ps_allreduce",
         "compression": "compression", "crossover": "crossover", "staleness": "staleness",
         "microbatch": "microbatch", "dryden": "dryden", "hybrid": "hybrid"}


def reproduce(name: str, out: Path = SEEDS, tiny: bool = False) -> dict:
    """Run one reproduction; its summary (the numbers its report compares)."""
    if name not in NAMES:
        raise SystemExit(f"error: unknown reproduction {name!r} (use {', '.join(NAMES)} or all)")
    return importlib.import_module(NAMES[name]).run(out, tiny)


def _value(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return f"{v[0]:g}-{v[1]:g}"
    return f"{v:.3g}"


def write_index(results: dict[str, dict], out: Path = REPORTS) -> None:
    """reports/seeds-reproduced.md: one row per reproduction with its regenerate command, then every seed
    number beside dlsim's with the error; a number outside `TOLERANCE` without its measured reason is an
    error (the index is not written)."""
    rows = ["| reproduction | seed | dlsim | report | regenerate |", "|---|---|---|---|---|"]
    numbers = ["| reproduction | quantity | seed | dlsim | error | agreement |", "|---|---|---|---|---|---|"]
    for name in NAMES:
        mod = importlib.import_module(NAMES[name])
        report = getattr(mod, "REPORT", f"seeds/{name}.md")
        seed, sim = mod.headline(results[name]) if name in results else ("", "")
        rows.append(f"| {mod.TITLE} | {seed} | {sim} | [{report}]({report}) | "
                    f"`python benchmarks/seeds_reproduce.py {name}` |")
        for n in (mod.numbers(results[name]) if name in results else []):
            if not n["within"] and not n["reason"]:
                raise SystemExit(f"error: {name}: {n['what']} is {n['error']:+.0%} off the seed without a reason")
            agreement = f"within {TOLERANCE:.0%}" if n["within"] else f"outside: {n['reason']}"
            if n.get("caveat"):
                agreement += f" ({n['caveat']})"
            numbers.append(f"| {mod.TITLE.split(')')[0]}) | {n['what']} | {_value(n['seed'])} | {_value(n['dlsim'])} | "
                           f"{n['error']:+.0%} | {agreement} |")
    write_report(out, "seeds-reproduced", [
        "# The seeds' results, reproduced", "",
        "Each row is one published result of the seeds (the Ben-Nun & Hoefler survey and the lectures in "
        "`/work/shared/seeds`, indexed in seeds-inventory.md) beside what dlsim simulates from its profiles "
        "(datasheets and published microbenchmarks; nothing tuned to the seed's number), on the `eager` stack "
        "(unfused kernels in the model's precision, as the seeds' frameworks ran). Each report gives the "
        "dlsim commands, the figure and why the two disagree where they do. "
        "`python benchmarks/seeds_reproduce.py` regenerates all of them and this index; "
        "tests/test_reports_fresh.py fails when a committed report differs from what its command now writes.", "",
        *rows, "",
        f"## Every seed number beside dlsim's (agreement: within {TOLERANCE:.0%}, else the measured reason)", "",
        *numbers])


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
