"""``dlsim calibrate compute``: time real kernels through PyTorch into a hardware profile."""

from __future__ import annotations

import sys

import click

from dlsim.api.calibrate_compute import calibrate_compute
from dlsim.cli import resumable
from dlsim.cli.calibrate import calibrate
from dlsim.cli.options import json_option, parse_overrides, set_option
from dlsim.cli.output import emit_json, state_dtype, wants_summary
from dlsim.progress import Progress
from dlsim.units import format_time


def _progress(bar: Progress | None):
    """Per-kernel progress on the display; the host probes as a phase with their own counts; failures as lines
    of their own (also off a terminal): `Progress.callback`."""
    return bar.callback() if bar is not None else None


def print_warnings(warnings: list[str]) -> None:
    for w in warnings:
        click.echo(f"warning: {w}", err=True)


@calibrate.command("compute")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--out", "-o", required=True, help="Profile directory (created; a rerun resumes and keeps what exists).")
@click.option("--model", "models", multiple=True,
              help="Also measure exactly the kernels of this model (repeatable): a zoo name, a YAML file (e.g. from "
                   "dlsim import torch) or a PyTorch FILE.py:FACTORY (captured with torch.export, with --input-shape).")
@click.option("--input-shape", default=None, help="Per-sample input shape of a FILE.py:FACTORY model, e.g. 3,224,224.")
@click.option("--tokens", is_flag=True, help="The FILE.py:FACTORY model's input is integer token ids.")
@click.option("--vocab", type=int, default=2, show_default=True, help="Token ids are drawn below this (--tokens).")
@click.option("--batch", "batches", type=int, multiple=True, help="Batch size per --model (one for all, or one each).")
@click.option("--dtype", "dtypes", multiple=True, help="Data types to measure (repeatable; default fp32).")
@click.option("--no-grid", is_flag=True, help="Skip the generic GEMM grid and memory-bound sweep (model shapes only).")
@click.option("--algorithm", "algorithms", multiple=True,
              help="Convolution algorithms to measure (cpu: mkldnn, native; cuda: cudnn-default, cudnn-benchmark, "
                   "cudnn-deterministic; default all).")
@click.option("--threads", type=int, default=None, help="Intra-op threads (default: PyTorch's, one per core).")
@click.option("--repeats", type=int, default=5, show_default=True, help="Timed blocks per kernel (median taken).")
@click.option("--flush-cache/--no-flush-cache", default=True, show_default=True,
              help="Evict the caches before every timed call (as other layers do in a training step).")
@click.option("--statistic", type=click.Choice(["median", "min"]), default="median", show_default=True,
              help="What a kernel's time is: the median or (on a busy machine) the minimum of its timed calls.")
@click.option("--warm", type=click.Choice(["auto", "none", "all"]), default="auto", show_default=True,
              help="Also time warm (back to back, no flush) into the -warm tables the kernels of models whose "
                   "training step is at most 8x the last-level cache (auto: the estimate prices those partly warm), "
                   "of none, or of all given models.")
@click.option("--passes", type=int, default=1, show_default=True,
              help="Time every kernel once per pass, in a fresh random order each pass, and keep the statistic over "
                   "the passes (time-correlated noise of a shared machine then cannot shift a region of a table).")
@click.option("--quick", is_flag=True,
              help="The fast path. On an OUT that holds a calibration: measure nothing new, re-probe this host and "
                   "re-time a few table entries (under 30 s) and say whether the tables still hold. On a new OUT: "
                   "calibrate quickly: the --model kernels only (no generic grid), one pass, 3 timed calls each, "
                   "the host probes reused from this host's cache.")
@click.option("--reprobe", is_flag=True,
              help="Measure the host probes (fresh pages, the plain loop's extras, host time per operator) again "
                   "instead of reusing this host's cached results (the cache is refreshed).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar (it is drawn only on a terminal anyway).")
