"""`simulate()`: one training iteration (or, for parameter-server training, many) event by event."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Unpack

from dlsim.api.fields import StrategyFields
from dlsim.api.limits import check_nodes_limit, check_strategy_limits
from dlsim.api.modes import ALLREDUCE_ONLY, PS_ONLY, check_mode_fields
from dlsim.api.models import as_cluster, as_model, check_dtype
from dlsim.cost.layers import layer_cost
from dlsim.cost.memory import grad_accumulation_bytes
from dlsim.errors import InfeasibleError, SpecError
from dlsim.io.strategy_yaml import load_strategy
from dlsim.plan.comm import CommPricer, Layout
from dlsim.plan.contextparallel import add_rings, split_sequence
from dlsim.plan.fp8 import COMPUTE_DTYPE, apply_fp8, check_fp8
from dlsim.plan.offload import host_link
from dlsim.plan.iteration import IterationInputs, build_iteration
from dlsim.plan.layergroups import add_transitions, batches_and_degrees, group_modes
from dlsim.plan.expertparallel import check_expert_parallel, expert_notes
from dlsim.plan.layertable import LayerEntry, build_layer_table, with_grad_accumulation
from dlsim.plan.partition import partition
from dlsim.plan.steptime import elementwise_timer, optimizer_timer, step_kernels
from dlsim.plan.variability import apply_variability
from dlsim.results import Estimate
from dlsim.results_sim import AsyncResult, SimResult
from dlsim.sim.ps import PSInputs, simulate_ps
from dlsim.sim.run import RunInfo, simulate_graph
from dlsim.sim.steady import simulate_steady
from dlsim.sim.trace import chrome_trace
from dlsim.sim.tracefilter import kept_devices, make_filter
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.spec.strategy import Strategy, make_strategy, validate_strategy
from dlsim.units import DTYPE_BYTES


@dataclass(frozen=True)
class Simulation:
    """A result record and, when asked for, its Chrome trace."""

    result: SimResult | AsyncResult
    trace: dict[str, Any] | None = None


def as_strategy(strategy: Strategy | str | Path | None, fields: Mapping[str, Any],
                given: Iterable[str] = ()) -> Strategy:
    """A `Strategy` from a Strategy (fields replace its values), a YAML path, or fields alone.

    Fields the strategy's mode would ignore are refused (`dlsim.api.modes`): those in `fields`,
    those a strategy file sets, those named in `given` (e.g. ``jitter_cv``, ``compression.density``).
    """
    return _resolve_strategy(strategy, fields, given)[0]


def _resolve_strategy(strategy: Strategy | str | Path | None, fields: Mapping[str, Any],
                      given: Iterable[str] = ()) -> tuple[Strategy, set[str] | None]:
    """(`as_strategy`, the names of the fields the caller set; None for a whole Strategy object)."""
    names = set(fields) | set(given)
    if isinstance(strategy, Strategy):
        s = validate_strategy(replace(strategy, **fields)) if fields else strategy
        return check_mode_fields(s, names), None
    if strategy is not None:
        s = load_strategy(strategy, dict(fields), names)
    else:
        s = make_strategy(**fields)
    return check_mode_fields(s, names), names


_RECORD_NAMES = {"bucket_size": "bucket_size_bytes", "first_bucket_size": "first_bucket_size_bytes"}


def assumed_fields(s: Strategy, given: set[str] | None, dtype: str) -> dict[str, Any]:
    """The strategy values dlsim filled in because the caller did not give them (record names),
    the dtype when it is the model's. A whole `Strategy` object counts as given (but its dtype)."""
    out: dict[str, Any] = {}
    if s.dtype is None:
        out["dtype"] = dtype
    if given is None:
        return out
    record = s.to_dict()
    derived = {"global_batch"} | ({"microbatch_size", "num_microbatches"} if "global_batch" in given else set())
    # defaults of another mode are not assumptions of this run
    derived |= set(PS_ONLY) | {"staleness"} if s.sync == "allreduce" else set(ALLREDUCE_ONLY) | {"compression"}
    if s.sync != "ssp":
        derived.add("staleness")
    for name in Strategy.__dataclass_fields__:
        key = _RECORD_NAMES.get(name, name)
        if name in given or name in derived or name == "dtype" or key not in record:
            continue
        if name in ("compression", "variability") and (
                any(g.startswith("compression.") for g in given) if name == "compression"
                else given & {"jitter", "jitter_cv", "straggler_fraction", "straggler_slowdown", "seed"}):
            continue
        out[key] = record[key]
    return out


