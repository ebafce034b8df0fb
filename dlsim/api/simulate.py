"""`simulate()`: one training iteration (or, for parameter-server training, many) event by event."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Unpack

from dlsim.api.fields import StrategyFields
from dlsim.api.gcpause import paused_gc
from dlsim.api.limits import check_nodes_limit, check_strategy_limits
from dlsim.api.models import as_cluster, as_model, check_dtype
from dlsim.api.resolve import as_strategy, assumed_fields, resolve_strategy  # noqa: F401 (as_strategy: public here)
from dlsim.cost.pricing import KernelTimes
from dlsim.errors import SpecError
from dlsim.io.stack_yaml import load_stack
from dlsim.plan.comm import CommPricer, Layout
from dlsim.plan.commcost import ClusterPricer, MemoPricer
from dlsim.plan.expertparallel import check_expert_parallel
from dlsim.plan.fp8 import COMPUTE_DTYPE, check_fp8
from dlsim.plan.microbatch.overrides import plan_note, plan_overrides
from dlsim.plan.scenario import LayerOverrides, PricerFactory, ScenarioBuilder
from dlsim.results_sim import AsyncResult, SimResult
from dlsim.sim.scenario_run import Simulation, simulate_scenario
from dlsim.sim.tracefilter import make_filter
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.spec.stack import Stack
from dlsim.spec.strategy import Strategy


def _microbatch_overrides(model: Model, cluster: Cluster, s: Strategy, dtype: str, mode: str,
                          workspace_limit: str | float) -> tuple[LayerOverrides, str]:
    """Per-convolution (forward, backward, workspace) from the μ-cuDNN planner (`dlsim.api.microbatch`
    loads its tables), with the note that says so."""
    from dlsim.api.microbatch import plan_microbatches
    plan = plan_microbatches(model, cluster, s.microbatch_size, workspace_limit, mode, dtype=dtype)
    return plan_overrides(plan), plan_note(plan, mode)


def comm_table(cluster: Cluster, measured: bool = True):
    """The profile's measured collective table, or None (without one, or with `measured` off)."""
    if measured and "comm_collectives" in cluster.tables:
        from dlsim.io.kernel_tables import load_comm_table
        return load_comm_table(cluster)
    return None


def kernel_tables(cluster: Cluster, measured: bool = True) -> tuple[KernelTimes | None, list[str]]:
    """The profile's measured kernel times and the notes on them ((None, []) without)."""
    if measured and cluster.tables:
        from dlsim.io.kernel_tables import load_kernel_times
        tables, notes = load_kernel_times(cluster)
        return tables, list(notes)
    return None, []


def default_pricers(cluster: Cluster, measured: bool = True) -> PricerFactory:
    """`factory(layout, algorithm)`: the cluster's communication pricer, from its measured
    collective table where it has one (read once)."""
    table = comm_table(cluster, measured)
    return lambda layout, algorithm: ClusterPricer(cluster, layout, algorithm, table)


def _default_pricer(cluster: Cluster, layout: Layout, algorithm: str, measured: bool = True) -> CommPricer:
    return ClusterPricer(cluster, layout, algorithm, comm_table(cluster, measured))


@dataclass(frozen=True)
class Prepared:
    """A run's inputs loaded and checked: its strategy, the builder of its scenario, what it assumed
    and the record of its stack (`prepare`)."""

    strategy: Strategy
    builder: ScenarioBuilder
    assumed: dict[str, Any]
    stack: dict[str, Any] | None


