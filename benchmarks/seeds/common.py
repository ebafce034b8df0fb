"""Shared helpers of the seeds' reproductions (`python benchmarks/seeds_reproduce.py NAME`).

Each reproduction runs dlsim's own commands (`dlsim compare`, `comm`, `plan microbatch`,
`simulate`, in a subprocess, exactly as a user types them) or its Python API, keeps their JSON
records, draws its figure with dlsim's plotting code (`dlsim.report`) and writes a markdown report
with the seed's number beside the simulated one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

from dlsim.io.files import write_atomic
from dlsim.report.compare_plots import close, save_figure
from dlsim.report.series_plots import series_figure

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ROOT / "reports" / "seeds"          # the reproductions' inputs: models and variant profiles
REPORTS = ROOT / "reports"
KNEE_EFFICIENCY = 0.9                       # the knee: first size whose parallel efficiency is below 90%
STACK = "eager"
"""The software stack every reproduction names (`--stack eager`, stacks/eager.yaml): the seeds' systems
(cuda-convnet, Caffe, CNTK, TensorFlow 1.x) ran unfused kernels in the model's own precision (fp32), so a
new default stack (bf16, flash attention, ...) never changes what these reports reproduce."""


def dlsim_cli(*args: str) -> str:
    """Run ``python -m dlsim ARGS`` (the CLI a user runs) and return its stdout; its error line on failure."""
    proc = subprocess.run([sys.executable, "-m", "dlsim", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"dlsim {' '.join(map(str, args))} failed: {proc.stderr.strip()[-400:]}")
    return proc.stdout


def cli_json(path: Path, *args: str) -> dict[str, Any]:
    """Run a dlsim command with ``--json PATH --force`` and read the record it wrote."""
    dlsim_cli(*args, "--json", str(path), "--force")
    return json.loads(path.read_text())


TOLERANCE = 0.15
"""A reproduction agrees when dlsim is within 15% of the seed's number (issue 32); outside, it states why."""


def compared(what: str, seed: float | tuple[float, float], dlsim: float, reason: str = "",
             caveat: str = "") -> dict[str, Any]:
    """One seed number (or a (low, high) range) beside dlsim's: the relative error (0 inside a range) and,
    where it exceeds `TOLERANCE`, the measured reason (which the index requires); `caveat` what an
    agreement rests on that the seeds do not give (printed either way)."""
    lo, hi = seed if isinstance(seed, tuple) else (seed, seed)
    error = 0.0 if lo <= dlsim <= hi else dlsim / (lo if dlsim < lo else hi) - 1
    within = abs(error) <= TOLERANCE
    return {"what": what, "seed": list(seed) if isinstance(seed, tuple) else seed, "dlsim": dlsim, "error": error,
            "within": within, "reason": "" if within else reason, "caveat": caveat}


def rel(path: Path) -> str:
    """`path` relative to the repository (as the reports print it)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def save_series(rec: dict[str, Any], out: Path, name: str) -> Path:
    """Write the ``series`` record to OUT/NAME.json and its figure (dlsim.report.series_plots) to OUT/NAME.png."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"{name}.json", json.dumps(rec, indent=1) + "\n")
    fig = series_figure(rec)
    save_figure(fig, out / f"{name}.png")
    close(fig)
    return out / f"{name}.png"


def write_report(out: Path, name: str, lines: Iterable[str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.md"
    write_atomic(path, "\n".join(lines).rstrip() + "\n")
    return path


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A markdown table."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def knee(xs: Sequence[float], efficiencies: Sequence[float | None], threshold: float = KNEE_EFFICIENCY) -> float | None:
    """The first x whose efficiency is below `threshold` (None: the curve never drops below it)."""
    for x, e in zip(xs, efficiencies):
        if e is not None and e < threshold:
            return x
    return None


def header(title: str, name: str, summary: str) -> list[str]:
    return [f"# {title}", "",
            f"Regenerate: `python benchmarks/seeds_reproduce.py {name}` (writes `reports/seeds/{name}.md`, "
            f"`{name}.png` and the records `{name}*.json`; index: `reports/seeds-reproduced.md`).", "",
            summary, ""]