def _check_fits(model: Model, cluster: Cluster, s: Strategy, entries: tuple[LayerEntry, ...]) -> None:
    if s.devices > cluster.num_devices:
        cp = f" x cp {s.cp}" if s.cp > 1 else ""
        raise InfeasibleError(f"strategy needs dp x tp x pp = {s.dp} x {s.tp} x {s.pp}{cp} = {s.devices} devices, "
                              f"{cluster.name} has {cluster.num_devices} ({s.devices - cluster.num_devices} short)")
    for e in entries:
        layer = model.layers[e.index]
        if e.tp_degree > 1 and e.tp.compute_sharded and layer.type in ("attention", "mla"):
            for key in ("heads", "kv_heads"):
                heads = layer.attrs.get(key)
                if heads and heads % e.tp_degree:
                    raise InfeasibleError(f"tensor parallel degree {e.tp_degree} does not divide the {heads} "
                                          f"{key.replace('_', ' ')} of layer {layer.name!r} (remainder "
                                          f"{heads % e.tp_degree})")


def _microbatch_overrides(model: Model, cluster: Cluster, s: Strategy, dtype: str, mode: str,
                          workspace_limit: str | float) -> tuple[dict[str, tuple[Estimate, Estimate, float]], str]:
    """Per-convolution (forward, backward, workspace) from the μ-cuDNN planner (dlsim.api.microbatch)."""
    from dlsim.api.microbatch import plan_microbatches
    from dlsim.results import Source
    plan = plan_microbatches(model, cluster, s.microbatch_size, workspace_limit, mode, dtype=dtype)
    out = {}
    for lp in plan.layers:
        times = {}
        for p in lp.passes:
            src = Source(p.source) if p.source in {x.value for x in Source} else Source.MODEL
            times[p.pass_name] = Estimate(p.time_s, src, f"micro-batch plan {mode}")
        fwd = times.get("forward")
        if fwd is None:
            continue
        bwd = times.get("backward_data", Estimate(0.0, fwd.source)) + times.get("backward_weight", Estimate(0.0, fwd.source))
        out[lp.name] = (fwd, bwd, lp.workspace_bytes)
    note = (f"convolutions priced by the μ-cuDNN {mode.upper()} plan: {len(out)} layers, workspace "
            f"{plan.workspace_bytes:.0f} B, {plan.time_s:.6g} s per micro-batch")
    return out, note


def _default_pricer(cluster: Cluster, layout: Layout, algorithm: str, measured: bool = True) -> CommPricer:
    from dlsim.plan.commcost import ClusterPricer
    table = None
    if measured and "comm_collectives" in cluster.tables:
        from dlsim.io.kernel_tables import load_comm_table
        table = load_comm_table(cluster)
    return ClusterPricer(cluster, layout, algorithm, table)


