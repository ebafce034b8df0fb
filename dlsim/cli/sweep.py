"""``dlsim sweep SPEC.yaml``: simulate (or price analytically) a grid of models x clusters x strategies
x sizes, resumably."""

from __future__ import annotations

from dataclasses import replace

import csv
import io
import json
from pathlib import Path
from typing import Any

import click

from dlsim.api.sweep import run_sweep, summarize
from dlsim.errors import SpecError
from dlsim.cli import main, resumable
from dlsim.cli.options import refuse_unused
from dlsim.cli.output import OutputFile, emit_plot, emit_text, force_option, prepare_output
from dlsim.io.files import OutputError, same_file
from dlsim.io.sweep_spec import load_sweep
from dlsim.progress import Progress

SUMMARY_FIELDS = ("model", "cluster", "gpus", "points", "feasible", "best_strategy", "global_batch",
                  "iteration_time_s", "throughput_samples_per_s", "peak_memory_bytes", "best_id")


def summary_text(s: dict[str, Any]) -> str:
    rows = [("model", "cluster", "GPUs", "points", "ok", "best strategy", "iter (ms)", "samples/s", "mem (GiB)")]
    for r in s["best"]:
        t = r["iteration_time_s"]
        rows.append((r["model"], r["cluster"], str(r["gpus"] if r["gpus"] is not None else "-"), str(r["points"]),
                     str(r["feasible"]), r["best_strategy"] or "(none feasible)",
                     f"{t * 1e3:.3f}" if t is not None else "-",
                     f"{r['throughput_samples_per_s']:.1f}" if t is not None else "-",
                     f"{r['peak_memory_bytes'] / 2**30:.2f}" if r.get("peak_memory_bytes") is not None else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    status = ", ".join(f"{k} {v}" for k, v in sorted(s["status"].items()))
    out.append(f"\n{s['points']} points: {status}")
    if s["infeasible_by_reason"]:
        out.append("not run, by reason:")
        out += [f"  {n:>7}  {reason}" for reason, n in s["infeasible_by_reason"].items()]
    return "\n".join(out)


def summary_csv(s: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(SUMMARY_FIELDS)
    for r in s["best"]:
        w.writerow([r.get(k) if r.get(k) is not None else "" for k in SUMMARY_FIELDS])
    return buf.getvalue()


@main.command("sweep")
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--out", "-o", type=OutputFile(resume=True), default=None,
              help="Results, one JSON line per point, appended as each finishes; an existing file is resumed "
                   "[default: SPEC.results.jsonl].")
@click.option("--jobs", "-j", type=click.IntRange(1, 1024), default=None,
              help="Local worker processes [default: the CPU count].")
@click.option("--scheduler", default=None, metavar="ADDRESS", help="Run on a Dask scheduler, e.g. tcp://10.0.0.1:8786.")
@click.option("--dask-local", type=click.IntRange(1, 256), default=None, metavar="N",
              help="Start a local Dask cluster of N worker processes (loopback only) and run on it.")
@click.option("--summary", "summary_out", type=OutputFile(), default=None,
              help="Write the best point per model x cluster x GPUs as CSV.")
@click.option("--plot", "plot_out", type=OutputFile(figure=True), default=None, help="Draw the summary figure.")
@click.option("--json", "json_out", is_flag=True, help="Print the summary record as JSON instead of the table.")
@click.option("--stack", metavar="NAME|FILE",
              help="Software stack of every point the spec does not give one (dlsim stacks); a spec compares "
                   "stacks with grid: {stack: [pytorch, megatron-core]}.")
@click.option("--analytic", is_flag=True,
              help="Price each point with the analytic evaluator (what simulate --analytic gives: milliseconds a "
                   "point, held to the simulation within a few percent) instead of simulating it. A point it does "
                   "not model (parameter-server sync, layer groups, run-time variability, gradient compression) is "
                   "simulated instead, its record saying why (analytic_refused). Records name their engine; "
                   "resuming a file with the other engine prices its points again and keeps the old records.")
@click.option("--quiet", "-q", is_flag=True, help="No progress display (it is drawn on a terminal only, on stderr).")
@force_option
def sweep_cmd(spec: str, out: str | None, jobs: int | None, scheduler: str | None, dask_local: int | None,
              summary_out: str | None, plot_out: str | None, json_out: bool, stack: str | None, analytic: bool,
              quiet: bool) -> None:
    """Simulate every point of the grid in SPEC (YAML: models, clusters, gpus, global_batch, grid,
    fixed), or with --analytic price it with the analytic evaluator. Each result is appended to --out
    as it finishes; run the same command again after an interruption and it resumes where it stopped.
    Ends with the best strategy per model x cluster x GPUs and the infeasible points counted by reason."""
    if scheduler and dask_local:
        raise click.UsageError("give --scheduler or --dask-local, not both")
    if scheduler or dask_local:
        refuse_unused(("jobs",), "on Dask (its workers run the points)")
    s = load_sweep(spec)
    if stack is not None:
        if "stack" in dict(s.grid) or "stack" in dict(s.fixed):
            raise SpecError("--stack: the spec already sets stack (in grid or fixed)", field="stack")
        from dlsim.io.stack_yaml import load_stack
        load_stack(stack)  # an unknown stack is refused before any point runs
        s = replace(s, fixed=tuple(sorted({**dict(s.fixed), "stack": stack}.items())))
    # an existing results file is resumed (appended to, locked), never an input: the spec, its models or
    # profiles (every file the run reads: dlsim.io.runfiles), nor another output
    results = prepare_output(out, "--out", resume=True) if out else prepare_output(
        Path(spec).with_suffix(".results.jsonl"), "--out", resume=True)
    named = [Path(n) for n in s.models + s.clusters]
    for f in (f for p in named for f in ([p] if p.is_file() else p.glob("*") if p.is_dir() else [])):
        if same_file(f, results):
            raise OutputError(f"--out {results} is an input of this run; refusing to overwrite it")
    resumable(f"every point priced so far (in {results})")
    with Progress(enabled=False if quiet else None, label="points", tick=True) as bar:
        outcome = run_sweep(s, results, jobs=jobs, scheduler=scheduler, dask_local=dask_local, analytic=analytic,
                            progress=lambda done, total: bar.update(done, total, "points"))
    how = "priced analytically" if analytic else "simulated"
    click.echo(f"{outcome.total} points ({outcome.resumed} resumed, {outcome.computed} {how}, "
               f"{outcome.backend}): {results}", err=True)
    for reason, n in outcome.fallbacks.most_common():
        click.echo(f"  {n} simulated instead: {reason}", err=True)
    if outcome.other_engine:
        other = "simulation" if analytic else "analytic evaluator"
        click.echo(f"  {outcome.other_engine} records of the {other} in the file kept, not used", err=True)
    summary = summarize(s, outcome.records)
    if json_out:
        click.echo(json.dumps(summary, indent=1, allow_nan=False))
    else:
        click.echo(summary_text(summary))
    if summary_out:
        emit_text(summary_out, summary_csv(summary), "--summary")
    if plot_out:
        from dlsim.report.sweep_plots import sweep_figure
        emit_plot(plot_out, lambda tmp: sweep_figure(summary, tmp))
