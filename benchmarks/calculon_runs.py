"""Calculon's predictions for the 8 Megatron-LM runs of Korthikanti et al. 2022, Table 5.

Calculon: Isaev et al., "Calculon: a Methodology and Tool for High-Level Co-Design of Systems and
Large Language Models", SC'23 (github.com/calculon-ai/calculon).

Runs: GPT 22B, 175B, 530B and 1T, each with full recomputation ("full") and with sequence
parallelism + selective recomputation ("seq+sel"). Every setting comes from the Calculon checkout
itself, as its own `calculon llm-validation` uses them: the model from models/<model>.json, the run
(parallelism, batch, recomputation) from validation/seqsel/tab5/<model>_{full,seqsel}.json, and the
machine from systems/a100_80g.json. Nothing here is tuned.

Per run: Calculon's iteration time (its `total_time`), activation memory per GPU (`act_space` +
`act_checkpoint_size`: stored activations plus full-recompute checkpoints), total memory per GPU
(`proc_mem_tier1_cap_req`) and whether that fits the system's memory (Calculon raises when not).

Calculon is imported lazily, so dlsim does not depend on it. It needs numpy, pandas and psutil.

Usage: python benchmarks/calculon_runs.py --calculon PATH   (prints JSON)
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path

GIB = 1024**3
MODELS = ["megatron-22B", "gpt3-175B", "turing-530B", "megatron-1T"]
MODES = {"full": "full", "seqsel": "seq+sel"}  # Calculon's file suffix -> our run label


def _import_calculon(checkout: Path):
    if not (checkout / "validation" / "seqsel" / "tab5").is_dir():
        raise ImportError(f"no Calculon checkout at {checkout} (validation/seqsel/tab5 not found)")
    sys.path.insert(0, str(checkout))
    try:
        import calculon
        from calculon.llm import Llm
    except ImportError as exc:
        raise ImportError(f"cannot import calculon from {checkout}: {exc}") from None
    return calculon, Llm


def run_calculon(checkout: str) -> list[dict]:
    """Run Calculon on the 8 Table 5 runs; one dict per run, in Table 5 order."""
    root = Path(checkout).resolve()
    calculon, Llm = _import_calculon(root)
    system = calculon.System(calculon.read_json_file(str(root / "systems" / "a100_80g.json")))
    log = logging.getLogger("calculon")
    results = []
    for model in MODELS:
        app = Llm.Application(calculon.read_json_file(str(root / "models" / f"{model}.json")))
        for suffix, label in MODES.items():
            exe_file = root / "validation" / "seqsel" / "tab5" / f"{model}_{suffix}.json"
            exe = Llm.Execution.from_json(calculon.read_json_file(str(exe_file)))
            llm = Llm(app, log)
            llm.compile(system, exe)
            try:
                llm.run(system)
                fits = True
            except Llm.Error:  # raised only by the memory-capacity check, after all stats are computed
                fits = False
            results.append({
                "run": f"{model.split('-')[1]} {label}",
                "time_s": llm.get_total_time(),
                "activation_gib": (llm.get_act_space() + llm.get_act_checkpoint_size()) / GIB,
                "total_memory_gib": llm.get_mem_tier1_cap_req() / GIB,
                "fits": fits,
            })
    return results


def checkout_commit(checkout: str) -> str | None:
    """The checkout's git commit, if it is a git work tree."""
    try:
        out = subprocess.run(["git", "-C", checkout, "rev-parse", "--show-toplevel", "HEAD"],
                             capture_output=True, text=True)
    except OSError:
        return None
    lines = out.stdout.split()
    if out.returncode or len(lines) != 2 or Path(lines[0]).resolve() != Path(checkout).resolve():
        return None
    return lines[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calculon", metavar="PATH", required=True, help="a Calculon checkout")
    parser.add_argument("--commit", help="Calculon's commit, when PATH is not a git work tree")
    args = parser.parse_args()
    runs = run_calculon(args.calculon)
    record = {"tool": "Calculon (Isaev et al., SC'23), github.com/calculon-ai/calculon",
              "commit": args.commit or checkout_commit(args.calculon),
              "system": "systems/a100_80g.json", "settings": "validation/seqsel/tab5/*.json, models/*.json",
              "runs": runs}
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
