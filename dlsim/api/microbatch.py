"""μ-cuDNN micro-batch planning: `plan_microbatches()`, limit sweeps, and CPU calibration of the NumPy kernels.

Where the per-algorithm (time, workspace) of each convolution comes from, in order:
1. a benchmark CSV the user gives (`bench_table=`), checked against the model's layers;
2. the profile's measured table (key ``conv_algorithms`` in the profile's ``tables``), rows keyed by
   layer name or geometry signature;
3. the cost model: `dlsim.cost.conv_methods` costs priced by the roofline with the profile's device
   numbers (tagged ``model``; the plan's notes say so).
Convolution layers a table does not cover fall back to the model, with a note.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from dlsim.api.limits import check_plan_batch
from dlsim.api.models import as_cluster, as_model, check_batch, check_dtype
from dlsim.cost.conv_methods import METHODS, PASSES, ConvGeometry
from dlsim.errors import SpecError, excerpt
from dlsim.io.bench_table import append_rows, has_source_column, load_bench_table, resume_rows
from dlsim.io.files import check_output
from dlsim.io.results_log import one_writer
from dlsim.io.runfiles import RESUMED, note_input, run_scope
from dlsim.plan.microbatch.model_table import conv_layers, model_bench_table
from dlsim.plan.microbatch.ilp import GAP_REL
from dlsim.plan.microbatch.plan import plan_wd, plan_wr
from dlsim.plan.microbatch.policies import POLICIES, batch_sizes
from dlsim.plan.microbatch.records import MODES, MicrobatchPlan
from dlsim.plan.microbatch.table import BenchTable, bind_to_layers
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.units import MIB, parse_size, parse_time

TABLE_KEY = "conv_algorithms"


def _limit(value: str | float | int) -> float:
    limit = parse_size(value)
    if limit <= 0:
        raise SpecError(f"workspace limit must be positive, got {value!r}", field="workspace_limit")
    return limit


def _check(mode: str, policy: str) -> None:
    if mode not in MODES:
        raise SpecError(f"unknown mode {mode!r} (use wr or wd)", field="mode")
    if policy not in POLICIES:
        raise SpecError(f"unknown micro-batch policy {policy!r} (use {', '.join(POLICIES)})", field="policy")


def select_layers(model: Model, layers: Sequence[str] | None) -> list[tuple[str, ConvGeometry]]:
    """The model's convolutions (name, per-sample geometry), restricted to names or name prefixes in `layers`."""
    convs = conv_layers(model)
    if not convs:
        raise SpecError(f"model {model.name!r} has no conv2d layer to plan", field="model")
    if layers:
        convs = [(n, g) for n, g in convs if any(n == p or n.startswith(p) for p in layers)]
        if not convs:
            raise SpecError(f"no convolution layer matches {', '.join(layers)}", field="layers")
    return convs


def microbatch_table(model: Model | str | Path | None = None, cluster: Cluster | str | Path | None = None,
                     batch: int = 32, policies: Sequence[str] = ("powerOfTwo",),
                     bench_table: BenchTable | str | Path | None = None, *, dtype: str | None = None,
                     layers: Sequence[str] | None = None,
                     overrides: Mapping[str, Any] | None = None) -> tuple[BenchTable, tuple[str, ...]]:
    """The benchmark table a plan uses (see the module docstring) and notes on where its numbers come from."""
    check_plan_batch(check_batch(batch), "all" if "all" in policies else "powerOfTwo")
    if model is None:
        if bench_table is None:
            raise SpecError("give a MODEL with --cluster, or --bench-table FILE.csv")
        table = bench_table if isinstance(bench_table, BenchTable) else load_bench_table(bench_table)
        if layers:
            table = _table_layers(table, layers)
        return table, _table_notes(table)
    model = as_model(model, overrides)
    convs = select_layers(model, layers)
    keys = [(n, g.signature) for n, g in convs]
    notes: list[str] = []
    if bench_table is not None:
        table = bench_table if isinstance(bench_table, BenchTable) else load_bench_table(
            bench_table, known_layers=[n for n, _ in conv_layers(model)] + [g.signature for _, g in conv_layers(model)])
        table = bind_to_layers(table, keys, strict=True)
        notes += _table_notes(table)
    else:
        cluster_obj = as_cluster(cluster) if cluster is not None else None
        if cluster_obj is not None and TABLE_KEY in cluster_obj.tables:
            path = cluster_obj.tables[TABLE_KEY]
            table = bind_to_layers(load_bench_table(path), keys, strict=False)
            notes.append(f"times measured: profile table {path}")
        else:
            table = BenchTable(())
    covered = {k.layer for k in table.kernels}
    missing = [n for n, _ in convs if n not in covered]
    if missing:
        if cluster is None:
            raise SpecError(f"layer {missing[0]!r} has no rows in the benchmark table, and without --cluster it "
                            "cannot be modelled", field="layer")
        cluster_obj = as_cluster(cluster)
        sizes = sorted({s for p in policies for s in batch_sizes(p, batch)})
        modelled = model_bench_table(model, cluster_obj.device, sizes, check_dtype(dtype, model), missing)
        table = BenchTable(table.kernels + modelled.kernels, table.origin)
        what = "all convolutions" if len(missing) == len(convs) else f"{len(missing)} of {len(convs)} convolutions"
        notes.append(f"times modelled for {what} (no measured table): conv_methods costs priced by the roofline "
                     f"with the device numbers of {cluster_obj.name} ({cluster_obj.device.name})")
    return _ordered(table, [n for n, _ in convs]), tuple(notes)


