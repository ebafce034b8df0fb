"""The event-level clock of a scenario (`dlsim.plan.scenario.Scenario`): its iteration simulated,
or, for parameter-server training, many iterations of every worker.

Deep 1F1B pipelines are simulated for a few steady periods and the period repeated
(`dlsim.sim.steady`) unless a trace or run-time variability needs every task; run-time variability
scales the compute tasks of the graph (`dlsim.plan.variability`) before it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dlsim.plan.scenario import Scenario
from dlsim.plan.variability import apply_variability
from dlsim.plan.iteration import build_iteration
from dlsim.results_sim import AsyncResult, SimResult
from dlsim.sim.ps import PSInputs, simulate_ps
from dlsim.sim.run import RunInfo, simulate_graph
from dlsim.sim.steady import simulate_steady
from dlsim.sim.trace import chrome_trace
from dlsim.sim.tracefilter import TraceFilter, kept_devices
from dlsim.units import DTYPE_BYTES


@dataclass(frozen=True)
class Simulation:
    """A result record and, when asked for, its Chrome trace."""

    result: SimResult | AsyncResult
    trace: dict[str, Any] | None = None


def run_info(sc: Scenario) -> RunInfo:
    """The names and totals a scenario's record carries besides its timeline."""
    s = sc.strategy
    tokens = sc.full_model.input_shape[0] if sc.full_model.input_kind == "tokens" else 0
    inter = sc.cluster.inter
    shared = ()
    if inter is not None and inter.fabric.shared and s.devices > sc.cluster.devices_per_node:
        shared = (f"network: {inter.fabric.describe()}; collectives and transfers across nodes are slowed by the "
                  "flows of their concurrent copies on its shared links (--full --expand-collectives: by the "
                  "flows in flight)",)
    return RunInfo(sc.model.name, sc.cluster.name, sc.cluster.device.name, s.to_dict(), s.global_batch, s.pp > 1,
                   sc.training_flops, sc.peak_flops, s.devices, sc.notes + (sc.partition_note,) + shared, tokens)


def simulate_scenario(sc: Scenario, *, symmetry: bool = True, expand: bool = False, trace: bool = False,
                      keep: TraceFilter | None = None, assumed: dict[str, Any] | None = None,
                      stack: dict[str, Any] | None = None) -> Simulation:
    """Simulate `sc`. `symmetry` simulates one data-parallel replica and one tensor-parallel rank
    per stage (run-time variability keeps every replica); `expand` runs collectives as their
    point-to-point schedules and, on a shared network, every transfer as a flow on its links; `trace` records the Chrome trace, `keep` filters it. The record names
    the dtype it ran in, the defaults the caller `assumed` and the software `stack` it ran on."""
    s = sc.strategy
    explicit_dp = (not symmetry or s.variability.active) and s.sync == "allreduce"
    explicit_tp = not symmetry
    x = sc.iteration_inputs(explicit_dp, explicit_tp, expand)
    if expand and getattr(x.pricer, "contention", None) is not None:  # messages as flows on the shared links
        x = replace(x, pricer=x.pricer.with_flows())
    info = run_info(sc)
    stated = _stater(sc.record_dtype, assumed or {}, stack)
    if s.sync == "allreduce" and not s.variability.active and not trace:
        steady = simulate_steady(x, info)
        if steady is not None:
            return Simulation(stated(steady))
    graph = build_iteration(x)
    group_of = {i: ([d.rank + t for t in range(s.tp)] if not explicit_tp else [d.rank])
                for i, d in enumerate(graph.devices)}
    if s.sync == "allreduce":
        apply_variability(graph, s.variability, s.devices, group_of)
    result, tl = simulate_graph(graph, info)
    if s.sync != "allreduce":
        params = sum(layer.params for layer in sc.model.layers)
        ps = PSInputs(sc.model.name, sc.cluster.name, s, result.iteration_time_s, params * DTYPE_BYTES[sc.dtype],
                      sc.optimizer_time(params / s.ps_shards), sc.pricer, sc.layout, sc.notes)
        return Simulation(stated(simulate_ps(ps)))
    if not trace:
        return Simulation(stated(result))
    devices = None if keep is None else kept_devices(graph, sc.layout, keep, explicit_dp, explicit_tp)
    events = chrome_trace(graph, tl, f"{sc.model.name} on {sc.cluster.name}", devices,
                          None if keep is None else keep.window)
    if keep is not None:
        events["otherData"]["filter"] = keep.to_dict()
    return Simulation(stated(result), events)


def _stater(dtype: str, assumed: dict[str, Any], stack: dict[str, Any] | None):
    """The record names the dtype it ran in (never null), the defaults it assumed and its stack."""
    def stated(result: SimResult | AsyncResult) -> SimResult | AsyncResult:
        return replace(result, strategy={**result.strategy, "dtype": dtype}, assumed=assumed, stack=stack)
    return stated
