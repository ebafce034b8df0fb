"""One scenario: a strategy on a model and a cluster, priced and checked, built in one place.

A `ScenarioBuilder` holds what does not depend on the strategy (the model, the cluster, the compute
dtype, the measured kernel tables, the communication pricer factory, layer times measured elsewhere
such as a μ-cuDNN plan's). `ScenarioBuilder.scenario(strategy)` turns a strategy into a `Scenario`:

1. the layer table (`build_layer_table`) of one device's share: the sequence split over the
   context-parallel ranks (`split_sequence`), tensor and sequence parallelism, fused kernels,
   experts spread over the expert-parallel ranks, data/model switches of layer groups
   (`add_transitions`), ring attention (`add_rings`), the image split over the spatial ranks with
   its halo exchanges (`split_spatial`, `add_halos`), FP8 projection GEMMs and their casts
   (`apply_fp8`), tensor-parallel collectives chunked beside their GEMMs (`add_tp_overlap`);
2. the checks (enough devices, tensor-parallel degrees dividing the heads, experts divisible);
3. the stage partition, balanced on the per-micro-batch work without the gradient accumulation
   (one partition for every micro-batch count);
4. the gradient accumulation per micro-batch (`with_grad_accumulation`);
5. the rank layout, the communication pricer, the optimizer-step and element-wise kernel timers,
   the host link for offloading, the model FLOPs of one iteration.

The event simulation (`dlsim.sim.scenario_run`) and the analytic evaluator (`dlsim.plan.evaluate`)
both time what this builds; the evaluator keeps one builder for a whole search, whose caches
(layer tables per what they depend on, partitions per chunk count, pricers per layout) are shared
by every candidate. Adding a mechanism means changing this module (and, where it composes
differently in time, the two clocks), never a second copy of the assembly.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from dlsim.cost.flash import attention_note
from dlsim.cost.layers import layer_cost
from dlsim.cost.memory import grad_accumulation_bytes
from dlsim.cost.pricing import KernelTimes
from dlsim.errors import InfeasibleError
from dlsim.plan.comm import CommPricer, Layout
from dlsim.plan.contextparallel import add_rings, split_sequence
from dlsim.plan.expertparallel import check_expert_parallel, expert_notes
from dlsim.plan.fp8 import COMPUTE_DTYPE, apply_fp8, check_fp8, output_head
from dlsim.plan.iteration import IterationInputs
from dlsim.plan.layergroups import add_transitions, batches_and_degrees, forced_splits, group_modes
from dlsim.plan.layertable import LayerEntry, build_layer_table, with_grad_accumulation
from dlsim.plan.offload import host_link, offloads_activations
from dlsim.plan.partition import uniform_counts, partition, single_tensor_cuts
from dlsim.plan.spatial import LayerSplit, add_halos, spatial_grid, split_spatial
from dlsim.plan.steptime import elementwise_timer, optimizer_timer, step_kernels
from dlsim.plan.tpoverlap import add_tp_overlap, tp_overlap_note
from dlsim.results import Estimate
from dlsim.spec.cluster import Cluster, LinkTier
from dlsim.spec.memo import derived
from dlsim.spec.model import Model
from dlsim.spec.strategy import Strategy
from dlsim.spec.strategy_values import flash_kernel

def flops_per_sample(model: Model, dtype: str) -> float:
    """Training FLOPs of one sample through `model` (forward and backward, `layer_cost`), once per
    model and dtype (`dlsim.spec.memo`)."""
    return derived(model, ("flops per sample", dtype),
                   lambda: sum(layer_cost(layer, 1, dtype).flops for layer in model.layers))


SHARED_TABLES = 128
"""Layer tables kept per model across builders (`ScenarioBuilder._shared`), the latest used ones (a
sweep's points on one model ask for its tables again at each cluster size)."""

PricerFactory = Callable[[Layout, str], CommPricer]
"""`factory(layout, collective algorithm)`: the communication pricer of one rank layout."""

LayerOverrides = Mapping[str, tuple[Estimate, Estimate, float]]
"""Layer name -> (forward, backward, workspace bytes) measured elsewhere (a μ-cuDNN plan's)."""


@dataclass
class LayerTable:
    """A layer table and what is cached about it. `key` names the table without the gradient
    accumulation (`base`): what does not depend on timing (the stage partition, balanced on the
    costs without accumulation; parameters, activations, buckets) is cached under it and shared by
    every micro-batch count."""

    entries: tuple[LayerEntry, ...]
    costs: list[float]
    partitions: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    sigs: list[int] | None = None
    prefix: dict[str, list[float]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    """What an evaluator derives from the entries' byte counts (`dlsim.plan.recompute.ChunkActivations`),
    kept with the table so that every builder sharing it (`_shared`) derives it once; shared with the
    accumulated tables of this base, as `prefix` is (their byte counts are the base's)."""
    chunk_sigs: dict[tuple[int, int], tuple] = field(default_factory=dict)
    key: int = 0
    base: "LayerTable | None" = None  # None: this table has no accumulation (it is its own base)

    def __post_init__(self) -> None:
        self.key = self.key or id(self)

    def signature(self, a: int, b: int, instance: dict[str, str | None]) -> tuple:
        """What a chunk's timing depends on: per entry everything but its name and index (chunks of
        identical layers share their timing, the middle stages of a deep pipeline one computation)."""
        if self.sigs is None:
            base = self.base
            if base is None or base is self:
                self.sigs = entry_signatures(self.entries, instance)
            else:  # `with_grad_accumulation`: the base's entries, some with another backward
                base.signature(0, 0, instance)
                self.sigs = [sig if e is old else hash((sig, e.backward, e.backward_weight))
                             for e, old, sig in zip(self.entries, base.entries, base.sigs)]  # type: ignore[arg-type]
        got = self.chunk_sigs.get((a, b))
        if got is None:
            got = self.chunk_sigs[(a, b)] = tuple(self.sigs[a:b])
        return got


def _collectives_key(cs: tuple) -> tuple:
    return tuple([(c.op, c.nbytes, c.group, c.overlap) for c in cs]) if cs else ()


def entry_signatures(entries: tuple[LayerEntry, ...], instance: dict[str, str | None]) -> list[int]:
    """Per entry, a hash of what its timing depends on (`LayerTable.signature`): all its fields but
    its name and index, its tensor-parallel role without the layer names its collectives are labelled
    with, and whether full recomputation re-runs it. Entries priced alike share their field objects:
    those are hashed once."""
    hashed: dict[tuple, int] = {}  # ids of shared field objects (alive with `entries`) -> their hash
    roles: dict[tuple, int] = {}
    role_ids: dict[int, int] = {}  # ids of role records (alive with `entries`) -> their role's hash
    out = []
    for e in entries:
        ids = (id(e.forward), id(e.backward), id(e.backward_weight), id(e.core), id(e.experts), id(e.ring))
        fields = hashed.get(ids)
        if fields is None:
            fields = hashed[ids] = hash((e.forward, e.backward, e.backward_weight, e.core, e.experts, e.ring))
        tp = e.tp
        r = role_ids.get(id(tp))  # entries share role records (`dlsim.plan.tensorparallel.role_template`)
        if r is None:
            role = (tp.role, tp.compute_sharded, tp.params_sharded, tp.out_sharded, tp.seq_out,
                    _collectives_key(tp.before), _collectives_key(tp.after_fwd), _collectives_key(tp.after_bwd),
                    _collectives_key(tp.before_bwd))
            r = roles.get(role)
            if r is None:
                r = roles[role] = hash(role)
            role_ids[id(tp)] = r
        out.append(hash((e.type, fields, e.params, e.saved_bytes, e.out_bytes, e.core_bytes, r, e.windows,
                         instance[e.name] is not None) + ((e.tp_overlap,) if e.tp_overlap else ())
                        + ((e.halo,) if e.halo is not None else ())))
    return out


@dataclass(frozen=True)
class Scenario:
    """A strategy priced and checked: what the event simulation and the analytic evaluator time.

    `model` is one device's share of every sequence (context parallelism), `full_model` the model
    as given; `table` the layer table with the gradient accumulation (`table.base` without it);
    `dtype` the compute dtype (bf16 under FP8 training, whose GEMMs the table prices in FP8) and
    `record_dtype` the one the record names."""

    model: Model
    full_model: Model
    cluster: Cluster
    strategy: Strategy
    dtype: str
    record_dtype: str
    table: LayerTable
    ranges: tuple[tuple[int, int], ...]
    layout: Layout
    pricer: CommPricer
    optimizer_time: Callable[[float], Estimate]
    elementwise_time: Callable[[float, float], Estimate]
    host: LinkTier | None
    training_flops: float
    peak_flops: float
    notes: tuple[str, ...]

    @property
    def entries(self) -> tuple[LayerEntry, ...]:
        return self.table.entries

    @property
    def capacity_bytes(self) -> float:
        """Usable device memory: capacity less what the runtime reserves."""
        device = self.cluster.device
        return device.memory_bytes - device.memory_reserved

    @property
    def partition_note(self) -> str:
        s = self.strategy
        how = "as given" if s.stage_partition is not None else \
            "the same blocks per chunk" if s.pipeline_split == "uniform" else "balanced by cost"
        return f"stage partition (layers per chunk, {how}): {[b - a for a, b in self.ranges]}"

    def iteration_inputs(self, explicit_dp: bool = False, explicit_tp: bool = False,
                         expand: bool = False) -> IterationInputs:
        """What the task graph of one iteration is built from (`dlsim.plan.iteration`): with
        `explicit_dp` / `explicit_tp` every data-parallel replica / tensor-parallel rank simulated
        (else one, its collectives priced at the full rank count); `expand` runs collectives as
        their point-to-point schedules."""
        device = self.cluster.device
        return IterationInputs(self.model, self.entries, self.ranges, self.strategy, self.layout, self.pricer,
                               self.dtype, device.name, self.capacity_bytes, self.optimizer_time,
                               self.elementwise_time, explicit_dp, explicit_tp, expand, device.overlap_slowdown,
                               self.host)


def spatial_key(s: Strategy) -> tuple:
    """(grid, halo_overlap) of `s`'s spatial split, empty without one (the layer table's key part)."""
    return (spatial_grid(s.spatial, s.spatial_w), s.halo_overlap) if s.spatial > 1 else ()


class ScenarioBuilder:
    """Builds the scenarios of one model on one cluster in one dtype, caching what strategies share.

    `tables` are the profile's measured kernel times (None: the roofline); `pricer(layout,
    algorithm)` the communication pricer of a rank layout; `layer_overrides` layer times measured
    elsewhere; `notes` what the inputs' loading has to say (they open every scenario's notes)."""

    def __init__(self, model: Model, cluster: Cluster, dtype: str, pricer: PricerFactory,
                 tables: KernelTimes | None = None, *, layer_overrides: LayerOverrides | None = None,
                 notes: tuple[str, ...] = ()):
        self.record_dtype = dtype
        self.fp8 = dtype == "fp8"  # FP8 projection GEMMs, BF16 elsewhere (dlsim.plan.fp8)
        notes = tuple(notes)
        if self.fp8:
            notes += (check_fp8(cluster.device, cluster.name),)
            dtype = COMPUTE_DTYPE
        self.model, self.cluster, self.dtype = model, cluster, dtype
        self.device = cluster.device
        self.tables = tables
        self.notes = notes
        self.layer_overrides = layer_overrides
        self._pricer = pricer
        self._pricers: dict[tuple, CommPricer] = {}
        self._base_tables: dict[tuple, LayerTable] = {}
        self._layer_tables: dict[tuple, LayerTable] = {}
        self._local: dict[tuple, tuple[Model, dict[str, LayerSplit]]] = {}
        self._cuts: list[int] | None = None
        self._timers: dict[tuple, Callable[[float], Estimate]] = {}
        self.kept: dict[object, object] = {}
        """What higher layers derive from this builder and keep with it (`Evaluator.of`'s evaluator)."""

    # -- the layer table -----------------------------------------------------------------------
    def local_model(self, cp: int, grid: tuple[int, int] = (1, 1)) -> Model:
        """One context-parallel rank's share of every sequence, or one spatial rank's block of every
        image on a `grid` (the model itself for cp = 1 on a 1 x 1 grid)."""
        return self._local_split(cp, grid)[0]

    def _local_split(self, cp: int, grid: tuple[int, int]) -> tuple[Model, dict[str, LayerSplit]]:
        got = self._local.get((cp, grid))
        if got is None:
            got = self._local[(cp, grid)] = split_spatial(split_sequence(self.model, cp), grid)
        return got

    def base_table(self, tp: int, sp: bool, mbs: int, fused: tuple[str, ...] = (), ep: int = 1,
                   ep_overlap: bool = False, cp: int = 1, microbatches: int = 1, dp: int = 1,
                   layer_groups: tuple = (), tp_comm_overlap: bool | str = False, spatial: tuple = (),
                   loss: str = "single_pass") -> LayerTable:
        """The layer table without gradient accumulation (tensor, context and spatial parallelism,
        fusions, experts, layer groups' switches; FP8 casts, which depend on the micro-batch count; with
        `tp_comm_overlap` the sequence-parallel collectives chunked beside their GEMMs). `spatial` =
        (grid, halo_overlap) of a spatial split (empty: none); `loss` the stack's cross-entropy kernels
        (`dlsim.cost.loss`)."""
        key = (tp, sp, mbs, fused, ep, ep_overlap, cp, microbatches if self.fp8 else 0,
               (dp, layer_groups) if layer_groups else ()) + (("tp overlap", tp_comm_overlap) if tp_comm_overlap else ()) \
            + ((spatial,) if spatial else ()) + ((("loss", loss),) if loss != "single_pass" else ())
        t = self._base_tables.get(key)
        if t is None:
            t = self._base_tables[key] = self._shared(("base",) + key, lambda: self._build_base(
                tp, sp, mbs, fused, ep, ep_overlap, cp, microbatches, dp, layer_groups, tp_comm_overlap, spatial, loss))
        return t

    def _shared(self, key: tuple, make: Callable[[], LayerTable]) -> LayerTable:
        """The layer table `key` of this model built by `make`, shared by every builder of the process
        with the same device, measured tables and dtype and no layer overrides: kept per model object
        (`dlsim.spec.memo`, dropped with it), the latest used `SHARED_TABLES`. A script predicting strategy
        after strategy on one loaded model prices its layers once per table.

        Why a kept table is never stale: a table is a pure function of the model, the device, the
        tables, the dtype and `key` (every argument of its build; `key` names a gradient-accumulated
        table's base by id, and that table holds its base). The model, the device and a `Strategy` are
        frozen; the measured tables are read-only once loaded; layer overrides (a caller's mapping,
        which could change) are never shared. The store holds the device and the tables it was built
        with, so their ids cannot be reused by other objects while it is kept, and a hit is checked by
        identity as well (tests/test_shared_tables.py)."""
        if self.layer_overrides is not None:
            return make()
        store = derived(self.model, "layer tables", dict)
        full = (id(self.device), id(self.tables), self.record_dtype) + key
        got = store.get(full)
        if got is not None and got[0] is self.device and got[1] is self.tables:
            store[full] = store.pop(full)  # the latest used kept longest
            return got[2]
        t = make()
        if len(store) >= SHARED_TABLES:
            store.pop(next(iter(store)))
        store[full] = (self.device, self.tables, t)
        return t

    def _build_base(self, tp: int, sp: bool, mbs: int, fused: tuple[str, ...], ep: int, ep_overlap: bool, cp: int,
                    microbatches: int, dp: int, layer_groups: tuple, tp_comm_overlap: bool | str,
                    spatial: tuple, loss: str = "single_pass") -> LayerTable:
        """`base_table` built (`build_layer_table` and the transformations of the module docstring)."""
        local, splits = self._local_split(cp, spatial[0] if spatial else (1, 1))
        fusions = frozenset(fused)
        if tp_comm_overlap:  # the entries without the overlap, shared with that table, chunked
            plain = self.base_table(tp, sp, mbs, fused, ep, ep_overlap, cp, microbatches, dp, layer_groups, False,
                                    spatial, loss)
            entries = add_tp_overlap(plain.entries, local, self.device, self.dtype, self.tables, fusions, self.fp8,
                                     output_head(local), tp_comm_overlap)
            return LayerTable(entries, [e.forward.seconds + e.backward.seconds for e in entries])
        if layer_groups:
            modes = group_modes(self.model, layer_groups)
            batch, degree = batches_and_degrees(modes, dp, mbs, tp)
        else:
            batch, degree = mbs, tp
        entries = build_layer_table(local, self.device, self.dtype, batch=batch, tp=degree, tables=self.tables,
                                    ep=ep, ep_overlap=ep_overlap, overrides=self.layer_overrides,
                                    sequence_parallel=sp, fused=fusions, loss=loss,
                                    forced=forced_splits(modes) if layer_groups else None)
        if layer_groups:
            entries = add_transitions(local, entries, modes, dp, mbs, self.dtype, tp)
        entries = add_rings(entries, local, self.device, self.dtype, cp, self.tables, fusions)
        entries = add_halos(entries, splits, self.dtype, spatial[1] if spatial else True)
        if self.fp8:
            entries = apply_fp8(entries, local, self.device, microbatches, self.tables, fusions)
        return LayerTable(entries, [e.forward.seconds + e.backward.seconds for e in entries])

    def table(self, tp: int, sp: bool, mbs: int, fused: tuple[str, ...] = (), ep: int = 1,
              ep_overlap: bool = False, accumulation: float = 0.0, cp: int = 1, microbatches: int = 1,
              dp: int = 1, layer_groups: tuple = (), tp_comm_overlap: bool | str = False,
              spatial: tuple = (), loss: str = "single_pass") -> LayerTable:
        """`base_table` with `accumulation` bytes per parameter of gradient accumulation per
        micro-batch (`with_grad_accumulation`); it shares the base's partitions and key."""
        key = (tp, sp, mbs, fused, ep, ep_overlap, accumulation, cp, microbatches if self.fp8 else 0,
               (dp, layer_groups) if layer_groups else ()) + (("tp overlap", tp_comm_overlap) if tp_comm_overlap else ()) \
            + ((spatial,) if spatial else ()) + ((("loss", loss),) if loss != "single_pass" else ())
        t = self._layer_tables.get(key)
        if t is None:
            base = self.base_table(tp, sp, mbs, fused, ep, ep_overlap, cp, microbatches, dp, layer_groups,
                                   tp_comm_overlap, spatial, loss)
            if accumulation <= 0:
                t = base
            else:
                t = self._shared(("accumulated", id(base), accumulation), lambda: LayerTable(
                    with_grad_accumulation(base.entries, self.device, accumulation), base.costs, base.partitions,
                    prefix=base.prefix, facts=base.facts, key=base.key, base=base))
            self._layer_tables[key] = t
        return t

    def strategy_base(self, s: Strategy) -> LayerTable:
        """The layer table of `s` without its gradient accumulation (what memory and the partition use)."""
        return self.base_table(s.tp, s.sequence_parallel, s.microbatch_size, s.fused_kernels, s.ep, s.ep_overlap,
                               s.cp, s.num_microbatches, s.dp, s.layer_groups, s.tp_comm_overlap, spatial_key(s),
                               s.loss_kernel)

    def strategy_table(self, s: Strategy) -> LayerTable:
        """The layer table `s` runs on (`strategy_base` with the gradient accumulation)."""
        accumulation = grad_accumulation_bytes(s.grad_accumulation, self.dtype, s.num_microbatches)
        return self.table(s.tp, s.sequence_parallel, s.microbatch_size, s.fused_kernels, s.ep, s.ep_overlap,
                          accumulation, s.cp, s.num_microbatches, s.dp, s.layer_groups, s.tp_comm_overlap,
                          spatial_key(s), s.loss_kernel)

    # -- stages, layout, pricer ----------------------------------------------------------------
    def ranges(self, s: Strategy, t: LayerTable) -> list[tuple[int, int]]:
        """The (first, end) layer ranges of the pipeline's chunks: `s.stage_partition` as given, the
        uniform split of the blocks (`s.pipeline_split`), or balanced on the table's per-micro-batch
        costs (cached per chunk count)."""
        if s.stage_partition is not None:
            return partition(self.model, t.costs, s.chunks, s.stage_partition)
        if s.pipeline_split == "uniform":
            return partition(self.model, t.costs, s.chunks, uniform_counts(self.model, s.chunks))
        r = t.partitions.get(s.chunks)
        if r is None:
            if self._cuts is None:
                self._cuts = single_tensor_cuts(self.model)
            r = t.partitions[s.chunks] = partition(self.model, t.costs, s.chunks, cuts=self._cuts)
        return r

    def runs_as(self, s: Strategy) -> Strategy:
        """The strategy whose run `s` is, task for task and byte for byte: selective recomputation of a
        table with no attention core to recompute (flash attention keeps no score matrix; a model
        without attention has none) and no activation offload recomputes nothing and keeps what no
        recomputation keeps (the iteration reads `recompute` nowhere else: `dlsim.plan.passes`), so it runs as
        recompute none; any other `s` as itself. A caller times one run per `runs_as`
        (`dlsim.api.optimize`); tests/test_runs_as.py holds the two records equal but for the field."""
        if s.recompute != "selective" or offloads_activations(s.offload):
            return s
        if any(e.core.seconds > 0 for e in self.strategy_base(s).entries):
            return s
        return replace(s, recompute="none")

    def layout(self, s: Strategy) -> Layout:
        return Layout(s.dp, s.tp, s.pp, self.cluster.devices_per_node, s.domain)

    def pricer(self, s: Strategy) -> CommPricer:
        """The communication pricer of `s`'s layout and collective algorithm (cached)."""
        key = (s.dp, s.tp, s.pp, s.collective, s.domain)
        p = self._pricers.get(key)
        if p is None:
            p = self._pricers[key] = self._pricer(self.layout(s), s.collective)
        return p

    def optimizer_timer(self, s: Strategy, t: LayerTable) -> Callable[[float], Estimate]:
        """`time(params)` of `s`'s optimizer step on one device (`dlsim.plan.steptime`), its kernel
        count from table `t`'s parameter tensors per stage (cached)."""
        key = (t.key, s.pp, s.optimizer, s.optimizer_impl)
        got = self._timers.get(key)
        if got is None:
            kernels = step_kernels(t.entries, s.pp, s.optimizer, s.optimizer_impl)
            got = self._timers[key] = optimizer_timer(self.device, self.dtype, s.optimizer, kernels, s.optimizer_impl)
        return got

    # -- the scenario --------------------------------------------------------------------------
    def check_fits(self, s: Strategy, entries: tuple[LayerEntry, ...]) -> None:
        """Enough devices for `s`, and tensor-parallel degrees that divide the attention heads."""
        cluster = self.cluster
        if s.devices > cluster.num_devices:
            cp = f" x cp {s.cp}" if s.cp > 1 else f" x spatial {s.spatial}" if s.spatial > 1 else ""
            raise InfeasibleError(f"strategy needs dp x tp x pp = {s.dp} x {s.tp} x {s.pp}{cp} = {s.devices} devices, "
                                  f"{cluster.name} has {cluster.num_devices} ({s.devices - cluster.num_devices} short)")
        for e in entries:
            layer = self.model.layers[e.index]
            if e.tp_degree > 1 and e.tp.compute_sharded and layer.type in ("attention", "mla"):
                for key in ("heads", "kv_heads"):
                    heads = layer.attrs.get(key)
                    if heads and heads % e.tp_degree:
                        raise InfeasibleError(f"tensor parallel degree {e.tp_degree} does not divide the {heads} "
                                              f"{key.replace('_', ' ')} of layer {layer.name!r} (remainder "
                                              f"{heads % e.tp_degree})")

    def scenario(self, s: Strategy) -> Scenario:
        """`s` priced and checked (see the module docstring)."""
        check_expert_parallel(self.model, s.ep)
        base = self.strategy_base(s)
        notes = self.notes + tuple(expert_notes(base.entries))
        if any(layer.type in ("attention", "mla") for layer in self.model.layers):
            notes += (attention_note(self.device, self.cluster.name, flash_kernel(s.fused_kernels)),)
        if s.tp_comm_overlap:
            notes += tuple(n for n in (tp_overlap_note(base.entries, self.device, s.tp_comm_overlap),) if n)
        self.check_fits(s, base.entries)
        ranges = tuple(self.ranges(s, base))
        table = self.strategy_table(s)
        device, dtype = self.device, self.dtype
        training_flops = flops_per_sample(self.model, dtype) * s.global_batch
        return Scenario(
            self.local_model(s.cp, spatial_key(s)[0] if s.spatial > 1 else (1, 1)), self.model, self.cluster, s, dtype, self.record_dtype, table, ranges,
            self.layout(s), self.pricer(s), self.optimizer_timer(s, table), elementwise_timer(device, dtype), host_link(self.cluster, s.offload), training_flops,
            device.peak_flops.get(dtype, max(device.peak_flops.values())), notes)