def _table_notes(table: BenchTable) -> tuple[str, ...]:
    """Where a benchmark table's times come from, by source; a CSV without a ``source`` column is
    taken as measured, and the note says it is an assumption."""
    if not table.origin:
        return ()
    counts: dict[str, int] = {}
    for k in table.kernels:
        counts[k.source] = counts.get(k.source, 0) + 1
    kinds = ", ".join(f"{n} {s}" for s, n in counts.items())
    note = f"times from the benchmark table {Path(table.origin).name} (kernels by source: {kinds})"
    if not has_source_column(table):
        note += "; the table has no source column: its times are taken as measured"
    return (note,)


def _table_layers(table: BenchTable, layers: Sequence[str]) -> BenchTable:
    """The table's layers named (or prefixed) by `layers`; a name matching none of them is an unknown layer."""
    names = table.layers()
    for p in layers:
        if not any(n == p or n.startswith(p) for n in names):
            known = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            raise SpecError(f"unknown layer {p!r}: not in the benchmark table (its layers: {known})",
                            path=table.origin or None, field="layers")
    keep = [k for k in table.kernels if any(k.layer == p or k.layer.startswith(p) for p in layers)]
    return BenchTable(tuple(keep), table.origin)


def _ordered(table: BenchTable, names: list[str]) -> BenchTable:
    rank = {n: i for i, n in enumerate(names)}
    return BenchTable(tuple(sorted(table.kernels, key=lambda k: (rank.get(k.layer, len(rank)), PASSES.index(k.pass_name)))),
                      table.origin)


def plan_from_table(table: BenchTable, batch: int, workspace_limit: str | float, mode: str = "wr",
                    policy: str = "powerOfTwo", *, solver: Any = "cbc", time_limit_s: float = 10.0,
                    gap_rel: float = GAP_REL, pareto: bool = False, notes: tuple[str, ...] = ()) -> MicrobatchPlan:
    """WR or WD plan over a prepared table."""
    _check(mode, policy)
    limit = _limit(workspace_limit)
    if mode == "wr":
        return plan_wr(table, batch, limit, policy, pareto=pareto, notes=notes)
    return plan_wd(table, batch, limit, policy, solver=solver, time_limit_s=time_limit_s, gap_rel=gap_rel,
                   pareto=pareto, notes=notes)


def plan_microbatches(model: Model | str | Path | None, cluster: Cluster | str | Path | None, batch: int,
                      workspace_limit: str | float = "64MiB", mode: str = "wr", policy: str = "powerOfTwo",
                      bench_table: BenchTable | str | Path | None = None, *, dtype: str | None = None,
                      solver: Any = "cbc", time_limit: str | float = 10.0, gap_rel: float = GAP_REL,
                      pareto: bool = False, layers: Sequence[str] | None = None,
                      overrides: Mapping[str, Any] | None = None) -> MicrobatchPlan:
    """Plan micro-batches and algorithms for the model's convolutions (μ-cuDNN WR or WD).

    `workspace_limit` is per kernel for WR and the total budget for WD ("64MiB" or bytes). The plan
    gives per layer and pass the micro-batches, time and workspace, and the undivided baseline under
    the same limit. `model` may be None with a `bench_table` (plan the table's layers as they are).
    """
    _check(mode, policy)
    table, notes = microbatch_table(model, cluster, batch, (policy,), bench_table, dtype=dtype, layers=layers,
                                    overrides=overrides)
    return plan_from_table(table, batch, workspace_limit, mode, policy, solver=solver,
                           time_limit_s=parse_time(time_limit), gap_rel=gap_rel, pareto=pareto, notes=notes)