def prepare(model: Model | str | Path, cluster: Cluster | str | Path, strategy: Strategy | str | Path | None = None,
            *, measured: bool = True, full: bool = False, microbatch_plan: str | None = None,
            workspace_limit: str | float = "64MiB", overrides: Mapping[str, Any] | None = None,
            pricer: CommPricer | None = None, nodes: int | None = None, given: Iterable[str] = (),
            builders: Builders | None = None, **fields: Any) -> Prepared:
    """Load and check what a run needs (the model, the cluster sized to the strategy, the strategy
    completed by its stack, the measured tables, a μ-cuDNN plan's layer times) and the builder of its
    scenario (`dlsim.plan.scenario`): what `run_simulation` and the analytic `estimate_strategy`
    share. `full` checks the strategy's limits for simulating every rank. `builders` keeps the
    builders across calls (see `Builders`)."""
    model, cluster = as_model(model, overrides), as_cluster(cluster)
    if nodes is not None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise SpecError(f"must be a positive integer, got {nodes!r}", field="nodes")
        cluster = replace(cluster, nodes=check_nodes_limit(nodes, cluster.devices_per_node))
    r = resolve_strategy(strategy, fields, given, model, cluster, load_stack if builders is None else builders.stack)
    s, names = r.strategy, r.names
    sized = ()
    if nodes is None and s.devices > cluster.num_devices:  # a profile's node count is nominal: fit the strategy
        need = -(-s.devices // cluster.devices_per_node)
        sized = (f"cluster sized to the strategy: {need} nodes of {cluster.devices_per_node} for its {s.devices} "
                 f"devices (the profile lists {cluster.nodes}; --nodes to choose)",)
        cluster = replace(cluster, nodes=check_nodes_limit(need, cluster.devices_per_node))
    s = check_strategy_limits(s, full=full)
    dtype = check_dtype(s.dtype, model)
    assumed = assumed_fields(s, names, dtype, r.stack_keys)
    if dtype == "fp8":  # refused before the tables are read
        check_fp8(cluster.device, cluster.name)
    if builders is not None and pricer is None and not microbatch_plan:
        builder = builders.get(model, cluster, dtype, measured, sized)
        return Prepared(s, builder, assumed, r.stack_record)
    tables, notes = kernel_tables(cluster, measured)
    layer_overrides = None
    if microbatch_plan:
        if microbatch_plan not in ("wr", "wd"):
            raise SpecError(f"unknown micro-batch plan {microbatch_plan!r} (use wr, wd)", field="microbatch_plan")
        if s.tp > 1:
            raise SpecError("a micro-batch plan prices unsplit convolutions; it needs tp = 1", field="microbatch_plan")
        check_expert_parallel(model, s.ep)
        layer_overrides, note = _microbatch_overrides(model, cluster, s, COMPUTE_DTYPE if dtype == "fp8" else dtype,
                                                      microbatch_plan, workspace_limit)
        notes.append(note)
    pricers = (lambda layout, algorithm: pricer) if pricer is not None else default_pricers(cluster, measured)
    builder = ScenarioBuilder(model, cluster, dtype, pricers, tables, layer_overrides=layer_overrides,
                              notes=sized + tuple(notes))
    return Prepared(s, builder, assumed, r.stack_record)


class Builders:
    """Scenario builders kept across `prepare` calls by a caller that owns their lifetime (a sweep's
    worker: `dlsim.api.sweep`), one per model object, cluster object, dtype and measured-or-not, the
    latest `limit` of them. A builder caches what strategies share (layer tables, partitions,
    pricers; its evaluator, `Evaluator.of`), each under everything it depends on besides these four,
    so a point priced on a kept builder gets the numbers a fresh one gives (tests/test_sweep.py holds a
    sweep's records to fresh builders'). Each builder holds its model and cluster, so neither object's
    id can be reused while its builder is kept, and a hit is checked by identity too. The measured
    tables are read once per profile (`_profile`: the clusters of one profile resized to other node
    counts share them, and through them their layer tables, `ScenarioBuilder._shared`), and the software
    stacks once per name (`stack`): files changed on disk meanwhile are not seen (a new `Builders` is)."""

    def __init__(self, limit: int = 32):
        self.limit = limit
        self._kept: dict[tuple, ScenarioBuilder] = {}
        self._profiles: dict[tuple, tuple] = {}
        self._stacks: dict[str, Stack] = {}

    def stack(self, name: str) -> Stack:
        """The software stack `name` (`load_stack`), read once."""
        got = self._stacks.get(name)
        if got is None:
            got = self._stacks[name] = load_stack(name)
        return got

    def _profile(self, cluster: Cluster, measured: bool) -> tuple:
        """(kernel tables, their notes, collective table) of `cluster`'s profile, read once: what
        `kernel_tables` and `comm_table` read depends on the profile's table paths, source and name
        alone, which a cluster resized by `dataclasses.replace` keeps (the same `tables` mapping,
        checked by identity: the key holds its id)."""
        key = (id(cluster.tables), cluster.source, cluster.name, measured)
        got = self._profiles.get(key)
        if got is None or got[0] is not cluster.tables:
            tables, notes = kernel_tables(cluster, measured)
            got = self._profiles[key] = (cluster.tables, tables, tuple(notes), comm_table(cluster, measured), {})
        return got[1:]

    def _network_prices(self, cluster: Cluster, networks: dict) -> dict:
        """The collective prices shared by the pricers of `cluster`'s network (`MemoPricer`): its links,
        reduction rate and devices per node (held by the entry, so their ids are not reused)."""
        key = (id(cluster.intra), id(cluster.inter), cluster.reduce_bandwidth, cluster.devices_per_node)
        got = networks.get(key)
        if got is None or got[0] is not cluster.intra or got[1] is not cluster.inter:
            got = networks[key] = (cluster.intra, cluster.inter, {})
        return got[2]

    def get(self, model: Model, cluster: Cluster, dtype: str, measured: bool, notes: tuple[str, ...] = ()) \
            -> ScenarioBuilder:
        """The kept builder of (`model`, `cluster`, `dtype`, `measured`), made on first use with `notes`
        (what the cluster's sizing said: a function of the cluster object) and the tables' notes."""
        key = (id(model), id(cluster), dtype, measured)
        got = self._kept.get(key)
        if got is not None and got.model is model and got.cluster is cluster:
            return got
        tables, table_notes, comm, networks = self._profile(cluster, measured)
        prices = self._network_prices(cluster, networks)
        got = ScenarioBuilder(model, cluster, dtype, lambda layout, algorithm: MemoPricer(
            ClusterPricer(cluster, layout, algorithm, comm), prices), tables, notes=tuple(notes) + table_notes)
        if len(self._kept) >= self.limit:
            self._kept.pop(next(iter(self._kept)))
        self._kept[key] = got
        return got


@paused_gc
def simulate_prepared(p: Prepared, *, symmetry: bool = True, expand_collectives: bool = False, trace: bool = False,
                      keep: Any = None) -> Simulation:
    """The event simulation of a prepared run (`prepare`; `run_simulation` checks the options)."""
    scenario = p.builder.scenario(p.strategy)
    return simulate_scenario(scenario, symmetry=symmetry, expand=expand_collectives, trace=trace, keep=keep,
                             assumed=p.assumed, stack=p.stack)


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
    or fewer of them); without it a strategy needing more devices than the profile lists runs on a
    cluster of enough nodes (a note says so). `given` names nested strategy fields set by the caller
    (see `as_strategy`). `trace_ranks` (``"0-7,64"`` or a list of ranks) and `trace_window`
    (``"1s:1.5s"`` or (start, end) in seconds) keep only part of the trace (`dlsim.sim.tracefilter`).
    Options the run would ignore are refused: `trace` with parameter-server training,
    `expand_collectives` under the symmetry reduction, `workspace_limit` without a plan.

    This function loads and checks (`prepare`); the scenario is built by `dlsim.plan.scenario` and
    timed by `dlsim.sim.scenario_run`.
    """
    keep = make_filter(trace_ranks, trace_window)
    if keep is not None and not trace:
        raise SpecError("trace ranks and window filter a trace: ask for one (--trace FILE)",
                        field="trace_ranks" if trace_ranks is not None else "trace_window")
    if expand_collectives and symmetry:
        raise SpecError("collectives run as point-to-point schedules only where all their ranks are simulated: "
                        "needs --full (symmetry=False)", field="expand_collectives")
    p = prepare(model, cluster, strategy, measured=measured, full=not symmetry, microbatch_plan=microbatch_plan,
                workspace_limit=workspace_limit, overrides=overrides, pricer=pricer, nodes=nodes, given=given, **fields)
    s = p.strategy
    if trace and s.sync != "allreduce":
        raise SpecError(f"a trace records one synchronous iteration; sync {s.sync} runs many iterations "
                        "without one (drop --trace or use sync allreduce)", field="trace")
    if expand_collectives and s.domain > 1:
        raise SpecError("collectives run as point-to-point schedules need every rank simulated; the ranks of a "
                        "context-parallel ring or a spatial group are simulated as one (cp or spatial > 1)", field="expand_collectives")
    return simulate_prepared(p, symmetry=symmetry, expand_collectives=expand_collectives, trace=trace, keep=keep)


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

