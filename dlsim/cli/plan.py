"""``dlsim plan``: planning commands. ``dlsim plan microbatch``: μ-cuDNN micro-batches for convolutions.

The `plan` group is shared: other planning subcommands attach to it with ``@plan.command(...)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from dlsim.api.microbatch import microbatch_sweep, microbatch_table, plan_from_table
from dlsim.api.models import as_model, check_dtype
from dlsim.cli import main
from dlsim.cli.options import FINITE_FLOAT, json_option, parse_overrides, refuse_unused, set_option
from dlsim.cli.output import (OutputFile, check_plot_path, emit_json, emit_plot, json_safe, prepare_output, state_dtype,
                              wants_summary)
from dlsim.errors import SpecError
from dlsim.plan.microbatch.ilp import GAP_REL
from dlsim.plan.microbatch.policies import POLICIES
from dlsim.report.text import table
from dlsim.units import format_bytes, format_time, parse_size, parse_time


@main.group("plan")
def plan() -> None:
    """Plan how to run a network (micro-batches for convolutions, ...)."""


def _microbatches(mbs: list[dict[str, Any]]) -> str:
    """``3 x 32 winograd + 1 x 16 im2col`` (runs of equal micro-batches collapsed)."""
    runs: list[list] = []
    for mb in mbs:
        if runs and runs[-1][1:] == [mb["size"], mb["algorithm"]]:
            runs[-1][0] += 1
        else:
            runs.append([1, mb["size"], mb["algorithm"]])
    return " + ".join(f"{n} x {s} {a}" if n > 1 else f"{s} {a}" for n, s, a in runs)


def plan_text(rec: dict[str, Any], pareto: bool = False) -> str:
    """The plan as a terminal table with totals and notes."""
    rows = []
    for layer in rec["layers"]:
        for pass_name, p in layer["passes"].items():
            und = p["undivided"]
            rows.append([layer["name"], pass_name, _microbatches(p["microbatches"]), format_time(p["time_s"]),
                         format_bytes(p["workspace_bytes"]),
                         f"{und['algorithm']} {format_time(und['time_s'])}" if und else "does not fit", p["source"]])
            if pareto:
                for c in p.get("pareto", []):
                    rows.append(["", "  desirable", _microbatches(c["microbatches"]), format_time(c["time_s"]),
                                 format_bytes(c["workspace_bytes"]), "", p["source"]])
    out = [table(["layer", "pass", "micro-batches", "time", "workspace", "undivided", "source"], rows,
                 [False, False, False, True, True, False, False])]
    limit = format_bytes(rec["workspace_limit_bytes"])
    scope = "per kernel, reused (WR)" if rec["mode"] == "wr" else "in total, divided (WD)"
    out.append("")
    out.append(f"mode {rec['mode'].upper()}, policy {rec['policy']}, batch {rec['batch']}, workspace limit {limit} {scope}")
    und = rec["undivided_time_s"]
    out.append(f"convolution time {format_time(rec['time_s'])}; undivided under the same limit "
               f"{format_time(und) if und is not None else 'does not fit'}"
               + (f"; speedup {rec['speedup']:.3f}x" if rec["speedup"] else ""))
    out.append(f"workspace needed {format_bytes(rec['workspace_bytes'])} ({rec['source']} times"
               + (f", solver {rec['solver']}{'' if rec['optimal'] else ', NOT proven optimal'}" if rec["mode"] == "wd" else "")
               + ")")
    out += [f"note: {n}" for n in rec["notes"]]
    return "\n".join(out)


@plan.command("microbatch")
@click.argument("model", required=False)
@click.option("--cluster", "-c", help="Hardware profile (built-in name or directory) whose device prices the model.")
@click.option("--bench-table", type=click.Path(dir_okay=False),
              help="CSV layer,pass,microbatch_size,algorithm,time_s,workspace_bytes (pass optional).")
@click.option("--batch", type=int, required=True, help="Mini-batch size to split.")
@click.option("--workspace-limit", default="64MiB", show_default=True,
              help="WR: limit per kernel; WD: total budget (e.g. 64MiB, 1GB).")
@click.option("--policy", type=click.Choice(POLICIES), default="powerOfTwo", show_default=True,
              help="Micro-batch sizes allowed: the whole batch, powers of two (and the batch), or any.")
@click.option("--mode", type=click.Choice(["wr", "wd"]), default="wr", show_default=True,
              help="wr: workspace reuse (DP per layer); wd: workspace division (ILP across layers).")
@click.option("--pareto", is_flag=True, help="Also show each kernel's desirable (Pareto) configurations.")
@click.option("--layers", help="Comma-separated convolution layer names or name prefixes (default: all).")
@click.option("--dtype", default=None, help="Data type for modelled times (default: the model's).")
@click.option("--solver", type=click.Choice(["cbc", "highs"]), default="cbc", show_default=True,
              help="ILP solver for --mode wd (highs needs the highspy package).")
@click.option("--time-limit", default="10s", show_default=True, help="ILP solver time limit.")
@click.option("--gap", type=FINITE_FLOAT, default=GAP_REL, show_default=True,
              help="ILP relative optimality gap (0: prove exact optimality; can take long).")
@click.option("--plot", "plot_path", type=OutputFile(figure=True),
              help="Write a figure of time and speedup against the workspace limit (PNG, SVG, PDF).")
@set_option
@json_option
def microbatch_cmd(model: str | None, cluster: str | None, bench_table: str | None, batch: int, workspace_limit: str,
                   policy: str, mode: str, pareto: bool, layers: str | None, dtype: str | None, solver: str,
                   time_limit: str, gap: float, plot_path: str | None, overrides: tuple[str, ...],
                   json_out: str | None) -> None:
    """Split each convolution's mini-batch into micro-batches so faster algorithms fit the workspace (μ-cuDNN).

    Either MODEL with --cluster PROFILE (times from the profile's measured `conv_algorithms` table, or
    modelled from its device numbers), or --bench-table FILE.csv (with or without MODEL). Prints per
    layer and pass the micro-batch sizes with their algorithms, time and workspace, the total, the
    undivided time under the same limit and the speedup.
    """
    if model is not None and cluster is None and bench_table is None:
        raise SpecError("MODEL needs --cluster PROFILE (or --bench-table FILE.csv)")
    if model is None and bench_table is None:
        raise SpecError("give MODEL --cluster PROFILE, or --bench-table FILE.csv")
    if model is None:
        refuse_unused(("overrides", "dtype", "cluster"), "without MODEL: the benchmark table's times are measured, "
                                                           "not modelled")
    if mode == "wr":
        refuse_unused(("solver", "time_limit", "gap"), "with --mode wr (the ILP solver runs with --mode wd)")
    limit = parse_size(workspace_limit)
    seconds = parse_time(time_limit)
    if plot_path:
        prepare_output(check_plot_path(plot_path), "--plot")
    chosen = [s.strip() for s in layers.split(",") if s.strip()] if layers else None
    policies = tuple(dict.fromkeys([policy, "undivided"]))
    tab, notes = microbatch_table(model, cluster, batch, policies, bench_table, dtype=dtype, layers=chosen,
                                  overrides=parse_overrides(overrides))
    if not 0 <= gap < 1:
        raise SpecError(f"--gap must be in [0, 1), got {gap}")
    result = plan_from_table(tab, batch, limit, mode, policy, solver=solver, time_limit_s=seconds, gap_rel=gap,
                             pareto=pareto, notes=notes)
    rec = result.to_dict()
    if model is not None:
        state_dtype(rec, dtype, check_dtype(dtype, as_model(model, parse_overrides(overrides))))
    else:
        rec["dtype"] = "as in the benchmark table (--bench-table times)"
    if plot_path:
        from dlsim.report.microbatch_plots import plot_sweep
        label = model or Path(bench_table or "").name  # the table by its file name, never a directory path
        sweep = microbatch_sweep(tab, batch, mode, policies[::-1], solver=solver, time_limit_s=seconds,
                                 label=str(label), source=result.source)
        json_safe(sweep)
        emit_plot(plot_path, lambda tmp: plot_sweep(sweep, tmp, marker_limit=limit))
        rec["sweep"] = sweep
    if json_out is not None:
        emit_json(rec, json_out)
    if wants_summary(json_out):
        json_safe(rec)
        click.echo(plan_text(rec, pareto))