def run_simulation(model: Model | str | Path, cluster: Cluster | str | Path,
                   strategy: Strategy | str | Path | None = None, *, measured: bool = True, symmetry: bool = True,
                   expand_collectives: bool = False, microbatch_plan: str | None = None,
                   workspace_limit: str | float = "64MiB", trace: bool = False,
                   overrides: Mapping[str, Any] | None = None, pricer: CommPricer | None = None,
                   nodes: int | None = None, given: Iterable[str] = (),
                   trace_ranks: str | Iterable[int] | None = None,
                   trace_window: str | tuple[float | str, float | str] | None = None,
                   **fields: Unpack[StrategyFields]) -> Simulation:
    """Simulate `model` on `cluster` under `strategy` (a Strategy, a YAML file, or strategy fields).

    `symmetry` simulates one data-parallel replica and one tensor-parallel rank per stage (their
    collectives priced at the full rank count); run-time variability keeps all replicas.
    `expand_collectives` executes collectives as their point-to-point schedules on the link ports
    (only where all their ranks are simulated). `microbatch_plan` (wr | wd) prices convolutions
    with the μ-cuDNN planner under `workspace_limit`. `nodes` resizes the cluster (same nodes, more
    or fewer of them). `given` names nested strategy fields set by the caller (see `as_strategy`).
    `trace_ranks` (``"0-7,64"`` or a list of ranks) and `trace_window` (``"1s:1.5s"`` or (start,
    end) in seconds) keep only part of the trace (`dlsim.sim.tracefilter`).
    Options the run would ignore are refused: `trace` with parameter-server training,
    `expand_collectives` under the symmetry reduction, `workspace_limit` without a plan.
    """
    model, cluster = as_model(model, overrides), as_cluster(cluster)
    if nodes is not None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise SpecError(f"must be a positive integer, got {nodes!r}", field="nodes")
        cluster = replace(cluster, nodes=check_nodes_limit(nodes, cluster.devices_per_node))
    s, names = _resolve_strategy(strategy, fields, given)
    s = check_strategy_limits(s, full=not symmetry)
    keep = make_filter(trace_ranks, trace_window)
    if keep is not None and not trace:
        raise SpecError("trace ranks and window filter a trace: ask for one (--trace FILE)",
                        field="trace_ranks" if trace_ranks is not None else "trace_window")
    if trace and s.sync != "allreduce":
        raise SpecError(f"a trace records one synchronous iteration; sync {s.sync} runs many iterations "
                        "without one (drop --trace or use sync allreduce)", field="trace")
    if expand_collectives and s.cp > 1:
        raise SpecError("collectives run as point-to-point schedules need every rank simulated; the ranks of a "
                        "context-parallel ring are simulated as one (cp > 1)", field="expand_collectives")
    if expand_collectives and symmetry:
        raise SpecError("collectives run as point-to-point schedules only where all their ranks are simulated: "
                        "needs --full (symmetry=False)", field="expand_collectives")
    dtype = check_dtype(s.dtype, model)
    assumed = assumed_fields(s, names, dtype)
    device = cluster.device
    record_dtype, fp8_note = dtype, ""
    if dtype == "fp8":  # FP8 GEMMs, BF16 elsewhere (dlsim.plan.fp8)
        fp8_note, dtype = check_fp8(device, cluster.name), COMPUTE_DTYPE
    tables, notes = None, []
    if measured and cluster.tables:
        from dlsim.io.kernel_tables import load_kernel_times
        tables, notes = load_kernel_times(cluster)
        notes = list(notes)
    modes = group_modes(model, s.layer_groups) if s.layer_groups else ["data"] * len(model.layers)
    batches, degrees = batches_and_degrees(modes, s.dp, s.microbatch_size, s.tp)
    check_expert_parallel(model, s.ep)
    mb_overrides = None
    if microbatch_plan:
        if microbatch_plan not in ("wr", "wd"):
            raise SpecError(f"unknown micro-batch plan {microbatch_plan!r} (use wr, wd)", field="microbatch_plan")
        if s.tp > 1:
            raise SpecError("a micro-batch plan prices unsplit convolutions; it needs tp = 1", field="microbatch_plan")
        mb_overrides, note = _microbatch_overrides(model, cluster, s, dtype, microbatch_plan, workspace_limit)
        notes.append(note)
    full_model, model = model, split_sequence(model, s.cp)
    entries = build_layer_table(model, device, dtype, batch=batches, tp=degrees, tables=tables, ep=s.ep, ep_overlap=s.ep_overlap,
                                overrides=mb_overrides,
                                sequence_parallel=s.sequence_parallel, fused=frozenset(s.fused_kernels))
    if s.layer_groups:
        entries = add_transitions(model, entries, modes, s.dp, s.microbatch_size, dtype)
    entries = add_rings(entries, model, device, dtype, s.cp, tables, frozenset(s.fused_kernels))
    if fp8_note:  # FP8 projection GEMMs and their casts (dlsim.plan.fp8)
        entries = apply_fp8(entries, model, device, s.num_microbatches, tables, frozenset(s.fused_kernels))
        notes.append(fp8_note)
    notes += expert_notes(entries)
    _check_fits(model, cluster, s, entries)
    # balanced on the per-micro-batch work without the gradient accumulation: one partition for every
    # micro-batch count (the search's evaluator shares it the same way)
    ranges = partition(model, [e.forward.seconds + e.backward.seconds for e in entries], s.chunks, s.stage_partition)
    entries = with_grad_accumulation(entries, device,
                                     grad_accumulation_bytes(s.grad_accumulation, dtype, s.num_microbatches))
    layout = Layout(s.dp, s.tp, s.pp, cluster.devices_per_node, s.cp)
    pricer = pricer or _default_pricer(cluster, layout, s.collective, measured)
    explicit_dp = (not symmetry or s.variability.active) and s.sync == "allreduce"
    explicit_tp = not symmetry
    optimizer_time = optimizer_timer(device, dtype, s.optimizer, step_kernels(entries, s.pp))
    elementwise_time = elementwise_timer(device, dtype)

    x = IterationInputs(model, entries, tuple(ranges), s, layout, pricer, dtype, device.name,
                        device.memory_bytes - device.memory_reserved,
                        optimizer_time, elementwise_time, explicit_dp, explicit_tp, expand_collectives,
                        device.overlap_slowdown, host_link(cluster, s.offload))
    training_flops = sum(layer_cost(layer, 1, dtype).flops for layer in full_model.layers) * s.global_batch
    peak = device.peak_flops.get(dtype, max(device.peak_flops.values()))
    chunk_note = f"stage partition (layers per chunk): {[b - a for a, b in ranges]}"
    info = RunInfo(model.name, cluster.name, device.name, s.to_dict(), s.global_batch, s.pp > 1, training_flops,
                   peak, s.devices, tuple(notes) + (chunk_note,))
    # deep 1F1B pipelines: a few steady periods simulated, the period repeated (dlsim.sim.steady)
    steady = None
    if s.sync == "allreduce" and not s.variability.active and not trace:
        steady = simulate_steady(x, info)
    if steady is not None:
        return Simulation(_stated(steady, record_dtype, assumed))
    graph = build_iteration(x)
    group_of = {i: ([d.rank + t for t in range(s.tp)] if not explicit_tp else [d.rank])
                for i, d in enumerate(graph.devices)}
    if s.sync == "allreduce":
        apply_variability(graph, s.variability, s.devices, group_of)
    result, tl = simulate_graph(graph, info)
    if s.sync != "allreduce":
        params = sum(layer.params for layer in model.layers)
        ps = PSInputs(model.name, cluster.name, s, result.iteration_time_s, params * DTYPE_BYTES[dtype],
                      optimizer_time(params / s.ps_shards), pricer, layout, tuple(notes))
        return Simulation(_stated(simulate_ps(ps), record_dtype, assumed))
    if not trace:
        return Simulation(_stated(result, record_dtype, assumed))
    devices = None if keep is None else kept_devices(graph, layout, keep, explicit_dp, explicit_tp)
    events = chrome_trace(graph, tl, f"{model.name} on {cluster.name}", devices, None if keep is None else keep.window)
    if keep is not None:
        events["otherData"]["filter"] = keep.to_dict()
    return Simulation(_stated(result, record_dtype, assumed), events)


