"""``dlsim compare``: several strategies side by side (table, CSV, JSON, figure); scaling studies.

Exit code: 0 when at least one strategy is feasible (the others are listed with the limit that
rules them out); 1 only when every strategy cannot be built or does not fit (after the table and
every output are written). A comparison with some infeasible strategies is still a comparison.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Callable

import click

from dlsim.cli import main
from dlsim.cli.options import announce_empty_strategy, parse_overrides, set_option
from dlsim.cli.output import (OutputFile, check_plot_path, emit_json, emit_plot, emit_text, force_option, json_safe,
                              prepare_output, wants_summary)
from dlsim.errors import InfeasibleError, SpecError
from dlsim.report.strategy_fields import field_text, varying_fields
from dlsim.spec.strategy import SYNCS

PARTS = ("compute", "recompute", "exposed_comm", "bubble", "idle")
CSV_COLUMNS = ("strategy", "gpus", "dp", "tp", "pp", "microbatch_size", "num_microbatches", "global_batch",
               "schedule", "feasible", "iteration_time_s", "compute_s", "recompute_s", "exposed_comm_s", "bubble_s",
               "idle_s", "throughput_samples_per_s", "model_flops_utilisation", "peak_memory_bytes", "capacity_bytes",
               "speedup", "parallel_efficiency", "reason", "sync", "staleness", "staleness_mean", "tokens_per_s",
               "model_tflops_per_gpu")


def check_figure_path(path: str, option: str) -> Path:
    """Refuse an unknown figure format before any work is done (and remember the output)."""
    return prepare_output(check_plot_path(path, option), option)


def emit_figure(path: str, option: str, draw: Callable[[], Any]) -> None:
    """Draw a figure (`draw()` returns it) and write it to `path` under the output rules."""
    from dlsim.report.compare_plots import close, save_figure

    def save(tmp: str) -> None:
        fig = draw()
        save_figure(fig, tmp)
        close(fig)
    emit_plot(path, save, option)


def _gpus(text: str | None) -> list[int] | None:
    if text is None:
        return None
    out = []
    for item in text.split(","):
        item = item.strip()
        if item in ("...", ""):
            if item == "...":
                raise SpecError("--gpus lists every count, e.g. 8,16,32,64 (no '...')", field="gpus")
            continue
        try:
            out.append(int(item))
        except ValueError:
            raise SpecError(f"--gpus needs comma-separated GPU counts, got {item!r}", field="gpus") from None
    return out


def _fmt(x: Any, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def comparison_table(rec: dict[str, Any]) -> str:
    """The comparison as text: one row per strategy (and GPU count), then the infeasible ones' reasons."""
    from dlsim.report.text import table
    from dlsim.units import format_bytes
    curves = {(name, p["gpus"]): p for name, pts in (rec.get("scaling_curves") or {}).items() for p in pts}
    head = ["strategy", "GPUs", "dp x tp x pp", "mbs x m", "iteration", "compute", "recomp", "exp.comm", "bubble",
            "idle", "samples/s", "MFU", "memory / capacity", "status"]
    if curves:
        head[12:12] = ["speedup", "efficiency"]
    rows = []
    varying = varying_fields(rec["entries"])
    for e in rec["entries"]:
        s = e.get("strategy") or {}
        bd = e.get("breakdown_s") or {}
        name = e["name"] + "".join(f" {k}={field_text(s[k])}" for k in varying
                                   if k in s and f"{k}={field_text(s[k])}" not in e["name"])
        row = [name, e.get("gpus") or "-", f"{s['dp']} x {s['tp']} x {s['pp']}" if s else "-",
               f"{s['microbatch_size']} x {s['num_microbatches']}" if s else "-",
               _fmt(e.get("iteration_time_s")), *(_fmt(bd.get(k)) for k in PARTS),
               _fmt(e.get("throughput_samples_per_s")),
               f"{100 * e['model_flops_utilisation']:.0f}%" if e.get("model_flops_utilisation") else "-",
               f"{format_bytes(e['peak_memory_bytes'])} / {format_bytes(e['capacity_bytes'])}"
               if e.get("peak_memory_bytes") is not None else "-",
               "ok" if e["feasible"] else ("does not fit" if e.get("limit") == "memory" else "cannot be built")]
        if curves:
            p = curves.get((e["name"], e.get("gpus"))) or {}
            row[12:12] = [_fmt(p.get("speedup"), 3),
                          f"{100 * p['efficiency']:.0f}%" if p.get("efficiency") is not None else "-"]
        rows.append(row)
    right = [False, True, False, False] + [True] * (len(head) - 6) + [True, False]
    where = f"{rec['model']} on {rec['cluster']} ({rec['device']})"
    if rec.get("scaling"):
        where += f", {rec['scaling']} scaling"
    if rec.get("fixed"):
        where += f", every strategy {rec['fixed']}"
    stacks = {(e["stack"]["name"], e["stack"]["version"]) for e in rec["entries"] if e.get("stack")}
    lines = [f"{where}: {len(rec['entries'])} simulations, {rec['feasible']} feasible; times in seconds"]
    if stacks:
        lines.append("stack " + "; ".join(f"{n} ({v})" for n, v in sorted(stacks)) + " (dlsim stacks show NAME)")
    lines.append(table(head, rows, right))
    lines += [f"assumed {key}: {why}" for key, why in (rec.get("assumed") or {}).items()]
    notes: dict[str, list[str]] = {}
    for e in rec["entries"]:
        if e.get("memory_note"):
            notes.setdefault(e["memory_note"], []).append(e["name"])
    lines += [f"{note}: {', '.join(dict.fromkeys(names))}" for note, names in notes.items()]
    bad = [e for e in rec["entries"] if not e["feasible"]]
    if bad:
        lines.append("")
        for e in bad:
            gpus = f" ({e['gpus']} GPUs)" if e.get("gpus") else ""
            lines.append(f"x {e['name']}{gpus}: {e['reason']}")
    ok = [e for e in rec["entries"] if e["feasible"]]
    if ok:
        best = max(ok, key=lambda e: e["throughput_samples_per_s"])
        lines.append(f"\nfastest feasible: {best['name']} ({best.get('gpus')} GPUs), "
                     f"{best['iteration_time_s']:.4g} s per iteration, {best['throughput_samples_per_s']:.4g} samples/s")
    return "\n".join(lines)


