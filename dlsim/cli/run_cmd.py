"""``dlsim run``: a whole training run (time to train with failures and checkpoints, energy, cost)."""

from __future__ import annotations

from typing import Any

import click

from dlsim.cli import main
from dlsim.cli.options import FINITE_FLOAT, json_option, parse_overrides, set_option
from dlsim.cli.output import OutputFile, emit_json, json_safe, prepare_output, wants_summary
from dlsim.cli.simulate import _nested_given, _strategy_fields, simulate_cmd
from dlsim.errors import SpecError
from dlsim.units import parse_count, parse_time

_NOT_FOR_RUN = {"trace_out", "trace_ranks", "trace_window", "gantt_out", "gantt_devices", "json_out", "force",
                "overrides", "microbatch_plan", "workspace_limit", "full", "expand_collectives", "model", "cluster"}


def _run_options(opts: dict[str, Any]) -> dict[str, Any]:
    """The `dlsim.api.run.RunOptions` fields the user gave."""
    out: dict[str, Any] = {}
    for key in ("node_failures_per_1000_node_days", "device_failures_per_1000_device_days",
                "planned_interruptions_per_day", "pue", "usd_per_gpu_hour", "usd_per_kwh"):
        if opts.get(key) is not None:
            out[key] = opts[key]
    if opts.get("storage_write_per_node") is not None:
        out["storage_write_gbytes_per_s_per_node"] = opts["storage_write_per_node"]
    if opts.get("storage_aggregate_write") is not None:
        out["storage_aggregate_write_gbytes_per_s"] = opts["storage_aggregate_write"]
    if opts.get("relaunch") is not None:
        out["relaunch_s"] = parse_time(opts["relaunch"])
    if opts.get("checkpoint_interval") is not None:
        out["interval_s"] = parse_time(opts["checkpoint_interval"])
    out["checkpoint"] = opts.get("checkpoint") or "sync"
    out["failures"] = not opts.get("no_failures")
    out["trials"] = opts["trials"] if opts.get("trials") is not None else 200
    out["seed"] = opts.get("mc_seed") or 0
    return out


def _gpus_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or any(g < 1 for g in out):
        raise SpecError(f"--scale needs comma-separated GPU counts, e.g. 4096,8192,16384, got {text!r}", field="scale")
    return out


@main.command("run")
@click.argument("model")
@click.option("--cluster", "-c", required=True, help="Hardware profile: built-in name or directory.")
@click.option("--tokens", required=True, help="Token budget, e.g. 15T, 2.87T, 300B (samples for a model without tokens).")
@click.option("--batch-schedule", help="Batch-size ramp-up: GLOBAL_BATCH:TOKENS phases before the strategy's batch, "
                                       "e.g. 1024:252M,2048:2.87T.")
@click.option("--checkpoint", type=click.Choice(["sync", "async"]), default=None,
              help="Synchronous (the job blocks for the write) or asynchronous (blocks for the copy to host memory) "
                   "[default: sync].")
@click.option("--checkpoint-interval", help="Checkpoint every this much training time, e.g. 30min [default: the optimum].")
@click.option("--node-failures-per-1000-node-days", type=FINITE_FLOAT, help="Override the profile's failure rate per node.")
@click.option("--device-failures-per-1000-device-days", type=FINITE_FLOAT, help="Override the profile's failure rate per device.")
@click.option("--planned-interruptions-per-day", type=FINITE_FLOAT, help="Planned interruptions (maintenance) per day of the job.")
@click.option("--storage-write-per-node", type=FINITE_FLOAT, help="Checkpoint write bandwidth per node, GB/s.")
@click.option("--storage-aggregate-write", type=FINITE_FLOAT, help="Checkpoint write bandwidth of the storage system, GB/s.")
@click.option("--relaunch", help="Relaunch time after a failure, e.g. 10min (the checkpoint read and warm-up come on top).")
@click.option("--pue", type=FINITE_FLOAT, help="Facility power usage effectiveness (total / IT power) [default: the profile's].")
@click.option("--usd-per-gpu-hour", type=FINITE_FLOAT, help="Price of one GPU-hour (USD).")
@click.option("--usd-per-kwh", type=FINITE_FLOAT, help="Price of one facility kWh (USD).")
@click.option("--no-failures", is_flag=True, help="No failures: iterations x iteration time plus checkpoints.")
@click.option("--trials", type=int, help="Monte Carlo runs of failures for the distribution [default: 200; 0: none].")
@click.option("--mc-seed", type=int, help="Seed of the Monte Carlo failure draws [default: 0].")
@click.option("--scale", "scale", metavar="GPUS", help="Model the run at these GPU counts (dp scaled, the global batch "
                                                         "kept), e.g. 4096,8192,16384.")
@click.option("--plot", "plot_out", type=OutputFile(figure=True),
              help="With --scale: goodput, time to train and cost (or energy) against GPUs, into FILE.png.")
@set_option
@json_option
def run_cmd(model: str, cluster: str, tokens: str, batch_schedule: str | None, scale: str | None,
            plot_out: str | None, json_out: str | None, overrides: tuple[str, ...], **opts: Any) -> None:
    """Model a whole training run of MODEL: iterations, time to train with failures and checkpoints
    (expected and a Monte Carlo distribution), GPU-hours, energy and cost.

    Takes the strategy options of `dlsim simulate`; the failure, storage, restart and power model
    come from the profile's run sections unless overridden here.
    """
    from dlsim.api.run import RunOptions, run, run_scaling
    if json_out is not None and json_out != "-":
        prepare_output(json_out, "--json")
    if plot_out is not None:
        from dlsim.cli.compare import check_figure_path
        if scale is None:
            raise SpecError("--plot draws the --scale study: give --scale GPUS", field="plot")
        check_figure_path(plot_out, "--plot")
    budget = parse_count(tokens)
    options = RunOptions(tokens=budget, **_run_options(opts))
    fields = _strategy_fields(opts)
    kw = dict(options=options, batch_schedule=batch_schedule, nodes=opts.get("nodes"),
              measured=not opts.get("model_only"), overrides=parse_overrides(overrides), given=_nested_given(opts))
    if scale is not None:
        results = run_scaling(model, cluster, opts.get("strategy_file"), gpus=_gpus_list(scale), tokens=budget,
                              **kw, **fields)
        recs = [r.to_dict() for r in results]
        record = {"kind": "run_scaling", "runs": recs}
        if plot_out is not None:
            from dlsim.cli.compare import emit_figure
            from dlsim.report.run_plots import scaling_figure
            emit_figure(plot_out, "--plot", lambda: scaling_figure(recs))
    else:
        record = run(model, cluster, opts.get("strategy_file"), tokens=budget, **kw, **fields).to_dict()
        recs = [record]
    if json_out is not None:
        emit_json(record, json_out)
    if wants_summary(json_out):
        from dlsim.report.run_text import run_summary
        for i, rec in enumerate(recs):
            json_safe(rec)
            click.echo(("\n" if i else "") + run_summary(rec))


for _param in simulate_cmd.params:
    if _param.name not in _NOT_FOR_RUN and _param.name not in {p.name for p in run_cmd.params}:
        run_cmd.params.append(_param)
