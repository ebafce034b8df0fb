"""``dlsim simulate``: one training iteration (or many, for parameter-server training), event by event."""

from __future__ import annotations

import gzip
import json
from typing import Any

import click

from dlsim.api.simulate import run_simulation
from dlsim.cli import main
from dlsim.cli.options import FINITE_FLOAT, announce_empty_strategy, parse_overrides, set_option
from dlsim.cli.output import (OutputFile, add_assumed, emit_json, emit_text, force_option, json_safe, prepare_output,
                              wants_summary)
from dlsim.errors import InfeasibleError, SpecError
from dlsim.report.sim_text import simulation_summary
from dlsim.spec.strategy import OFFLOADS, OPTIMIZER_IMPLS
from dlsim.spec.strategy_values import PIPELINE_SPLITS
from dlsim.spec.strategy import COMPRESSIONS, FUSIONS, GRAD_ACCUMULATIONS, JITTERS, RECOMPUTE, SCHEDULES, SYNCS, Compression, Variability
from dlsim.units import parse_size

_INTS = ("dp", "tp", "pp", "cp", "microbatch_size", "num_microbatches", "global_batch", "virtual_stages", "staleness",
         "ps_shards", "fetch_every", "push_every", "iterations", "zero", "recompute_layers", "ep")


def _spatial(text: str) -> dict[str, int]:
    """`--spatial N` (the squarest grid) or `--spatial HxW` (H ranks along the height, W along the width)."""
    parts = str(text).lower().split("x")
    try:
        values = [int(x) for x in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or any(v < 1 for v in values):
        raise SpecError(f"--spatial needs a rank count N or a grid HxW of positive integers, got {text!r}",
                        field="spatial")
    return {"spatial": values[0]} if len(values) == 1 else {"spatial": values[0] * values[1], "spatial_w": values[1]}


def _strategy_fields(opts: dict[str, Any]) -> dict[str, Any]:
    """Strategy fields from the options the user actually gave."""
    fields: dict[str, Any] = {k: opts[k] for k in _INTS if opts.get(k) is not None}
    for key in ("schedule", "sync", "collective", "recompute", "optimizer", "dtype", "grad_accumulation", "offload",
                "stack", "optimizer_impl"):
        if opts.get(key) is not None:
            fields[key] = opts[key]
    if opts.get("overlap") is not None:
        fields["overlap"] = opts["overlap"]
    for key in ("sequence_parallel", "tp_async_backward", "p2p_overlap", "p2p_scatter_gather", "ep_overlap", "hybrid_shard",
                "param_gather_overlap", "tp_comm_overlap", "halo_overlap"):
        if opts.get(key) is not None:
            fields[key] = opts[key]
    if opts.get("spatial") is not None:
        fields.update(_spatial(opts["spatial"]))
    if opts.get("fsdp"):
        if fields.get("zero", 3) != 3:
            raise SpecError(f"--fsdp is ZeRO stage 3 (FSDP FULL_SHARD); it contradicts --zero {fields['zero']}",
                            field="fsdp")
        fields["zero"] = 3
    if opts.get("fused_kernels") is not None:
        fields["fused_kernels"] = tuple(k.strip() for k in opts["fused_kernels"].split(",") if k.strip())
    if opts.get("bucket_size") is not None:
        fields["bucket_size"] = parse_size(opts["bucket_size"])
    if opts.get("stage_partition") in PIPELINE_SPLITS:
        fields["pipeline_split"] = opts["stage_partition"]
    elif opts.get("stage_partition"):
        try:
            fields["stage_partition"] = tuple(int(x) for x in opts["stage_partition"].split(","))
        except ValueError:
            raise SpecError(f"--stage-partition needs comma-separated layer counts, balanced or uniform, "
                            f"got {opts['stage_partition']!r}")
    comp = {key: opts[f"compression_{key}"] for key in ("bits", "density", "value_bits") if opts.get(f"compression_{key}") is not None}
    if opts.get("compression") is not None or comp:
        fields["compression"] = Compression(kind=opts.get("compression") or "none", **comp)
    var = {k: opts[k] for k in ("jitter", "jitter_cv", "straggler_fraction", "straggler_slowdown", "seed")
           if opts.get(k) is not None}
    if var:
        fields["variability"] = Variability(**var)
    return fields


def _time_to_train(model: str, overrides: tuple[str, ...], tokens: str, rec: dict[str, Any]) -> dict[str, Any]:
    """Iterations x iteration time for a token budget (the `dlsim.api.run` arithmetic, without failures)."""
    from dlsim.api.models import as_model
    from dlsim.api.run import phase_iterations, tokens_per_sample
    from dlsim.units import parse_count
    budget = parse_count(tokens)
    if budget <= 0 or rec.get("kind") != "simulation":
        raise SpecError("--tokens needs a positive budget and synchronous training (sync allreduce)", field="tokens")
    per = tokens_per_sample(as_model(model, parse_overrides(overrides)))
    (_, n), = phase_iterations(budget, per, (), rec["global_batch"])
    wall = n * rec["iteration_time_s"]
    return {"tokens": budget, "tokens_per_sample": per, "iterations": n, "wall_s": wall,
            "gpu_hours": wall * rec["simulation"]["total_devices"] / 3600}


def _nested_given(opts: dict[str, Any]) -> set[str]:
    """Nested strategy fields given as flags (`dlsim.api.modes` refuses those their mode ignores)."""
    names = {f"compression.{k}" for k in ("bits", "density", "value_bits") if opts.get(f"compression_{k}") is not None}
    return names | {k for k in ("jitter", "jitter_cv", "straggler_fraction", "straggler_slowdown", "seed")
                    if opts.get(k) is not None}


@main.command("simulate")
@click.argument("model")
@click.option("--cluster", "-c", required=True, help="Hardware profile: built-in name or directory.")
@click.option("--nodes", type=int, default=None, help="Resize the cluster to this many nodes (same node type).")
@click.option("--strategy", "strategy_file", type=click.Path(dir_okay=False), default=None,
              help="Strategy YAML file (flags given beside it override its fields).")
@click.option("--stack", metavar="NAME|FILE",
              help="Software stack (dlsim stacks): its values for every stack key not given [default: the model's, "
                   "else pytorch].")
@click.option("--dp", type=int, help="Data-parallel replicas.")
@click.option("--tp", type=int, help="Tensor-parallel degree.")
@click.option("--pp", type=int, help="Pipeline stages.")
@click.option("--ep", type=int, help="Expert-parallel degree: MoE experts spread over ep data-parallel ranks (divides dp).")
@click.option("--cp", type=int, help="Context-parallel degree: the sequence split over cp ranks, ring attention.")
@click.option("--spatial", metavar="N|HxW", help="Spatial-parallel ranks per image (Dryden et al. 2019): N (the "
              "squarest grid) or HxW; convolutions exchange halos.")
@click.option("--halo-overlap/--no-halo-overlap", default=None,
              help="Spatial parallelism: exchange halos beside the interior's compute (default) or before it.")
@click.option("--microbatch-size", type=int, help="Samples per micro-batch.")
@click.option("--num-microbatches", type=int, help="Micro-batches per iteration and replica.")
@click.option("--global-batch", type=int, help="Samples per iteration (dp x microbatch_size x num_microbatches).")
@click.option("--schedule", type=click.Choice(SCHEDULES), help="Pipeline schedule.")
@click.option("--virtual-stages", type=int, help="Model chunks per device (interleaved schedule).")
@click.option("--stage-partition", help="Layers per chunk, comma-separated; or balanced (by the layers' costs) "
              "or uniform (the same blocks in every chunk, Megatron-LM's split). Default: the stack's.")
@click.option("--sync", type=click.Choice(SYNCS), help="Gradient synchronisation.")
@click.option("--staleness", type=int, help="SSP staleness bound s (--sync ssp).")
@click.option("--ps-shards", type=int, help="Parameter-server shards (--sync ps|async|ssp).")
@click.option("--fetch-every", type=int, help="Pull parameters every n steps (Downpour; --sync ps|async|ssp).")
@click.option("--push-every", type=int, help="Push gradients every n steps (Downpour; --sync ps|async|ssp).")
@click.option("--iterations", type=int, help="Iterations per worker (--sync ps|async|ssp; default 20).")
@click.option("--collective", help="Collective algorithm (ring, recursive-doubling, ..., auto).")
@click.option("--bucket-size", help="Gradient bucket size, e.g. 25MiB (--sync allreduce; default 25MiB).")
@click.option("--overlap/--no-overlap", default=None, help="Overlap gradient reduction with backpropagation.")
@click.option("--recompute", type=click.Choice(RECOMPUTE), help="Activation recomputation.")
@click.option("--recompute-layers", type=int, help="Full recomputation: a checkpoint every N transformer layers (default 1).")
@click.option("--sequence-parallel/--no-sequence-parallel", default=None,
              help="Sequence parallelism (Korthikanti 2022): norms and dropouts split over the tp ranks.")
@click.option("--tp-async-backward/--no-tp-async-backward", default=None,
              help="Run the tensor-parallel input-gradient collectives beside the weight-gradient kernels (Megatron-LM).")
@click.option("--tp-comm-overlap/--no-tp-comm-overlap", default=None,
              help="Sequence parallelism's all-gathers and reduce-scatters chunked beside their GEMMs (Transformer "
                   "Engine userbuffers: ring exchange, pipelined, bulk), in TE's default configuration; a strategy file "
                   "names a recipe's (tp_comm_overlap: gpt3-175b | llama3.1-70b | llama3.1-405b).")
@click.option("--p2p-overlap/--no-p2p-overlap", default=None,
              help="Pipeline sends travel while the stage computes (default) or block it (Megatron-LM's default).")
@click.option("--p2p-scatter-gather/--no-p2p-scatter-gather", default=None,
              help="Send a replicated stage boundary as 1/tp slices, all-gathered at the receiver (Megatron-LM).")
@click.option("--ep-overlap/--no-ep-overlap", default=None,
              help="Run MoE shared experts beside the expert-parallel all-to-alls (Megatron-Core's shared-expert overlap).")
@click.option("--fused-kernels", help=f"Fused kernels of the software stack, comma-separated ({', '.join(FUSIONS)}).")
@click.option("--grad-accumulation", type=click.Choice(GRAD_ACCUMULATIONS),
              help="How each micro-batch's weight gradient is added into the gradient buffer [default: autograd].")
@click.option("--zero", type=click.IntRange(0, 3), help="ZeRO stage (1: distributed optimizer, 3: FSDP).")
@click.option("--param-gather-overlap/--no-param-gather-overlap", default=None,
              help="ZeRO-1/2: all-gather the updated parameters beside the next forward pass (Megatron-Core).")
@click.option("--fsdp", is_flag=True, default=None, help="FSDP / ZeRO-3: parameters, gradients and optimizer state sharded.")
@click.option("--hybrid-shard/--no-hybrid-shard", default=None,
              help="Shard the ZeRO states within each node and replicate across nodes (FSDP HYBRID_SHARD).")
@click.option("--compression", type=click.Choice(COMPRESSIONS), help="Gradient compression (--sync allreduce).")
@click.option("--compression-bits", type=int, help="QSGD bits per element (--compression qsgd; default 4).")
@click.option("--compression-density", type=FINITE_FLOAT, help="Top-k fraction kept (--compression topk; default 0.01).")
@click.option("--compression-value-bits", type=int,
              help="Top-k values quantised to this many bits (--compression topk; default 32: unquantised).")
@click.option("--jitter", type=click.Choice(JITTERS), help="Run-time jitter distribution.")
@click.option("--jitter-cv", type=FINITE_FLOAT, help="Jitter coefficient of variation (with --jitter).")
@click.option("--straggler-fraction", type=FINITE_FLOAT, help="Fraction of devices that are stragglers.")
@click.option("--straggler-slowdown", type=FINITE_FLOAT, help="Straggler slowdown factor (with --straggler-fraction).")
@click.option("--seed", type=int, help="Seed of the variability draws (jitter, stragglers).")
@click.option("--optimizer", type=click.Choice(["sgd", "momentum", "adam"]), help="Optimizer (state memory, step).")
@click.option("--optimizer-impl", type=click.Choice(OPTIMIZER_IMPLS),
              help="How the optimizer step runs: fused kernels, PyTorch foreach ops, or a per-tensor loop.")
@click.option("--offload", type=click.Choice(OFFLOADS),
              help="Move activations, the optimizer state or both to host memory over the host link (PCIe).")
@click.option("--dtype", help="fp32, tf32, fp16, bf16, fp8 (FP8 GEMMs as Transformer Engine runs them; default: the model's).")
@click.option("--microbatch-plan", type=click.Choice(["wr", "wd"]), help="Price convolutions with a μ-cuDNN plan.")
@click.option("--workspace-limit", default=None, help="Workspace limit of --microbatch-plan [default: 64MiB].")
@click.option("--analytic", is_flag=True,
              help="Time the strategy with the analytic evaluator (milliseconds; the search's fast path) instead "
                   "of the event simulation; the record says how far it is held to the simulation.")
@click.option("--full", is_flag=True, help="Simulate every rank (no symmetry reduction).")
@click.option("--expand-collectives", is_flag=True, help="Run collectives as point-to-point schedules (with --full).")
@click.option("--model-only", is_flag=True, help="Ignore measured tables; price with the roofline model.")
@click.option("--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]", type=OutputFile(),
              help="Print the result record as JSON (or write it to FILE).")
@click.option("--trace", "trace_out", type=OutputFile(),
              help="Write a Chrome trace (Perfetto) of the iteration (--sync allreduce); gzip-compressed when FILE ends in .gz.")
@click.option("--trace-ranks", metavar="RANKS",
              help="Trace only these ranks' devices, streams and links, e.g. 0-7,64 (with --trace).")
@click.option("--trace-window", metavar="START:END",
              help="Trace only spans within this slice of simulated time, e.g. 1s:1.5s or 0:500ms (with --trace).")
@click.option("--tokens", help="Also print the time to train this many tokens (e.g. 15T; no failures or checkpoints: "
                                "see dlsim run).")
@click.option("--gantt", "gantt_out", type=OutputFile(figure=True),
              help="Draw the iteration's timeline (device streams and link ports) into FILE.png (--sync allreduce).")
@click.option("--gantt-devices", type=click.IntRange(1, 4096), default=None,
              help="Devices drawn in the --gantt chart: the first N simulated devices [default: 8].")
@force_option
@set_option
def simulate_cmd(model: str, cluster: str, nodes: int | None, strategy_file: str | None, json_out: str | None,
                 trace_out: str | None, trace_ranks: str | None, trace_window: str | None,
                 gantt_out: str | None, gantt_devices: int | None, tokens: str | None,
                 microbatch_plan: str | None, workspace_limit: str | None, analytic: bool, full: bool,
                 expand_collectives: bool,
                 model_only: bool, overrides: tuple[str, ...], **opts: Any) -> None:
    """Simulate one training iteration of MODEL on a cluster profile under a parallel strategy.

    Prints the iteration time, throughput, where the time goes (compute, exposed communication,
    pipeline bubble, idle, recompute), memory per device and the critical path. An out-of-memory
    strategy is reported as infeasible (exit code 1) after the record is written.
    """
    for path, option in ((trace_out, "--trace"), (json_out if json_out != "-" else None, "--json")):
        if path is not None:
            prepare_output(path, option)  # refuse before simulating, not after
    if gantt_out is not None:
        from dlsim.cli.compare import check_figure_path
        check_figure_path(gantt_out, "--gantt")
    elif gantt_devices is not None:
        raise SpecError("--gantt-devices applies to --gantt only", field="gantt_devices")
    if workspace_limit is not None and microbatch_plan is None:
        raise SpecError("--workspace-limit applies to --microbatch-plan only", field="workspace_limit")
    announce_empty_strategy(strategy_file)
    if analytic:
        _analytic(model, cluster, strategy_file, json_out, nodes, overrides, model_only, opts,
                  trace=trace_out, gantt=gantt_out, full=full, expand=expand_collectives, plan=microbatch_plan)
        return
    sim = run_simulation(model, cluster, strategy_file, measured=not model_only, symmetry=not full,
                         expand_collectives=expand_collectives, microbatch_plan=microbatch_plan,
                         workspace_limit=workspace_limit or "64MiB", trace=trace_out is not None or gantt_out is not None,
                         nodes=nodes,
                         trace_ranks=trace_ranks, trace_window=trace_window, overrides=parse_overrides(overrides),
                         given=_nested_given(opts), **_strategy_fields(opts))
    rec = add_assumed(sim.result.to_dict())
    if tokens is not None:
        rec["time_to_train"] = _time_to_train(model, overrides, tokens, rec)
    if trace_out is not None and sim.trace is not None:
        text = json.dumps(sim.trace, allow_nan=False, separators=(",", ":")).encode() + b"\n"
        if trace_out.endswith(".gz"):
            text = gzip.compress(text, compresslevel=6, mtime=0)  # mtime 0: same run, same bytes
        emit_text(trace_out, text, "--trace")
    if gantt_out is not None and sim.trace is not None:
        from dlsim.cli.compare import emit_figure
        from dlsim.report.gantt import DEFAULT_DEVICES, gantt_figure
        emit_figure(gantt_out, "--gantt", lambda: gantt_figure(sim.trace, gantt_devices or DEFAULT_DEVICES,
                                                               pipelined=rec["strategy"].get("pp", 1) > 1))
    if json_out is not None:
        emit_json(rec, json_out)
    if wants_summary(json_out):
        json_safe(rec)
        click.echo(simulation_summary(rec))
        if "time_to_train" in rec:
            t = rec["time_to_train"]
            click.echo(f"time to train {tokens} tokens: {t['iterations']:,} iterations, {t['wall_s'] / 86400:.4g} days, "
                       f"{t['gpu_hours']:.4g} GPU-hours (no failures or checkpoints; dlsim run models them)")
    if rec.get("feasible") is False:
        raise InfeasibleError(rec["infeasible_reason"])


def _analytic(model: str, cluster: str, strategy_file: str | None, json_out: str | None, nodes: int | None,
              overrides: tuple[str, ...], model_only: bool, opts: dict[str, Any], **event_only: Any) -> None:
    """``simulate --analytic``: the analytic evaluator's record and summary (`dlsim.api.analytic`)."""
    for name, value in event_only.items():
        if value:
            raise SpecError(f"--analytic times the strategy without events: drop --{name.replace('_', '-')}",
                            field="analytic")
    from dlsim.api.analytic import estimate_strategy
    from dlsim.report.analytic_text import analytic_summary
    rec = add_assumed(estimate_strategy(model, cluster, strategy_file, measured=not model_only, nodes=nodes,
                                        overrides=parse_overrides(overrides), given=_nested_given(opts),
                                        **_strategy_fields(opts)))
    if json_out is not None:
        emit_json(rec, json_out)
    if wants_summary(json_out):
        json_safe(rec)
        click.echo(analytic_summary(rec))
    if rec.get("feasible") is False:
        raise InfeasibleError(rec["infeasible_reason"])