def comparison_csv(rec: dict[str, Any]) -> str:
    curves = {(name, p["gpus"]): p for name, pts in (rec.get("scaling_curves") or {}).items() for p in pts}
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    varying = varying_fields(rec["entries"])
    w.writerow(CSV_COLUMNS + tuple(varying))
    for e in rec["entries"]:
        s = e.get("strategy") or {}
        bd = e.get("breakdown_s") or {}
        p = curves.get((e["name"], e.get("gpus"))) or {}
        w.writerow([e["name"], e.get("gpus"), *(s.get(k) for k in ("dp", "tp", "pp", "microbatch_size",
                                                                   "num_microbatches", "global_batch", "schedule")),
                    e["feasible"], e.get("iteration_time_s"), *(bd.get(k) for k in PARTS),
                    e.get("throughput_samples_per_s"), e.get("model_flops_utilisation"), e.get("peak_memory_bytes"),
                    e.get("capacity_bytes"), p.get("speedup"), p.get("efficiency"), e.get("reason", ""),
                    s.get("sync"), s.get("staleness") if s.get("sync") == "ssp" else None, e.get("staleness_mean"),
                    e.get("tokens_per_s"), e.get("model_tflops_per_gpu"),
                    *(field_text(s[k]) if k in s else None for k in varying)])
    return out.getvalue()


def draw_comparison(rec: dict[str, Any]) -> Any:
    from dlsim.report.compare_plots import comparison_figure, scaling_figure
    return scaling_figure(rec) if rec.get("scaling") else comparison_figure(rec)