def default_limits(table: BenchTable, batch: int) -> list[float]:
    """Powers of two MiB from below the smallest to above the largest workspace of the table (at most 16)."""
    sizes = [r.workspace_bytes for k in table.kernels for r in k.rows if r.size <= batch and r.workspace_bytes > 0]
    lo, hi = (min(sizes), max(sizes)) if sizes else (MIB, MIB)
    limits, v = [], MIB / 4
    while v < lo and v * 2 <= hi:
        v *= 2
    while v <= 2 * hi and len(limits) < 16:
        limits.append(v)
        v *= 2
    return limits


def microbatch_sweep(table: BenchTable, batch: int, mode: str = "wr", policies: Sequence[str] = ("undivided", "powerOfTwo"),
                     limits: Sequence[float] | None = None, *, solver: Any = "cbc", time_limit_s: float = 10.0,
                     label: str = "", source: str = "") -> dict[str, Any]:
    """Plans over a range of workspace limits: time and speedup (over undivided at the same limit) per policy.

    The record plots as μ-cuDNN's speedup-against-workspace-limit figure (`dlsim.report.microbatch_plots`).
    An infeasible limit gives None.
    """
    from dlsim.errors import InfeasibleError
    limits = list(limits) if limits is not None else default_limits(table, batch)
    series = []
    for policy in policies:
        times, speedups, workspaces = [], [], []
        for limit in limits:
            try:
                p = plan_from_table(table, batch, limit, mode, policy, solver=solver, time_limit_s=time_limit_s)
            except InfeasibleError:
                times.append(None), speedups.append(None), workspaces.append(None)
                continue
            times.append(p.time_s), speedups.append(p.speedup), workspaces.append(p.workspace_bytes)
        series.append({"policy": policy, "time_s": times, "speedup": speedups, "workspace_bytes": workspaces})
    base = next((s["time_s"] for s in series if s["policy"] == "undivided"), None)
    return {"schema_version": 1, "kind": "microbatch_sweep", "label": label, "mode": mode, "batch": batch,
            "source": source, "limits_bytes": limits, "undivided_time_s": base, "series": series}


def calibrate_microbatch(model: Model | str | Path, batch: int, out: str | Path, *, policy: str = "powerOfTwo",
                         layers: Sequence[str] | None = None, passes: Sequence[str] = PASSES,
                         methods: Sequence[str] = METHODS, max_workspace: str | float | None = None,
                         repeats: int = 5, min_samples: int | None = None, threads: int | None = None,
                         prune: bool = True, overrides: Mapping[str, Any] | None = None,
                         progress: Callable[[str], None] | None = None) -> BenchTable:
    """Measure the NumPy convolution algorithms for the model's convolutions on this CPU into the CSV `out`.

    Resumes `out` if it exists (only missing rows are measured); every row is written as soon as it
    is measured. `threads` sets NumPy's BLAS thread count first (1 gives steadier timings on a shared
    machine). Returns the whole table.
    """
    from dlsim.calibrate.blas_threads import set_blas_threads
    from dlsim.calibrate.microbatch_bench import bench_layers
    model = as_model(model, overrides)
    check_batch(batch)
    _check("wr", policy)
    check_plan_batch(batch, policy)  # the table is for the planner: no larger than it plans
    bad = [p for p in passes if p not in PASSES] + [m for m in methods if m not in METHODS]
    if bad:
        raise SpecError(f"unknown pass or algorithm {excerpt(bad[0], 40)}")
    for name, value in (("repeats", repeats), ("min_samples", min_samples), ("threads", threads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise SpecError(f"must be a positive integer, got {excerpt(value, 40)}", field=name)
    workspace = parse_size(max_workspace) if max_workspace else None
    convs = select_layers(model, layers)
    with run_scope():
        check_output(out, option="--out", resume=True)
        note_input(out, RESUMED)  # the table this calibration extends (read back at the end)
        with one_writer(out):
            if threads is not None and set_blas_threads(threads) is None and progress:
                progress("could not set the BLAS thread count; using NumPy's default")
            done = resume_rows(out)
            bench_layers(convs, batch, batch_sizes(policy, batch), done=done, emit=lambda rows: append_rows(out, rows),
                         passes=passes, methods=methods, max_workspace=workspace, repeats=repeats,
                         min_samples=min_samples or batch, prune=prune, progress=progress)
    return load_bench_table(out)
