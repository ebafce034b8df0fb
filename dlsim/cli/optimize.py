"""``dlsim optimize``: search strategies analytically, simulate the best, rank by the simulation."""

from __future__ import annotations

import csv
import io
from typing import Any

import click

from dlsim.api.optimize import OBJECTIVES, optimize
from dlsim.cli import main
from dlsim.cli.compare import check_figure_path, emit_figure
from dlsim.cli.options import parse_overrides, set_option
from dlsim.cli.output import add_assumed, emit_json, emit_text, force_option, json_safe, prepare_output, wants_summary
from dlsim.errors import SpecError
from dlsim.report.optimize_text import optimize_summary

CSV_FIELDS = ("rank", "label", "dp", "tp", "pp", "microbatch_size", "num_microbatches", "schedule", "virtual_stages",
              "recompute", "sequence_parallel", "zero", "feasible", "iteration_time_s", "estimated_time_s",
              "throughput_samples_per_s", "compute_s", "recompute_s", "exposed_comm_s", "bubble_s", "idle_s",
              "peak_memory_bytes", "capacity_bytes")


def _csv(rec: dict[str, Any]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for r in rec["ranked"]:
        b, s = r["breakdown_s"], r["strategy"]
        w.writerow([r["rank"], r["label"], *(s[k] for k in CSV_FIELDS[2:12]), r["feasible"], r["iteration_time_s"],
                    r["estimate"]["iteration_time_s"], r["throughput_samples_per_s"],
                    *(b.get(k, 0.0) for k in ("compute", "recompute", "exposed_comm", "bubble", "idle")),
                    r["peak_memory_bytes"], r["capacity_bytes"]])
    return out.getvalue()


def _ints(text: str, option: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4); one clear line for anything else."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpecError(f"{option} needs comma-separated integers, got {text!r}", field=option.lstrip("-")) from None


@main.command("optimize")
@click.argument("model")
@click.option("--cluster", "-c", required=True, help="Hardware profile: built-in name or directory.")
@click.option("--gpus", type=int, required=True, help="Devices to train on (dp x tp x pp).")
@click.option("--global-batch", type=int, required=True, help="Samples per iteration (fixed).")
@click.option("--nodes", type=int, default=None, help="Resize the cluster to this many nodes [default: enough for --gpus].")
@click.option("--objective", type=click.Choice(OBJECTIVES), default="time", show_default=True,
              help="Rank by iteration time or by peak memory per device.")
@click.option("--top", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="Simulate at least the K best candidates of the analytic evaluator.")
@click.option("--max-memory-fraction", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
              help="A candidate must fit in this fraction of the device memory.")
@click.option("--fix", multiple=True, metavar="FIELD=VALUE",
              help="Pin a strategy field, e.g. --fix tp=8 --fix schedule=1f1b (repeatable).")
@click.option("--schedules", default="1f1b,interleaved", show_default=True,
              help="Pipeline schedules to search (gpipe, 1f1b, interleaved), comma-separated.")
@click.option("--max-microbatch-size", type=click.IntRange(1, 1 << 20), default=8, show_default=True,
              help="Largest micro-batch size searched.")
@click.option("--tp-across-nodes", is_flag=True, help="Allow tensor parallelism beyond one node.")
@click.option("--cp", "cp_degrees", default="1", show_default=True,
              help="Context-parallel degrees to search, comma-separated (ring attention; token models).")
@click.option("--hybrid-shard", is_flag=True, help="Also search hybrid sharding of ZeRO 1-3 (shard within a node).")
@click.option("--offload", "offloads", default="none", show_default=True,
              help="Offload choices to search (none, activations, optimizer, both), comma-separated.")
@click.option("--max-simulations", type=click.IntRange(1, 10000), default=24, show_default=True,
              help="At most this many candidates are simulated.")
@click.option("--jobs", type=click.IntRange(1, 64), default=None,
              help="Processes sizing, evaluating and simulating the candidates (the same result with 1) "
                   "[default: the machine's cores, at most 8].")
@click.option("--model-only", is_flag=True, help="Ignore measured tables; price with the roofline model.")
@click.option("--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              help="Print the record as JSON (or write it to FILE).")
@click.option("--csv", "csv_out", type=click.Path(dir_okay=False), default=None, help="Write the ranked table as CSV.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Draw the Pareto front of iteration time against memory per device (PNG, PDF or SVG).")
@force_option
@set_option
def optimize_cmd(model: str, cluster: str, gpus: int, global_batch: int, nodes: int | None, objective: str, top: int,
                 max_memory_fraction: float, fix: tuple[str, ...], schedules: str, max_microbatch_size: int,
                 tp_across_nodes: bool, cp_degrees: str, hybrid_shard: bool, offloads: str,
                 max_simulations: int, jobs: int | None, model_only: bool,
                 json_out: str | None,
                 csv_out: str | None, plot_path: str | None, overrides: tuple[str, ...]) -> None:
    """Find the best parallel strategy for MODEL on --gpus devices of a cluster at a fixed global batch.

    Enumerates dp x tp x pp, micro-batching, schedule, recomputation, sequence parallelism and ZeRO;
    drops what cannot be built or fit; weighs the rest with an analytic evaluator built from the
    simulator's cost pieces; simulates the best event by event and ranks by the simulation. Prints
    the ranked table, why the winner wins and the Pareto front of time against memory. No feasible
    candidate: one line naming the limit, exit code 1.
    """
    for path, option in ((json_out if json_out != "-" else None, "--json"), (csv_out, "--csv")):
        if path is not None:
            prepare_output(path, option)
    if plot_path is not None:
        check_figure_path(plot_path, "--plot")
    from dlsim.progress import Progress
    with Progress(tick=True) as bar:  # a ticking clock on stderr while the search runs (a terminal only)
        bar.phase(f"optimize {model} on {gpus} GPUs: sizing, evaluating and simulating candidates", waiting=True)
        result = optimize(model, cluster, gpus=gpus, global_batch=global_batch, objective=objective, top=top,
                          max_memory_fraction=max_memory_fraction, fix=list(fix), nodes=nodes,
                          schedules=tuple(x.strip() for x in schedules.split(",") if x.strip()),
                          max_microbatch_size=max_microbatch_size, tp_across_nodes=tp_across_nodes,
                          measured=not model_only, max_simulations=max_simulations, jobs=jobs,
                          cp=_ints(cp_degrees, "--cp"), hybrid_shard=hybrid_shard,
                          offload=tuple(x.strip() for x in offloads.split(",") if x.strip()),
                          overrides=parse_overrides(overrides))
        bar.end_phase()
    rec = add_assumed(json_safe(result.to_dict()))
    if wants_summary(json_out):
        click.echo(optimize_summary(rec))
    if json_out is not None:
        emit_json(rec, json_out)
    if csv_out is not None:
        emit_text(csv_out, _csv(rec), "--csv")
    if plot_path is not None:
        from dlsim.report.optimize_plot import pareto_figure
        emit_figure(plot_path, "--plot", lambda: pareto_figure(rec))
