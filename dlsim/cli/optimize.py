"""``dlsim optimize``: search strategies analytically, simulate the best, rank by the simulation."""

from __future__ import annotations

import contextlib
import csv
import io
from typing import Any, Iterator

import click

from dlsim.api.optimize import OBJECTIVES, label, optimize
from dlsim.cli import main
from dlsim.cli.compare import check_figure_path, emit_figure
from dlsim.cli.options import FINITE_FLOAT, parse_overrides, set_option
from dlsim.cli.output import (OutputFile, add_assumed, emit_json, emit_text, force_option, json_safe, prepare_output,
                              wants_summary)
from dlsim.errors import SpecError
from dlsim.report.optimize_text import optimize_summary, stacks_summary

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


@contextlib.contextmanager
def searching(model: str, gpus: int) -> Iterator[None]:
    """A ticking clock on stderr (a terminal only) while the search runs."""
    from dlsim.progress import Progress
    with Progress(tick=True) as bar:
        bar.phase(f"optimize {model} on {gpus} GPUs: sizing, evaluating and simulating candidates", waiting=True)
        yield
        bar.end_phase()


def _ints(text: str, option: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4); one clear line for anything else."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpecError(f"{option} needs comma-separated integers, got {text!r}", field=option.lstrip("-")) from None


def _run_options(tokens: str | None, usd_per_gpu_hour: float | None, usd_per_kwh: float | None,
                 checkpoint: str | None) -> dict | None:
    """The run options of `--objective time-to-train|cost|energy` (None without --tokens)."""
    if tokens is None:
        if usd_per_gpu_hour is not None or usd_per_kwh is not None or checkpoint is not None:
            raise SpecError("prices and --checkpoint belong to the run objectives: give --tokens too", field="tokens")
        return None
    from dlsim.units import parse_count
    out: dict = {"tokens": parse_count(tokens), "checkpoint": checkpoint or "sync"}
    if usd_per_gpu_hour is not None:
        out["usd_per_gpu_hour"] = usd_per_gpu_hour
    if usd_per_kwh is not None:
        out["usd_per_kwh"] = usd_per_kwh
    return out


def best_strategy_yaml(result) -> str:
    """The winner of `result` as a strategy file, with a header saying where it came from."""
    import yaml
    from dlsim.io.strategy_yaml import strategy_document
    best = result.best
    head = (f"# dlsim optimize: the best of {result.enumerated} candidates for {result.model} on {result.gpus} x "
            f"{result.cluster}, global batch {result.global_batch}\n# {label(best.strategy)}: "
            f"{best.time_s:.6g} s per iteration (simulated), {best.memory_bytes / 2**30:.4g} GiB per device\n")
    return head + yaml.safe_dump(strategy_document(best.strategy), sort_keys=False)



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
@click.option("--stack", metavar="NAME|FILE",
              help="Software stack every candidate runs on (dlsim stacks) [default: the model's, else pytorch].")
@click.option("--stacks", "stacks_text", metavar="A,B[,...]",
              help="Compare software stacks: the search once per stack, each stack's best strategy side by side.")
@click.option("--fix", multiple=True, metavar="FIELD=VALUE",
              help="Pin a strategy field, e.g. --fix tp=8 --fix schedule=1f1b (repeatable).")
@click.option("--schedules", default="1f1b,interleaved", show_default=True,
              help="Pipeline schedules to search (gpipe, 1f1b, interleaved), comma-separated.")
@click.option("--max-microbatch-size", type=click.IntRange(1, 1 << 20), default=8, show_default=True,
              help="Largest micro-batch size searched.")
@click.option("--tp-across-nodes", is_flag=True, help="Allow tensor parallelism beyond one node.")
@click.option("--cp", "cp_degrees", default="1", show_default=True,
              help="Context-parallel degrees to search, comma-separated (ring attention; token models).")
@click.option("--spatial", "spatial_degrees", default="1", show_default=True,
              help="Spatial-parallel degrees to search, comma-separated (images split by height and width, halo "
                   "exchanges; image models, tp 1).")
@click.option("--hybrid-shard", is_flag=True, help="Also search hybrid sharding of ZeRO 1-3 (shard within a node).")
@click.option("--offload", "offloads", default="none", show_default=True,
              help="Offload choices to search (none, activations, optimizer, both), comma-separated.")
@click.option("--tokens", help="Token budget of the run (e.g. 15T): needed by --objective time-to-train, cost, energy.")
@click.option("--usd-per-gpu-hour", type=FINITE_FLOAT, help="Price of one GPU-hour (USD; --objective cost).")
@click.option("--usd-per-kwh", type=FINITE_FLOAT, help="Price of one facility kWh (USD; --objective cost).")
@click.option("--checkpoint", type=click.Choice(["sync", "async"]), default=None,
              help="Checkpointing of the run objectives [default: sync].")
@click.option("--max-simulations", type=click.IntRange(1, 10000), default=24, show_default=True,
              help="At most this many candidates are simulated.")
@click.option("--jobs", type=click.IntRange(1, 64), default=None,
              help="Processes sizing, evaluating and simulating the candidates (the same result with 1) "
                   "[default: the machine's cores, at most 8].")