@main.command("compare")
@click.argument("model")
@click.option("--cluster", "-c", required=True, help="Hardware profile: built-in name or directory.")
@click.option("--strategy", "strategies", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Strategy YAML file (repeatable); with --grid, one file is the grid's base.")
@click.option("--stack", metavar="NAME|FILE",
              help="Software stack of every strategy (dlsim stacks) [default: the model's, else pytorch]; "
                   "compare stacks with --grid \"stack=pytorch,megatron-core\".")
@click.option("--grid", help='Grid of strategy fields, e.g. "dp=8,16 tp=1,2,4 pp=1,2" (YAML keys and units).')
@click.option("--gpus", "gpus_text", metavar="N[,N...]",
              help="GPU counts: dp = N / (tp x pp) on enough nodes (a grid with dp keeps the combinations using N).")
@click.option("--scaling", type=click.Choice(["strong", "weak"]),
              help="Scaling study over --gpus: strong keeps the global batch, weak grows it with the GPUs.")
@click.option("--global-batch", type=int, help="Samples per iteration for every strategy: its micro-batch size (or count) kept; with neither, "
                   "one micro-batch of global batch / dp per replica, as simulate derives it (stated as assumed).")
@click.option("--sync", type=click.Choice(SYNCS), help="Gradient synchronisation of every strategy: allreduce, or "
              "parameter servers (ps), asynchronous (async), stale-synchronous (ssp), as dlsim simulate --sync runs them.")
@click.option("--staleness", type=click.IntRange(0), help="SSP staleness bound s of every strategy (--sync ssp).")
@click.option("--ps-shards", type=click.IntRange(1), help="Parameter-server shards (--sync ps|async|ssp).")
@click.option("--iterations", type=click.IntRange(1), help="Iterations per worker (--sync ps|async|ssp; default 20).")
@click.option("--nodes", type=int, help="Resize the cluster to this many nodes (default: the profile's, or "
                                         "enough for each --gpus count).")
@click.option("--model-only", is_flag=True, help="Ignore measured tables; price with the roofline model.")
@click.option("--jobs", "-j", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Simulate on a process pool of this many workers.")
@click.option("--csv", "csv_out", type=OutputFile(), help="Write the table as CSV to FILE.")
@click.option("--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]", type=OutputFile(),
              help="Print the comparison record as JSON (or write it to FILE; redraw it with dlsim plot).")
@click.option("--plot", "plot_path", type=OutputFile(figure=True),
              help="Draw the comparison (or the scaling study) into FILE.png.")
@force_option
@set_option
def compare_cmd(model: str, cluster: str, strategies: tuple[str, ...], stack: str | None, grid: str | None,
                gpus_text: str | None,
                scaling: str | None, global_batch: int | None, sync: str | None, staleness: int | None,
                ps_shards: int | None, iterations: int | None, nodes: int | None, model_only: bool, jobs: int,
                csv_out: str | None, json_out: str | None, plot_path: str | None, overrides: tuple[str, ...]) -> None:
    """Compare parallel strategies of MODEL on a cluster: time split, memory, throughput.

    Strategies come from --strategy files or a --grid. Each is simulated event by event. A
    strategy that cannot be built (sizes that do not divide, too few devices) or does not fit in
    memory is listed with its limit and by how much; the exit code is 1 only when all of them fail.
    With --scaling strong|weak and --gpus 8,16,...: speedup and parallel efficiency against GPUs.
    """
    if plot_path is not None:
        check_figure_path(plot_path, "--plot")
    for path, option in ((csv_out, "--csv"), (json_out if json_out != "-" else None, "--json")):
        if path is not None:
            prepare_output(path, option)
    from dlsim.api.compare import compare
    for path in strategies:
        announce_empty_strategy(path)
    gpus = _gpus(gpus_text)
    if scaling and not gpus:
        raise SpecError("--scaling needs --gpus with at least two counts, e.g. --gpus 8,16,32", field="gpus")
    common = {k: v for k, v in (("sync", sync), ("staleness", staleness), ("ps_shards", ps_shards),
                                ("iterations", iterations), ("stack", stack)) if v is not None}
    rec = compare(model, cluster, strategies, grid=grid, gpus=gpus, scaling=scaling, global_batch=global_batch,
                  nodes=nodes, measured=not model_only, overrides=parse_overrides(overrides), jobs=jobs,
                  fields=common)
    rec = json_safe(rec)
    if csv_out is not None:
        emit_text(csv_out, comparison_csv(rec), "--csv")
    if json_out is not None:
        emit_json(rec, json_out)
    if plot_path is not None:
        emit_figure(plot_path, "--plot", lambda: draw_comparison(rec))
    if wants_summary(json_out):
        click.echo(comparison_table(rec))
    if rec["entries"] and not rec["feasible"]:
        from dlsim.api.compare import no_feasible_reason
        raise InfeasibleError(no_feasible_reason(rec))