def _stated(result: SimResult | AsyncResult, dtype: str, assumed: dict[str, Any]) -> SimResult | AsyncResult:
    """The record names the dtype it ran in (never null) and the defaults it assumed."""
    return replace(result, strategy={**result.strategy, "dtype": dtype}, assumed=assumed)


def simulate(model: Model | str | Path, cluster: Cluster | str | Path, strategy: Strategy | str | Path | None = None,
             *, measured: bool = True, symmetry: bool = True, expand_collectives: bool = False,
             microbatch_plan: str | None = None, workspace_limit: str | float = "64MiB",
             overrides: Mapping[str, Any] | None = None, pricer: CommPricer | None = None, nodes: int | None = None,
             given: Iterable[str] = (), **fields: Unpack[StrategyFields]) -> SimResult | AsyncResult:
    """The result record of `run_simulation` (same arguments, without the trace): strategy `fields`
    as keywords (`dlsim.api.fields.StrategyFields`), e.g. ``simulate("gpt2", "dgx-h100", dp=2)``."""
    return run_simulation(model, cluster, strategy, measured=measured, symmetry=symmetry,
                          expand_collectives=expand_collectives, microbatch_plan=microbatch_plan,
                          workspace_limit=workspace_limit, overrides=overrides, pricer=pricer, nodes=nodes,
                          given=given, **fields).result

