"""Calibrating in several shuffled passes: every kernel timed once per pass, the passes combined.

Why: on a shared or virtualised machine the noise is correlated in time. Kernels timed back to back
in one pass share the machine's state of that minute, so a disturbed minute shifts a whole region of
the table (measured on the 2-core EPYC profile: two single passes of the same 80 GEMMs, each the
minimum of 5 cache-flushed calls, differ by 12% in median; the minima of two pairs of passes by 3.9%).
Timing each kernel once per pass, the kernels in a fresh seeded random order each pass, spreads a
kernel's samples over the whole run, and the minimum (or median) over the passes is then an estimate
that one bad minute cannot move — the round-robin method `dlsim validate` uses on its side.

Layout and resume: pass ``p`` is an ordinary calibration run into ``OUT/passes/pass<p>/`` (its own
resumable tables, `dlsim.calibrate.compute_run.run_calibration`); when every pass has a kernel, the
combined row is appended to ``OUT``'s table. A row already in ``OUT``'s table is never replaced, and
a run killed at any point resumes: finished passes are skipped row by row, and the combination is
idempotent. The combined row's ``time_s`` is the statistic over the passes' times, ``iqr_s`` the
spread between passes (largest − smallest pass time), ``repeats`` the timed calls over all passes.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Callable, Sequence

from dlsim.calibrate.compute_plan import Task
from dlsim.calibrate.compute_run import FILES, Backend, RunSummary, open_tables, read_keys, run_calibration, table_file
from dlsim.calibrate.compute_timer import KernelTimer

PASSES_DIR = "passes"


def pass_dir(out_dir: Path, index: int) -> Path:
    """Where pass `index` (1-based) keeps its tables."""
    return Path(out_dir) / PASSES_DIR / f"pass{index}"


def shuffled(tasks: Sequence[Task], seed: int) -> list[Task]:
    """The tasks in a seeded random order (the same seed gives the same order on a resumed run)."""
    order = list(tasks)
    random.Random(seed).shuffle(order)
    return order


def run_passes(tasks: Sequence[Task], out_dir: Path | str, backend: Backend, timer: KernelTimer, passes: int, *,
               suffix: str = "", statistic: str = "min", seed: int = 0, device_params: bool = True,
               progress: Callable[[int, int, str, str], None] | None = None) -> RunSummary:
    """Measure `tasks` in `passes` shuffled passes and combine them into `out_dir`'s tables (module docstring).

    One pass is exactly `run_calibration` into `out_dir`. The summary counts combined rows as measured."""
    out_dir = Path(out_dir)
    if passes <= 1:
        return run_calibration(tasks, out_dir, backend, timer, device_params=device_params, suffix=suffix,
                               progress=progress)
    summary = RunSummary()
    if device_params:  # device-level numbers (launch overhead, STREAM) once, into out_dir itself
        run_calibration([], out_dir, backend, timer, device_params=True, suffix=suffix)
    for p in range(1, passes + 1):
        tagged = None
        if progress:
            tagged = lambda i, n, label, status, p=p: progress(i, n, f"pass {p}/{passes} {label}", status)
        s = run_calibration(shuffled(tasks, seed + p), pass_dir(out_dir, p), backend, timer, device_params=False,
                            suffix=suffix, progress=tagged)
        summary.failed += [f"pass {p}: {f}" for f in s.failed]
        summary.dropped_partial += s.dropped_partial
        summary.seconds += s.seconds
        summary.times += s.times
    added, present = combine_passes(out_dir, passes, suffix=suffix, statistic=statistic)
    summary.measured, summary.skipped = added, present
    return summary


def combine_passes(out_dir: Path | str, passes: int, *, suffix: str = "", statistic: str = "min") -> tuple[int, int]:
    """Append to `out_dir`'s tables the combined row of every kernel that all `passes` passes measured and
    the table lacks; returns (rows added, rows already there)."""
    if statistic not in ("min", "median"):
        raise ValueError(f"unknown statistic {statistic!r}")
    pick = min if statistic == "min" else statistics.median
    out_dir = Path(out_dir)
    tables = open_tables(out_dir, suffix)
    added = present = 0
    for kind, table in tables.items():
        name = table_file(FILES[kind][0], suffix)
        per_pass = [read_keys(pass_dir(out_dir, p) / name, kind) for p in range(1, passes + 1)]
        keys = [k for k in per_pass[0] if all(k in rows for rows in per_pass[1:])]
        for key in keys:
            samples = [rows[key] for rows in per_pass]
            if table.has(samples[0]):
                present += 1
                continue
            times = [float(r["time_s"]) for r in samples]
            chosen = pick(times)
            row = dict(min(samples, key=lambda r: abs(float(r["time_s"]) - chosen)))
            row["time_s"] = f"{chosen:.9g}"
            row["iqr_s"] = f"{max(times) - min(times):.9g}"
            row["repeats"] = str(sum(int(r["repeats"]) for r in samples))
            if "workspace_bytes" in row:
                row["workspace_bytes"] = f"{max(float(r['workspace_bytes']) for r in samples):.9g}"
            table.append(row)
            added += 1
    return added, present


