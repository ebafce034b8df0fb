"""The generic kernel grid, measured once per host and copied into every later profile of that host.

A calibration's generic grid (the GEMM grid, its off-power-of-two set, the memory-bound sweep and the
optimizer sweep, `dlsim.calibrate.compute_plan`) is the same kernels in every profile: its rows depend on
the host, its software and how they were timed, not on the models calibrated beside them. It is most
of a calibration's time (2 × 2,912 kernels took 12 of a ResNet-18 calibration's 18 minutes on the
shared 2-core machine, issue 34), so it is kept in the host cache (`dlsim.io.host_cache`) once measured,
keyed by the grid's kernels and the timing (data types, threads, repeats, cache flush, statistic,
passes, and the timing code's version), and a later calibration with the same key copies the rows its
tables lack instead of timing them again. The run's record in meta.yaml says so (``grid``: source,
date measured, rows copied). The rows are copied as measured (their ``set`` column stays ``grid`` or
``odd``); `reuse=False` (``--reprobe``) times them again and refreshes the cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from dlsim.api.host_probes import method_version
from dlsim.calibrate import compute_ops, compute_passes, compute_timer
from dlsim.calibrate.compute_plan import Task
from dlsim.calibrate.compute_run import FILES, open_tables, read_keys, row_key, task_key
from dlsim.io.host_cache import Entry, HostCache, digest

GRID_SETS = ("grid", "odd")
PROBE = "grid"


def grid_tasks(tasks: Sequence[Task]) -> list[Task]:
    """The generic grid's tasks among a calibration's (a grid kernel a model also needs is one of them)."""
    return [t for t in tasks if getattr(t, "set", "") in GRID_SETS]


def grid_params(tasks: Sequence[Task], *, dtypes: Sequence[str], threads: int, repeats: int, flush: bool,
                statistic: str, passes: int) -> dict[str, Any]:
    """The cache key of a grid's rows: its kernels and how they are timed (module docstring)."""
    keys = sorted(str(task_key(t)) for t in tasks)
    return {"kernels": digest(keys), "count": len(keys), "dtypes": sorted(dtypes), "threads": threads,
            "repeats": repeats, "flush": flush, "statistic": statistic, "passes": passes,
            "method": method_version(compute_timer, compute_ops, compute_passes)}


def reuse_grid(out: Path, tasks: Sequence[Task], params: dict[str, Any], cache: HostCache) -> tuple[int, Entry | None]:
    """Copy into `out`'s tables the cached rows of `tasks` it lacks; (rows copied, the cache entry or None)."""
    entry = cache.get(PROBE, params)
    if entry is None or not isinstance(entry.value, dict):
        return 0, None
    wanted = {task_key(t) for t in tasks}
    tables = open_tables(out)
    copied = 0
    for kind, rows in entry.value.items():
        if kind not in tables or not isinstance(rows, list):
            continue
        table = tables[kind]
        fresh = [r for r in rows if isinstance(r, dict) and set(table.columns) <= set(r)
                 and row_key(kind, r) in wanted and not table.has(r)]
        table.extend(fresh)
        copied += len(fresh)
    return copied, entry


def keep_grid(out: Path, tasks: Sequence[Task], params: dict[str, Any], cache: HostCache,
              seconds: float) -> Entry | None:
    """Keep `out`'s rows of `tasks` in the cache when it holds every one of them (a grid measured in full)."""
    wanted = {task_key(t) for t in tasks}
    rows: dict[str, list[dict[str, str]]] = {}
    for kind, (name, _) in FILES.items():
        if kind == "device":
            continue
        rows[kind] = [r for key, r in read_keys(out / name, kind).items() if key in wanted]
    if sum(len(r) for r in rows.values()) < len(wanted):
        return None
    return cache.put(PROBE, params, rows, seconds)