@click.option("--model-only", is_flag=True, help="Ignore measured tables; price with the roofline model.")
@click.option("--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]", type=OutputFile(),
              help="Print the record as JSON (or write it to FILE).")
@click.option("--csv", "csv_out", type=OutputFile(), default=None, help="Write the ranked table as CSV.")
@click.option("--save-best", "save_best", type=OutputFile(), default=None, metavar="FILE.yaml",
              help="Write the winning strategy as a strategy file (dlsim simulate --strategy FILE.yaml reads it).")
@click.option("--plot", "plot_path", type=OutputFile(figure=True), default=None,
              help="Draw the Pareto front of iteration time against memory per device (PNG, PDF or SVG).")
@force_option
@set_option
def optimize_cmd(model: str, cluster: str, gpus: int, global_batch: int, nodes: int | None, objective: str, top: int,
                 max_memory_fraction: float, stack: str | None, stacks_text: str | None, fix: tuple[str, ...],
                 schedules: str, max_microbatch_size: int,
                 tp_across_nodes: bool, cp_degrees: str, spatial_degrees: str, hybrid_shard: bool, offloads: str,
                 max_simulations: int, jobs: int | None, model_only: bool, tokens: str | None,
                 usd_per_gpu_hour: float | None, usd_per_kwh: float | None, checkpoint: str | None,
                 json_out: str | None,
                 csv_out: str | None, save_best: str | None, plot_path: str | None,
                 overrides: tuple[str, ...]) -> None:
    """Find the best parallel strategy for MODEL on --gpus devices of a cluster at a fixed global batch.

    Enumerates dp x tp x pp, micro-batching, schedule, recomputation, sequence parallelism and ZeRO;
    drops what cannot be built or fit; weighs the rest with an analytic evaluator built from the
    simulator's cost pieces; simulates the best event by event and ranks by the simulation. Prints
    the ranked table, why the winner wins and the Pareto front of time against memory. No feasible
    candidate: one line naming the limit, exit code 1.
    """
    for path, option in ((json_out if json_out != "-" else None, "--json"), (csv_out, "--csv"),
                         (save_best, "--save-best")):
        if path is not None:
            prepare_output(path, option)
    if plot_path is not None:
        check_figure_path(plot_path, "--plot")
    if stacks_text is not None:
        if stack is not None:
            raise SpecError("give --stack or --stacks, not both", field="stacks")
        if csv_out is not None or plot_path is not None:
            raise SpecError("--csv and --plot draw one search; with --stacks use --json", field="stacks")
        from dlsim.api.optimize import optimize_stacks
        with searching(model, gpus):
            stacked = optimize_stacks(
            model, cluster, [x.strip() for x in stacks_text.split(",") if x.strip()], gpus=gpus,
            global_batch=global_batch, objective=objective, top=top, max_memory_fraction=max_memory_fraction,
            fix=list(fix), nodes=nodes, schedules=tuple(x.strip() for x in schedules.split(",") if x.strip()),
            max_microbatch_size=max_microbatch_size, tp_across_nodes=tp_across_nodes, measured=not model_only,
            max_simulations=max_simulations, jobs=jobs, cp=_ints(cp_degrees, "--cp"), hybrid_shard=hybrid_shard,
            offload=tuple(x.strip() for x in offloads.split(",") if x.strip()), overrides=parse_overrides(overrides))
        rec = json_safe(stacked)
        if wants_summary(json_out):
            click.echo(stacks_summary(rec))
        if json_out is not None:
            emit_json(rec, json_out)
        return
    with searching(model, gpus):
        result = optimize(model, cluster, gpus=gpus, global_batch=global_batch, objective=objective, top=top,
                          max_memory_fraction=max_memory_fraction, fix=list(fix), nodes=nodes,
                          schedules=tuple(x.strip() for x in schedules.split(",") if x.strip()),
                          max_microbatch_size=max_microbatch_size, tp_across_nodes=tp_across_nodes,
                          measured=not model_only, max_simulations=max_simulations, jobs=jobs,
                          cp=_ints(cp_degrees, "--cp"), hybrid_shard=hybrid_shard,
                          spatial=_ints(spatial_degrees, "--spatial"),
                          offload=tuple(x.strip() for x in offloads.split(",") if x.strip()),
                          overrides=parse_overrides(overrides), stack=stack,
                          run_options=_run_options(tokens, usd_per_gpu_hour, usd_per_kwh, checkpoint))
    rec = add_assumed(json_safe(result.to_dict()))
    if wants_summary(json_out):
        click.echo(optimize_summary(rec))
        if rec.get("run"):
            click.echo(f"by the whole run ({rec['run']['objective']}): {rec['run']['sentence']}")
    if json_out is not None:
        emit_json(rec, json_out)
    if csv_out is not None:
        emit_text(csv_out, _csv(rec), "--csv")
    if save_best is not None:
        emit_text(save_best, best_strategy_yaml(result), "--save-best")
    if plot_path is not None:
        from dlsim.report.optimize_plot import pareto_figure
        emit_figure(plot_path, "--plot", lambda: pareto_figure(rec))