@set_option
@json_option
def compute_cmd(device: str, out: str, models: tuple[str, ...], input_shape: str | None, tokens: bool, vocab: int,
                batches: tuple[int, ...], dtypes: tuple[str, ...],
                no_grid: bool, algorithms: tuple[str, ...], threads: int | None, repeats: int, flush_cache: bool,
                statistic: str, warm: str, passes: int, quick: bool, reprobe: bool, quiet: bool,
                overrides: tuple[str, ...], json_out: str | None) -> None:
    """Measure GEMMs, convolutions (every algorithm), memory-bound kernels and launch overhead.

    Writes CSV tables, meta.yaml and profile.yaml into OUT. Interrupt it at any time: rerunning the
    same command measures only what is missing, and a finished calibration's rerun does nothing.
    On a CPU the host probes this calibration's predictions need are measured once per host and kept
    in the user's cache (see --reprobe).
    """
    if quick and _has_calibration(out):
        return _quick(out, json_out)
    if quick:
        if not models:
            raise click.UsageError("--quick on a new OUT calibrates the --model kernels only: give --model and --batch")
        no_grid, passes, repeats = True, 1, min(repeats, 3)
        click.echo("quick calibration: the --model kernels only, one pass, 3 timed calls each", err=True)
    if models and not batches:
        raise click.UsageError("--model needs --batch")
    if repeats < 1:
        raise click.BadParameter("must be at least 1", param_hint="--repeats")
    if passes < 1:
        raise click.BadParameter("must be at least 1", param_hint="--passes")
    chosen = [_factory_model(m, input_shape, tokens, vocab) if ".py:" in m else m for m in models]
    resumable("every kernel and probe measured so far")
    with Progress(enabled=False if quiet else None, label="kernels") as bar:
        rec = calibrate_compute(out, device=device, models=chosen, batches=batches or (1,),
                                overrides=parse_overrides(overrides), dtypes=dtypes or ("fp32",), grid=not no_grid,
                                algorithms=algorithms or None, threads=threads, repeats=repeats,
                                flush_cache=flush_cache, statistic=statistic, warm=warm, passes=passes,
                                reuse_probes=not reprobe,
                                command="dlsim " + " ".join(sys.argv[1:]), progress=_progress(None if quiet else bar))
    print_warnings(rec["warnings"])
    state_dtype(rec, dtypes, list(dtypes or ("fp32",)))
    if json_out is not None:
        emit_json(rec, json_out)
        if not wants_summary(json_out):
            return
    if rec.get("nothing_to_do"):
        click.echo(f"{rec['out']}: nothing to do: {rec['already_measured']} kernels already measured")
        for line in rec["profile"]:
            click.echo(f"  {line}")
        return
    click.echo(f"{rec['out']}: {rec['measured']} kernels measured, {rec['already_measured']} already there, "
               f"{len(rec['failed'])} failed, in {format_time(rec['seconds'])} on {rec['device']}")
    for line in rec["failed"]:
        click.echo(f"  failed: {line}")
    for line in rec["profile"]:
        click.echo(f"  {line}")
    if rec.get("probes"):
        click.echo("  " + probe_line(rec["probes"]))
    grid = rec.get("grid_rows") or {}
    if grid.get("copied_from_host_cache"):
        click.echo(f"  generic grid: {grid['copied_from_host_cache']} rows copied from this host's cache (measured "
                   f"{grid.get('measured', '?')}; --reprobe times them again)")


def probe_line(probes: dict) -> str:
    """One line: where each host probe's rows came from."""
    by: dict[str, list[str]] = {}
    for name, source in probes["sources"].items():
        by.setdefault(source, []).append(name)
    parts = [f"{source}: {', '.join(names)}" for source, names in by.items()]
    where = f"; host cache {probes['host_cache']}" if probes.get("host_cache") else "; host cache off"
    return (f"host probes ({probes['measured_s']:.0f} s measuring) {'; '.join(parts)}{where}")


def _has_calibration(out: str) -> bool:
    from pathlib import Path
    return (Path(out) / "meta.yaml").is_file() and (Path(out) / "gemm.csv").is_file()


def _quick(out: str, json_out: str | None) -> None:
    """``--quick``: the host and a few table entries re-checked (`dlsim.api.calibrate_quick`)."""
    from dlsim.api.calibrate_quick import quick_check
    rec = quick_check(out)
    if json_out is not None:
        emit_json(rec, json_out)
        if not wants_summary(json_out):
            return
    host = rec["host"]
    cur = host["current"]
    click.echo(f"{rec['out']}: this host {cur['cpu']} ({cur['logical_cpus']} CPUs, {rec['threads']} threads): reference "
               f"GEMM {cur['gemm_gflop_per_s']:.1f} GFLOP/s, stream {cur['stream_gbyte_per_s']:.1f} GB/s; "
               f"{host['note']}")
    for e in rec["entries"]:
        click.echo(f"  {e['entry']}: recorded {format_time(e['recorded_s'])}, now {format_time(e['fresh_s'])} "
                   f"({100 * (e['ratio'] - 1):+.1f}%)")
    click.echo(f"{rec['line']} (checked in {rec['wall_s']:.1f} s)")


def _factory_model(spec: str, input_shape: str | None, tokens: bool, vocab: int):
    """A PyTorch FILE.py:FACTORY captured at the operator level with the plain training loop's loss."""
    from dlsim.api.validate_torch import training_model
    from dlsim.cli.validate import parse_input_shape
    from dlsim.errors import SpecError
    if input_shape is None:
        raise SpecError(f"--model {spec} needs --input-shape (the per-sample input, e.g. 3,224,224)")
    return training_model(spec, parse_input_shape(input_shape), tokens=tokens, vocab=vocab)[0]
