"""The strategy search's analytic evaluator: iteration time and memory per device of a strategy
without running the event simulation, from the pieces the simulator builds its task graph from.

Nothing here re-states a cost formula: layers are priced by `build_layer_table`, stages cut by
`partition`, passes are the step lists of `dlsim.plan.templates` (tensor-parallel collectives
priced by the same `CommPricer`, asynchronous ones through `dlsim.cost.overlap.overlap_cost`),
activation memory comes from `dlsim.plan.recompute`, model states from `dlsim.plan.zero`, buckets
from `dlsim.plan.dataparallel`, their collectives from `dlsim.plan.compression.plan_sync`, the
schedule's in-flight micro-batches from `dlsim.plan.pipeline.peak_inflight`, the optimizer step
from `dlsim.plan.steptime`. What the evaluator adds is how these compose in time:

* Per micro-batch, stage r runs forward F_r and backward B_r (recomputation included), the sum
  of its chunks' step lists.
* Pipeline (Narayanan et al. SC'21 §2.2, reference/algorithms.md §4.1, generalised to unequal
  stages and point-to-point transfers c_k): 1F1B ends its last backward on stage 0 at
  Σ_r (F_r + B_r) + 2·Σ_k c_k + (m − 1)·max_r (F_r + B_r); GPipe at Σ F + (m − 1)·max F +
  Σ B + (m − 1)·max B + 2·Σ c; interleaved (v chunks) at m·max + (Σ − max)/v + 2·Σ c / v
  (each uniform case is `closed_form_iteration`). Stage r's last backward ends earlier by the
  backward path from r to stage 0.
* Data-parallel gradient buckets are reduced on the communication stream as the last backward
  pass makes them ready (ZeRO-2/3: every backward pass); the pass is walked step by step with the
  bucket queue beside it, compute slowed by the device's overlap slowdown σ while a collective is
  in flight, a tensor-parallel collective on the same link tier waiting for the bucket that holds
  the ports; what the queue has left when the pass ends is exposed. ZeRO-2/3 (reductions every
  micro-batch) walk every pass of every stage this way in the schedule's op order, the stream
  carrying over from pass to pass (`_Timing._programs`): a pass's reductions delay the next pass's
  gathers and slow its kernels, the last ones end the iteration. ZeRO-3's parameter gathers are
  queued as the simulator issues them (`walk_steps`: a unit's once the previous unit's first step
  has ended, the first unit's once the previous pass's first step has).
* Then the tied-embedding all-reduce between the first and last stage, the optimizer step and
  ZeRO-1/2's all-gather of the updated parameters. The iteration ends when the slowest stage
  does.

Where the evaluator matches the simulation: tests/test_optimize.py holds it within 3% of the
simulation on every candidate of small GPT spaces (dp × tp × pp with tensor parallelism inside a
node, 1F1B / interleaved, recomputation none / selective / full, sequence parallelism, ZeRO 0-3;
2.3% at most there). Flagged `Evaluation.approximate` (only the simulation should decide): ZeRO-2/3
pipelines too long to walk pass by pass (p·m·v > WALK_OPS: the per-chunk leftover of the reduction
queue is hidden under the next forward pass instead), other pipelines too long to walk
(p·m·v > WALK_PLAIN_OPS: the closed forms), interleaved with m = pp, pipeline transfers
on the tensor-parallel link tier (their port contention is not modelled; within 2.3% on the test
spaces). Not modelled: gradient compression's kernels (`supports` says no), layer groups, run-time
variability, parameter-server training; `supports` refuses them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Sequence

from dlsim.cost.memory import grad_accumulation_bytes
from dlsim.cost.overlap import overlap_cost
from dlsim.plan.comm import CommPricer, Layout
from dlsim.plan.compression import plan_sync
from dlsim.plan.contextparallel import add_rings, split_sequence
from dlsim.plan.dataparallel import make_buckets
from dlsim.plan.expertparallel import (EDP, EP, edp_group, ep_group, expert_buckets, expert_params_of,
                                      expert_states, updated_params)
from dlsim.plan.fp8 import COMPUTE_DTYPE, apply_fp8, check_fp8
from dlsim.plan.layertable import (LayerEntry, boundary_bytes, build_layer_table, grad_accumulation_times,
                                  with_grad_accumulation)
from dlsim.plan.offload import OFFLOAD_SLICES, offloads_optimizer
from dlsim.plan.partition import partition, single_tensor_cuts
from dlsim.plan.pipeline import BACKWARD, FORWARD, peak_inflight, stage_ops
from dlsim.plan.recompute import full_recompute_memory, recompute_layers, selective_recompute_memory
from dlsim.plan.steptime import optimizer_timer, step_kernels
from dlsim.plan.templates import Step, backward_steps, forward_steps, selective_recompute_steps, units_of
from dlsim.plan.zero import gathers_updated_params, gradient_collective, model_state_bytes, optimizer_share, \
    reduces_every_microbatch
from dlsim.cost.pricing import KernelTimes
from dlsim.results import Estimate
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.spec.strategy import Strategy
from dlsim.units import DTYPE_BYTES


@dataclass(frozen=True)
class StageMemory:
    """Peak bytes of one pipeline stage's devices, by kind."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    transient: float
    workspace: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.transient + self.workspace

    def to_dict(self) -> dict[str, float]:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "gathered_params": self.transient, "workspace": self.workspace}


@dataclass(frozen=True)
class Evaluation:
    """The analytic estimate of one strategy: iteration time and its split (means over stages, as
    the simulator's breakdown), peak memory per stage, and whether every stage fits `capacity`."""

    strategy: Strategy
    iteration_time_s: float
    compute_s: float
    recompute_s: float
    exposed_comm_s: float
    bubble_s: float
    memory: tuple[StageMemory, ...]
    capacity_bytes: float
    approximate: tuple[str, ...] = field(default_factory=tuple)
    """Features of `strategy` outside the space where the evaluator is held to the simulation
    (within 3%); for these the estimate is rougher (observed up to ~12% off) and only the
    simulation should decide."""

    @property
    def peak_memory_bytes(self) -> float:
        return max(m.total for m in self.memory)

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.capacity_bytes

    def breakdown(self) -> dict[str, float]:
        return {"compute": self.compute_s, "recompute": self.recompute_s, "exposed_comm": self.exposed_comm_s,
                "bubble": self.bubble_s}


def supports(s: Strategy) -> str:
    """'' when the evaluator models strategy `s`, else why not."""
    if s.sync != "allreduce":
        return f"sync {s.sync} (parameter-server training) is not modelled analytically"
    if s.layer_groups:
        return "layer groups are not modelled analytically"
    if s.variability.active:
        return "run-time variability is not modelled analytically"
    if s.compression.kind != "none":
        return "gradient compression is not modelled analytically"
    if s.p2p_scatter_gather and s.tp > 1 and not s.sequence_parallel:
        return "scatter-gather pipeline transfers are not modelled analytically"
    return ""


@dataclass
class _Table:
    """A layer table and what the evaluator caches about it. `key` names the table without the
    gradient accumulation (`base`): what does not depend on timing (the stage partition, balanced
    on the costs without accumulation as the simulator balances them; parameters, activations,
    buckets) is cached under it and shared by every micro-batch count."""

    entries: tuple[LayerEntry, ...]
    costs: list[float]
    partitions: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    sigs: list[int] | None = None
    prefix: dict[str, list[float]] = field(default_factory=dict)
    key: int = 0
    base: "_Table | None" = None

    def __post_init__(self) -> None:
        self.key = self.key or id(self)
        self.base = self.base or self

    def signature(self, a: int, b: int, instance: dict[str, str | None]) -> tuple:
        """What a chunk's timing depends on (chunks of identical layers share their timing)."""
        if self.sigs is None:
            self.sigs = [hash((e.type, e.forward, e.backward, e.backward_weight, e.params, e.saved_bytes,
                               e.out_bytes, e.core, e.core_bytes, e.tp, e.windows, e.experts,
                               instance[e.name] is not None))
                         for e in self.entries]
        return tuple(self.sigs[a:b])


class Evaluator:
    """Analytic iteration time and memory of strategies for one model on one cluster (caches the
    layer table per (tp, sequence parallel, micro-batch size, fused kernels) and the stage partition
    per chunk count). `pricer(layout, collective)` gives the simulator's `CommPricer`."""

    def __init__(self, model: Model, cluster: Cluster, dtype: str, pricer: Callable[[Layout, str], CommPricer],
                 tables: KernelTimes | None = None):
        self.fp8 = dtype == "fp8"  # FP8 projection GEMMs, BF16 elsewhere (dlsim.plan.fp8)
        if self.fp8:
            check_fp8(cluster.device, cluster.name)
            dtype = COMPUTE_DTYPE
        self.model, self.cluster, self.dtype = model, cluster, dtype
        self.device = cluster.device
        self.capacity = self.device.memory_bytes - self.device.memory_reserved
        self.sigma = self.device.overlap_slowdown
        self.tables = tables
        self._pricer = pricer
        self._pricers: dict[tuple, CommPricer] = {}
        self._layer_tables: dict[tuple, _Table] = {}
        self._base_tables: dict[tuple, _Table] = {}
        self._prices: dict[tuple, float] = {}
        self._groups: dict[tuple, tuple[str, int]] = {}
        self._cache: dict[tuple, object] = {}
        self.instance = recompute_layers(model)
        self.gb = DTYPE_BYTES[dtype]
        self._defaults: dict | None = None
        self._cuts: list[int] | None = None
        self._keep: list = []  # step lists whose ids key cached programs (`_Timing._program`)

    # -- cached pieces -------------------------------------------------------------------------
    def base_table(self, tp: int, sp: bool, mbs: int, fused: tuple[str, ...] = (), ep: int = 1,
                   ep_overlap: bool = False, cp: int = 1, microbatches: int = 1) -> _Table:
        """The layer table without gradient accumulation (tensor and context parallelism, fusions,
        experts; FP8 casts, which depend on the micro-batch count)."""
        key = (tp, sp, mbs, fused, ep, ep_overlap, cp, microbatches if self.fp8 else 0)
        t = self._base_tables.get(key)
        if t is None:
            local = split_sequence(self.model, cp)  # context parallelism: one rank's share of the sequence
            entries = build_layer_table(local, self.device, self.dtype, batch=mbs, tp=tp, tables=self.tables, ep=ep,
                                        ep_overlap=ep_overlap, sequence_parallel=sp, fused=frozenset(fused))
            entries = add_rings(entries, local, self.device, self.dtype, cp, self.tables, frozenset(fused))
            if self.fp8:
                entries = apply_fp8(entries, local, self.device, microbatches, self.tables, frozenset(fused))
            t = self._base_tables[key] = _Table(entries, [e.forward.seconds + e.backward.seconds for e in entries])
        return t

    def table(self, tp: int, sp: bool, mbs: int, fused: tuple[str, ...] = (), ep: int = 1,
              ep_overlap: bool = False, accumulation: float = 0.0, cp: int = 1, microbatches: int = 1) -> _Table:
        """`base_table` with `accumulation` bytes per parameter of gradient accumulation per
        micro-batch (`with_grad_accumulation`); it shares the base's partitions and key."""
        key = (tp, sp, mbs, fused, ep, ep_overlap, accumulation, cp, microbatches if self.fp8 else 0)
        t = self._layer_tables.get(key)
        if t is None:
            base = self.base_table(tp, sp, mbs, fused, ep, ep_overlap, cp, microbatches)
            if accumulation <= 0:
                t = base
            else:
                t = _Table(with_grad_accumulation(base.entries, self.device, accumulation), base.costs,
                           base.partitions, prefix=base.prefix, key=base.key, base=base)
            self._layer_tables[key] = t
        return t

    def strategy_base(self, s: Strategy) -> _Table:
        """The layer table of `s` without its gradient accumulation (what memory and the partition use)."""
        return self.base_table(s.tp, s.sequence_parallel, s.microbatch_size, s.fused_kernels, s.ep, s.ep_overlap,
                               s.cp, s.num_microbatches)

    def strategy_table(self, s: Strategy) -> _Table:
        """The layer table `s` runs on (tp, sequence parallelism, micro-batch, fusions, ep, accumulation)."""
        accumulation = grad_accumulation_bytes(s.grad_accumulation, self.dtype, s.num_microbatches)
        return self.table(s.tp, s.sequence_parallel, s.microbatch_size, s.fused_kernels, s.ep, s.ep_overlap,
                          accumulation, s.cp, s.num_microbatches)

    def ranges(self, s: Strategy, t: _Table) -> list[tuple[int, int]]:
        if s.stage_partition is not None:
            return partition(self.model, t.costs, s.chunks, s.stage_partition)
        r = t.partitions.get(s.chunks)
        if r is None:
            if self._cuts is None:
                self._cuts = single_tensor_cuts(self.model)
            r = t.partitions[s.chunks] = partition(self.model, t.costs, s.chunks, cuts=self._cuts)
        return r

    def pricer(self, s: Strategy) -> CommPricer:
        key = (s.dp, s.tp, s.pp, s.collective, s.cp)
        p = self._pricers.get(key)
        if p is None:
            p = self._pricers[key] = self._pricer(Layout(s.dp, s.tp, s.pp, self.cluster.devices_per_node, s.cp),
                                                  s.collective)
        return p

    def _price(self, pricer: CommPricer, s: Strategy, op: str, nbytes: float, ranks: list[int]) -> float:
        if len(ranks) < 2:
            return 0.0
        gkey = (s.dp, s.tp, s.pp, s.cp, ranks[0], len(ranks), ranks[-1])
        group = self._groups.get(gkey)
        if group is None:
            lay = Layout(s.dp, s.tp, s.pp, self.cluster.devices_per_node, s.cp)
            group = self._groups[gkey] = (pricer.tier(ranks), lay.ranks_per_node(ranks))
        key = (s.collective, op, nbytes, len(ranks)) + group
        v = self._prices.get(key)
        if v is None and op == "sendrecv":  # a context-parallel ring step: the slowest hop (dlsim.plan.iteration)
            v = self._prices[key] = max(pricer.p2p(nbytes, a, b).seconds for a, b in zip(ranks, ranks[1:] + ranks[:1]))
        elif v is None:
            v = self._prices[key] = pricer.collective(op, nbytes, ranks).seconds
        return v

    def ep_ranks(self, s: Strategy, stage: int) -> list[int]:
        """The expert-parallel group of data-parallel rank 0 on `stage`."""
        return ep_group(Layout(s.dp, s.tp, s.pp, self.cluster.devices_per_node, s.cp), s.ep, 0, 0, stage)

    def _experts_comm(self, s: Strategy, e: LayerEntry, pricer: CommPricer, ranks: list[int]) -> tuple[float, float]:
        """What a mixture of experts' all-to-alls add to its forward and backward run alone (the
        steps of `dlsim.plan.templates`: the dispatch beside the shared experts when overlapped)."""
        p = e.experts
        if p is None:
            return 0.0, 0.0
        group = self.ep_ranks(s, ranks[0] // (s.tp * s.dp))
        out = []
        for shared, beside, after in ((p.shared_forward, p.dispatch, p.combine),
                                      (p.shared_backward, p.combine, p.dispatch)):
            first = self._price(pricer, s, beside.op, beside.nbytes, group)
            if p.overlap and shared > 0:
                first = sum(overlap_cost(shared, first, self.sigma))
            out.append(first + self._price(pricer, s, after.op, after.nbytes, group))
        return out[0], out[1]

    def _pass_prefix(self, s: Strategy, t: _Table, pricer: CommPricer, ranks: list[int]) -> tuple[list[float], ...]:
        """Prefix sums over the entries of what each adds to a micro-batch's forward pass, its
        recomputation and its backward pass, each run alone: its kernels, its tensor-parallel
        collectives, and kernels beside an asynchronous collective as `overlap_cost` prices them
        (`_Timing.steps_time` of `forward_steps`, the recomputation's steps and `backward_steps`,
        summed layer by layer)."""
        def price(c) -> float:
            return self._price(pricer, s, c.op, c.nbytes, ranks)

        fw, rc, bw = [0.0], [0.0], [0.0]
        for e in t.entries:
            f = e.forward.seconds + sum(price(c) for c in e.tp.before + e.tp.after_fwd)
            moe_f, moe_b = self._experts_comm(s, e, pricer, ranks)
            f += moe_f
            x = 0.0
            if s.recompute == "full" and self.instance[e.name]:
                x = f
            elif s.recompute == "selective" and e.core.seconds > 0:
                x = e.core.seconds
            beside = {c.overlap: c for c in e.tp.before_bwd + e.tp.after_bwd if s.tp_async_backward and c.overlap}
            y = sum(price(c) for c in e.tp.before_bwd + e.tp.after_bwd if c not in beside.values())
            if beside:
                windows = [(kind, min(w, part.seconds)) for kind, w, part in
                           (("dgrad", e.windows[0], e.backward_data), ("wgrad", e.windows[1], e.backward_weight))
                           if kind in beside]
                y += e.backward.seconds - sum(w for _, w in windows)
                for kind, w in windows:
                    extra, exposed = overlap_cost(w, price(beside[kind]), self.sigma)
                    y += w + extra + exposed
            else:
                y += e.backward.seconds
            y += moe_b
            fw.append(fw[-1] + f)
            rc.append(rc[-1] + x)
            bw.append(bw[-1] + y)
        return fw, rc, bw

    def lower_bound(self, s: Strategy) -> float:
        """A lower bound of `evaluate(s).iteration_time_s`, O(chunks) from cached prefix sums, for
        the search's pruning (`dlsim.plan.search`).

        Each chunk's forward f_j and recomputation + backward b_j per micro-batch are at least their
        steps run alone (`_pass_prefix`: data-parallel buckets and the slowdown beside them only
        add) and, under ZeRO-3, at least the chunk's parameter gathers (serial on the communication
        stream, each unit waited for). Stage r runs m·W_r of them (W_r its chunks' sum), cannot
        start before micro-batch 0's forward went through the chunks before it, and stage 0 cannot
        finish before the last backward came back through them: T ≥ Σ_{j<r} (f_j + b_j) + m·W_r,
        which the schedule walk and the 1F1B / GPipe closed forms respect; where the evaluator
        takes the interleaved closed form, that form itself (m·max W + (Σ W − max W)/v). Then stage
        0's optimizer step and ZeRO-1/2 parameter all-gather. Point-to-point transfers, the
        tied-embedding all-reduce and data-parallel reductions are left out of that bound.

        Under ZeRO-3 a backward pass walks its parameter units one after another, each unit's
        gather queued on the communication stream when the unit is reached, behind the
        reduce-scatter the previous unit launched when it finished (`_Timing.walk_steps`): between
        the end of one unit and the start of the next pass at least that reduce-scatter and that
        gather, so b_j ≥ its steps alone + Σ gathers − the largest + Σ reduce-scatters − the
        largest (`_unit_chain`).

        ZeRO-3 walked pass by pass (p·m·v ≤ WALK_OPS) has a second bound: each stage's communication
        stream runs, one after another, every pass's parameter gathers (forward and backward) and
        every backward pass's reduce-scatters, and the stage ends after its stream has emptied and
        its optimizer step: T ≥ max_r (m·Σ_{k of r} (2·G_k + R_k) + step_r)."""
        t = self.strategy_base(s)  # the gradient accumulation is added per chunk below
        ranges = self.ranges(s, t)
        p, v, m = s.pp, s.virtual_stages, s.num_microbatches
        lay = Layout(s.dp, s.tp, s.pp, self.cluster.devices_per_node, s.cp)
        pricer = self.pricer(s)
        zero3 = s.zero == 3 and s.dp > 1
        # each layer's accumulation kernel adds its seconds to the backward pass; beside an
        # asynchronous collective it may hide some of it, so it is left out there
        acc = None if s.tp_async_backward else \
            self._accumulation_prefix(t, grad_accumulation_bytes(s.grad_accumulation, self.dtype, m))
        per_stage = []
        for r in range(p):
            ranks = lay.tp_group(0, r)
            key = ("bound", id(t), s.tp, s.collective, s.tp_async_backward, s.recompute,
                   pricer.tier(ranks) if s.tp > 1 else None, lay.ranks_per_node(ranks) if s.tp > 1 else None)
            got = self._cache.get(key)
            if got is None:
                got = self._cache[key] = self._pass_prefix(s, t, pricer, ranks)
            per_stage.append(got)
        dp_groups = [lay.dp_group(0, r) for r in range(p)] if zero3 else []
        bwd_chain = zero3 and s.ep == 1 and s.compression.kind == "none"
        work = [0.0] * p
        passes = []
        for k, (a, b) in enumerate(ranges):
            fw, rc, bw = per_stage[k % p]
            f, x, y = fw[b] - fw[a], rc[b] - rc[a], bw[b] - bw[a]
            if acc is not None:
                y += acc[b] - acc[a]
            if zero3:
                g = self._gathers(s, t, a, b, dp_groups[k % p])
                f = max(f, g)
                if bwd_chain:
                    y += self._unit_chain(s, t, a, b, dp_groups[k % p])
                y = max(y, g)
            work[k % p] += f + x + y
            passes.append(f + x + y)
        walked = p > 1 and p * m * v <= WALK_PLAIN_OPS
        if v > 1 and not walked:
            bound = m * max(work) + (sum(work) - max(work)) / v
        else:
            bound = fill = 0.0
            for r in range(p):
                bound = max(bound, fill + m * work[r])
                fill += passes[r]
        chunks0 = [c * p for c in range(v)]
        step = optimizer_timer(self.device, self.dtype, s.optimizer, self.step_kernels(t, p))
        share = optimizer_share(s.zero, s.dp)
        bound += step(sum(self._params(t, *ranges[k]) for k in chunks0) * share).seconds
        if zero3 and p * m * v <= WALK_OPS and s.ep == 1 and s.compression.kind == "none":
            for r in range(p):
                dp_r = dp_groups[r]
                chunks = range(r, len(ranges), p)
                stream = sum(2 * sum(g) + sum(red) for g, red in
                             (self._unit_prices(s, t, *ranges[k], dp_r) for k in chunks))
                bound = max(bound, m * stream + step(sum(self._params(t, *ranges[k]) for k in chunks) * share).seconds)
        if s.dp > 1 and gathers_updated_params(s.zero) and s.ep == 1:  # with ep: dense and expert gathers
            dp0 = lay.dp_group(0, 0)
            bound += sum(self._price(pricer, s, "allgather", self._params(t, *ranges[k]) * self.gb, dp0)
                         for k in chunks0)
        return bound * (1 - 1e-9)

    def _tier(self, pricer: CommPricer, ranks: list[int]) -> object:
        """`pricer.tier(ranks)`, cached by the group's first rank, size and last rank (a layout's
        groups are arithmetic progressions)."""
        key = ("tier", id(pricer), ranks[0], len(ranks), ranks[-1])
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = pricer.tier(ranks)
        return got

    def _accumulation_prefix(self, t: _Table, accumulation: float) -> list[float] | None:
        """Prefix sums of the seconds `with_grad_accumulation` adds to each entry of base table `t`
        (None when it adds nothing; cached)."""
        if accumulation <= 0:
            return None
        key = ("accumulation", t.key, accumulation)
        got = self._cache.get(key)
        if got is None:
            got = [0.0]
            for add in grad_accumulation_times(t.entries, self.device, accumulation):
                got.append(got[-1] + (add.seconds if add is not None else 0.0))
            self._cache[key] = got
        return got  # type: ignore[return-value]

    def _params(self, t: _Table, a: int, b: int) -> int:
        pre = t.prefix.get("params")
        if pre is None:
            pre = [0]
            for e in t.entries:
                pre.append(pre[-1] + e.params)
            t.prefix["params"] = pre  # type: ignore[assignment]
        return pre[b] - pre[a]  # type: ignore[return-value]

    def _unit_prices(self, s: Strategy, t: _Table, a: int, b: int,
                     dp_ranks: list[int]) -> tuple[list[float], list[float]]:
        """Per gradient bucket (ZeRO-3 parameter unit) of entries a..b over `dp_ranks`: the seconds of
        its all-gather and of its reduction (one backward pass's, as `_Timing._bucket_launches` prices
        them); cached."""
        pricer = self.pricer(s)
        key = ("unit prices", t.key, a, b, s.dp, s.zero, s.compression, s.bucket_size, s.first_bucket_size,
               s.collective, self._tier(pricer, dp_ranks), len(dp_ranks))
        got = self._cache.get(key)
        if got is None:
            base = gradient_collective(s.zero)
            nbytes = self._bucket_bytes(s, t, a, b)
            got = self._cache[key] = (
                [self._price(pricer, s, "allgather", n, dp_ranks) for n in nbytes],
                [sum(self._price(pricer, s, op, m, dp_ranks)
                     for op, m in plan_sync(s.compression, n, self.gb, s.dp, base).collectives) for n in nbytes])
        return got  # type: ignore[return-value]

    def _gathers(self, s: Strategy, t: _Table, a: int, b: int, dp_ranks: list[int]) -> float:
        """Seconds of ZeRO-3's all-gathers of the parameter units of entries a..b."""
        return sum(self._unit_prices(s, t, a, b, dp_ranks)[0])

    def _unit_chain(self, s: Strategy, t: _Table, a: int, b: int, dp_ranks: list[int]) -> float:
        """Σ gathers − the largest + Σ reductions − the largest over the ZeRO-3 parameter units of
        entries a..b: what a backward pass's chain of units adds at least to its steps alone (see
        `lower_bound`)."""
        gathers, reductions = self._unit_prices(s, t, a, b, dp_ranks)
        return sum(gathers) - max(gathers, default=0.0) + sum(reductions) - max(reductions, default=0.0)

    # -- memory --------------------------------------------------------------------------------
    def memory(self, s: Strategy) -> tuple[StageMemory, ...]:
        """Peak memory of each stage's devices (as the simulator's memory tracker counts it)."""
        t = self.strategy_base(s)
        return self._memory(s, t, self.ranges(s, t))

    def _off_default(self, s: Strategy) -> bool:
        """Whether a field outside `VALIDATED_FIELDS` is off its default."""
        if self._defaults is None:
            default = Strategy()
            self._defaults = {k: getattr(default, k) for k in Strategy.__dataclass_fields__
                              if k not in VALIDATED_FIELDS}
        return any(getattr(s, k) != v for k, v in self._defaults.items())

    def memory_floor(self, s: Strategy) -> float:
        """A lower bound of max(x.total for x in memory(s)) without partitioning: the model states
        (`model_state_bytes`, linear in the parameters) of a stage holding the mean share 1/pp of the
        parameters, which the stage holding the most reaches at least. 0 for a strategy outside the
        validated fields (sharding, offload and expert placement change what a device holds)."""
        if self._off_default(s):
            return 0.0
        t = self.strategy_base(s)
        states = model_state_bytes(self._params(t, 0, len(t.entries)) / s.pp, self.dtype, s.optimizer, s.zero, s.dp)
        return (states["weights"] + states["gradients"] + states["optimizer"]) * (1 - 1e-9)

    def _chunk_acts(self, s: Strategy, t: _Table, ranges) -> list[tuple[float, float, float]]:
        key = ("acts", t.key, tuple(ranges), s.recompute, s.recompute_layers)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = self._chunk_acts_uncached(s, t, ranges)
        return got  # type: ignore[return-value]

    def boundaries(self, t: _Table, ranges) -> list[float]:
        """`boundary_bytes` of the table cut at `ranges` (cached)."""
        key = ("bounds", t.key, tuple(ranges))
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = boundary_bytes(self.model, t.entries, ranges)
        return got  # type: ignore[return-value]

    def step_kernels(self, t: _Table, pp: int) -> int:
        """`step_kernels` of the table's entries for `pp` stages (cached)."""
        key = ("kernels", t.key, pp)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = step_kernels(t.entries, pp)
        return got  # type: ignore[return-value]

    def tied(self, t: _Table, ranges, pp: int) -> dict[int, int]:
        key = ("tied", t.key, tuple(ranges), pp)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = _tied_params(self.model, t.entries, ranges, pp)
        return got  # type: ignore[return-value]

    def _chunk_acts_uncached(self, s: Strategy, t: _Table, ranges) -> list[tuple[float, float, float]]:
        bounds = self.boundaries(t, ranges) if s.recompute == "full" else []
        out = []
        for k, (a, b) in enumerate(ranges):
            es = t.entries[a:b]
            if s.recompute == "full":
                out.append(full_recompute_memory(self.model, es, s.recompute_layers,
                                                 bounds[k - 1] if k > 0 else 0.0, self.instance))
            elif s.recompute == "selective" and any(e.core.seconds > 0 for e in es):
                out.append(selective_recompute_memory(es))
            else:
                out.append((sum(e.saved_bytes for e in es), 0.0, 0.0))
        return out

    def _memory(self, s: Strategy, t: _Table, ranges) -> tuple[StageMemory, ...]:
        acts = self._chunk_acts(s, t, ranges)
        key = tuple(ranges)
        skey = ("stages", t.key, key, s.pp, s.virtual_stages)
        stages = self._cache.get(skey)
        if stages is None:  # per stage: parameters, workspace, routed-expert parameters, tied copies
            tied = self.tied(t, ranges, s.pp)
            stages = []
            for r in range(s.pp):
                es = [e for c in range(s.virtual_stages) for e in t.entries[slice(*ranges[c * s.pp + r])]]
                stages.append((sum(e.params for e in es), max((e.workspace for e in es), default=0.0),
                               expert_params_of(es), tied.get(r, 0)))
            self._cache[skey] = stages
        zero3 = s.zero == 3 and s.dp > 1
        offload = offloads_optimizer(s.offload)
        lay = Layout(s.dp, s.tp, s.pp, self.cluster.devices_per_node, s.cp) if s.hybrid_shard else None
        out = []
        for r in range(s.pp):
            chunks = [c * s.pp + r for c in range(s.virtual_stages)]
            params, workspace, expert, tied_params = stages[r]  # type: ignore[index]
            shard = len(lay.shard_group(0, 0, r)) if lay is not None else s.dp_cp
            states = self._states(params, s.optimizer, s.zero, shard)
            if expert:
                states = expert_states(states, expert, self.dtype, s.optimizer, s.zero, shard, s.ep)
            local = self._states(tied_params, s.optimizer, 0, 1)
            weights, gradients = states["weights"] + local["weights"], states["gradients"] + local["gradients"]
            optimizer = states["optimizer"] + local["optimizer"]
            if offload:  # in host memory, two of its streamed slices on the device
                optimizer = 2 * optimizer / OFFLOAD_SLICES
            if s.virtual_stages == 1:  # n in flight, the extra of one pass beside them
                n = peak_inflight(s.schedule, s.pp, s.num_microbatches, 1, r)
                k = chunks[0]
                activations = n * acts[k][0] + max(acts[k][1], acts[k][2])
            elif s.num_microbatches * s.virtual_stages <= WALK_MEMORY_OPS:
                akey = ("peak", s.schedule, s.pp, s.num_microbatches, s.virtual_stages, r,
                        tuple(acts[k] for k in chunks))
                activations = self._cache.get(akey)  # type: ignore[assignment]
                if activations is None:
                    activations = self._cache[akey] = _activation_peak(
                        _stage_ops(s.schedule, s.pp, s.num_microbatches, s.virtual_stages, r), [acts[k] for k in chunks])
            else:  # the schedule's in-flight count (`peak_inflight`) of the largest chunk
                n = peak_inflight(s.schedule, s.pp, s.num_microbatches, s.virtual_stages, r)
                activations = n * max(acts[k][0] for k in chunks) + max(max(acts[k][1], acts[k][2]) for k in chunks)
            transient = 0.0
            if zero3:  # the unit being used and the one prefetched, (dp-1)/dp of each
                units = sorted((n for k in chunks for n in self._bucket_bytes(s, t, *ranges[k])), reverse=True)
                transient = sum(units[:2]) * (s.dp - 1) / s.dp
            out.append(StageMemory(weights, gradients, optimizer, activations, transient, workspace))
        return tuple(out)

    def _states(self, params: float, optimizer: str, zero: int, shard: int) -> dict[str, float]:
        """`model_state_bytes` (cached: the stages of a pipeline mostly hold the same parameters)."""
        key = ("states", params, optimizer, zero, shard)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = model_state_bytes(params, self.dtype, optimizer, zero, shard)
        return got  # type: ignore[return-value]

    def _bucket_bytes(self, s: Strategy, t: _Table, a: int, b: int) -> list[float]:
        """Bytes of the gradient buckets (ZeRO-3 parameter units) of entries a..b (cached)."""
        key = ("bucket bytes", t.key, a, b, s.dp > 1 or bool(s.zero), s.bucket_size, s.first_bucket_size)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = [bu.nbytes for bu in self._buckets(s, t.entries[a:b])]
        return got  # type: ignore[return-value]

    def _buckets(self, s: Strategy, es: Sequence[LayerEntry]):
        if not (s.dp > 1 or s.zero):
            return []
        return expert_buckets(es, make_buckets([(e.index, e.params * self.gb) for e in es if e.params > 0],
                                               s.bucket_size, s.first_bucket_size), s, self.gb)

    # -- time ----------------------------------------------------------------------------------
    def maybe_approximate(self, s: Strategy) -> bool:
        """Whether `evaluate(s)` may come flagged `Evaluation.approximate`, known before timing `s` (a
        superset, for the search's pruning): a field other than those of the validated space off its
        default, a pipeline timed by its closed form, ZeRO-2/3 not walked pass by pass, interleaved
        with m = pp, pipeline transfers on the tensor-parallel link tier."""
        if self._off_default(s):
            return True
        p, m, v = s.pp, s.num_microbatches, s.virtual_stages
        if (p > 1 and p * m * v > WALK_PLAIN_OPS) or (p * m * v > WALK_OPS and s.zero >= 2 and s.dp > 1):
            return True
        if s.schedule == "interleaved" and m == p:
            return True
        if p > 1 and s.tp > 1:
            key = ("p2p tier", s.dp, s.tp, p, s.collective)
            got = self._cache.get(key)
            if got is None:
                lay = Layout(s.dp, s.tp, p, self.cluster.devices_per_node)
                pricer = self.pricer(s)
                tier = pricer.tier(lay.tp_group(0, 0))
                got = self._cache[key] = any(pricer.tier([lay.rank(0, 0, r), lay.rank(0, 0, r + 1)]) == tier
                                             for r in range(p - 1))
            return bool(got)
        return False

    def evaluate(self, s: Strategy, memory: tuple[StageMemory, ...] | None = None) -> Evaluation:
        """Iteration time and memory of `s` (see the module docstring)."""
        t = self.strategy_table(s)
        ranges = self.ranges(s, t)
        memory = memory or self._memory(s, t, ranges)
        return _Timing(self, s, t, ranges, memory).run()


VALIDATED_FIELDS = ("dp", "tp", "pp", "microbatch_size", "num_microbatches", "schedule", "virtual_stages",
                    "recompute", "sequence_parallel", "zero")
"""The strategy fields of the space tests/test_optimize.py holds the evaluator to the simulation on
(every other field at its default there)."""
WALK_OPS = 16384
"""ZeRO-2/3 pipelines with at most this many (stage, chunk, micro-batch) passes have every pass walked
beside the communication stream (`_Timing._programs`, memoised per relative stream state: tens of
milliseconds at this size); longer ones hide each chunk's reduction leftover under the next forward
pass (flagged approximate). Walking them instead of flagging them spares the simulations the
approximate tolerance would otherwise call for (benchmarks/bench_optimize.py)."""
_COMPUTE, _COLLECTIVE, _OVERLAP = 0, 1, 2  # step kinds of a priced program (`_Timing._program`)
WALK_PLAIN_OPS = 1 << 15
"""Pipelines whose passes are walked without the communication stream (no ZeRO-2/3 walk pass by
pass) are timed by walking the op orders up to this many passes (a few microseconds each)."""
WALK_MEMORY_OPS = 256
"""Interleaved schedules with at most this many chunk-micro-batches per stage have their activation
peak walked op by op; longer ones use `peak_inflight` with the largest chunk."""


@lru_cache(maxsize=4096)
def _stage_ops(schedule: str, p: int, m: int, v: int, r: int) -> tuple:
    """`stage_ops`, kept: the search asks for the same schedules again and again."""
    return tuple(stage_ops(schedule, p, m, v, r))


def _activation_peak(ops, acts: list[tuple[float, float, float]]) -> float:
    """Peak activation bytes of one stage running `ops` (local chunk c keeps acts[c] = (kept, forward
    extra, recompute extra) per micro-batch), counted as the simulator's memory tracker does: kept +
    forward extra when a forward starts, the extra freed when it ends; the recompute extra when a
    backward starts, kept + that extra freed when it ends."""
    now = peak = 0.0
    for op in ops:
        kept, fwd_extra, re_extra = acts[op.chunk]
        if op.kind == FORWARD:
            now += kept + fwd_extra
            peak = max(peak, now)
            now -= fwd_extra
        else:
            now += re_extra
            peak = max(peak, now)
            now -= kept + re_extra
    return peak


def pipeline_walk(schedule: str, p: int, m: int, v: int, f: Sequence[float], b: Sequence[float],
                  c: Sequence[float], run_op: Callable | None = None) -> list[list[float]]:
    """When each stage's last backward pass of each local chunk ends: the stages' op orders
    (`stage_ops`) run with forward / backward times f[k], b[k] per micro-batch of global chunk k and
    transfers c[k] across boundary k → k+1, each op starting when its stage is free and its input
    has arrived (no contention: the simulator's timeline for these tasks). With `run_op(r, op, k, t)`
    an op that starts at t ends when that says instead. Returns ends[r][local chunk]."""
    K = p * v
    ops = [_stage_ops(schedule, p, m, v, r) for r in range(p)]
    pos = [0] * p
    free = [0.0] * p
    fend: dict[tuple[int, int], float] = {}
    bend: dict[tuple[int, int], float] = {}
    last = [[0.0] * v for _ in range(p)]
    remaining = sum(len(o) for o in ops)
    while remaining:
        progressed = False
        for r in range(p):
            order, i = ops[r], pos[r]
            t = free[r]
            while i < len(order):
                op = order[i]
                k = op.chunk * p + r
                if op.kind == FORWARD:
                    if k > 0:
                        dep = fend.get((k - 1, op.microbatch))
                        if dep is None:
                            break
                        t = max(t, dep + c[k - 1])
                    t = t + f[k] if run_op is None else run_op(r, op, k, t)
                    fend[(k, op.microbatch)] = t
                else:
                    if k < K - 1:
                        dep = bend.get((k + 1, op.microbatch))
                        if dep is None:
                            break
                        t = max(t, dep + c[k])
                    t = t + b[k] if run_op is None else run_op(r, op, k, t)
                    bend[(k, op.microbatch)] = t
                    last[r][op.chunk] = t
                i += 1
            if i != pos[r]:
                remaining -= i - pos[r]
                pos[r], free[r] = i, t
                progressed = True
        if not progressed:  # pragma: no cover  (the schedules are deadlock-free)
            raise RuntimeError(f"pipeline schedule {schedule} deadlocked")
    return last


def _tied_params(model: Model, entries: Sequence[LayerEntry], ranges, pp: int) -> dict[int, int]:
    """Per stage, parameters of weights tied to a layer on another stage (Megatron's copy of the
    word embedding on the last stage)."""
    stage_of = {}
    for k, (a, b) in enumerate(ranges):
        for i in range(a, b):
            stage_of[entries[i].name] = k % pp
    out: dict[int, int] = {}
    by_name = {e.name: e for e in entries}
    for e in entries:
        tied = model.layers[e.index].attrs.get("tied_to") if e.type == "linear" else None
        if tied and stage_of[tied] != stage_of[e.name]:
            out[stage_of[e.name]] = out.get(stage_of[e.name], 0) + by_name[tied].params
    return out


class _Timing:
    """One strategy's timing (see the module docstring)."""

    def __init__(self, ev: Evaluator, s: Strategy, t: _Table, ranges, memory):
        self.ev, self.s, self.t, self.ranges, self.mem = ev, s, t, ranges, memory
        self.pricer = ev.pricer(s)
        self.lay = Layout(s.dp, s.tp, s.pp, ev.cluster.devices_per_node, s.cp)
        self.sigma = ev.sigma
        self.chunk_entries = [t.entries[a:b] for a, b in ranges]
        self._tpg: dict[int, list[int]] = {}
        self._dpg: dict[int, list[int]] = {}
        self._same_tier: dict[int, bool] = {}
        self._programs_of = ev._cache  # priced programs are shared by the evaluations of one layout

    def price(self, op: str, nbytes: float, ranks: list[int]) -> float:
        return self.ev._price(self.pricer, self.s, op, nbytes, ranks)

    def tpg(self, stage: int) -> list[int]:
        """The tensor-parallel group of replica 0's `stage` (cached)."""
        got = self._tpg.get(stage)
        if got is None:
            got = self._tpg[stage] = self.lay.tp_group(0, stage)
        return got

    def dpg(self, stage: int) -> list[int]:
        """The data-parallel group of tensor rank 0's `stage` (cached)."""
        got = self._dpg.get(stage)
        if got is None:
            got = self._dpg[stage] = self.lay.dp_group(0, stage)
        return got

    def steps_time(self, steps: list[Step], stage: int) -> tuple[float, float, float]:
        """(seconds, compute seconds, communication seconds) of a step list run alone."""
        total = comp = comm = 0.0
        ranks = self.tpg(stage)
        for st in steps:
            if st.kind == "compute":
                total += st.duration
                comp += st.duration
            elif st.kind == "collective":
                c = self.price(st.collective.op, st.collective.nbytes, self._ranks(st, ranks, stage))
                total += c
                comm += c
            else:  # overlap: kernels beside an asynchronous collective
                c = self.price(st.collective.op, st.collective.nbytes, self._ranks(st, ranks, stage))
                extra, exposed = overlap_cost(st.duration, c, self.sigma)
                total += st.duration + extra + exposed
                comp += st.duration
                comm += extra + exposed
        return total, comp, comm

    def _walk(self, steps: list[Step], stage: int, launches: dict[int, list[float]], gathers: list[float] | None,
              queue_start: float = 0.0) -> tuple[float, float, float]:
        """Run a step list beside the communication stream from time 0 (`walk_steps`); returns (pass
        seconds, time the queue empties after the pass start, seconds compute was slowed)."""
        now, busy, slowed, _ = self.walk_steps(steps, stage, launches, gathers, 0.0, queue_start, 0.0)
        return now, max(busy, now), slowed

    def _program(self, steps: list[Step], stage: int) -> list[tuple[int, float, float, bool, int]]:
        """`steps` priced once for `walk_steps` (which runs them many times): per step (kind, kernel
        seconds, collective seconds — for an overlap what `overlap_cost` adds beside the kernels —,
        whether a collective queues behind the communication stream, parameter unit)."""
        s = self.s
        key = ("program", id(steps), stage, s.dp, s.tp, s.pp, s.cp, s.ep, s.collective)
        got = self._programs_of.get(key)
        if got is not None:
            return got
        tp_ranks = self.tpg(stage)
        same_tier = self._same_tier.get(stage)
        if same_tier is None:
            same_tier = self._same_tier[stage] = self.s.dp > 1 and self.s.tp > 1 and \
                self.pricer.tier(tp_ranks) == self.pricer.tier(self.dpg(stage))
        out = []
        for st in steps:
            if st.kind == "compute":
                out.append((_COMPUTE, st.duration, 0.0, False, st.unit))
                continue
            c = self.price(st.collective.op, st.collective.nbytes, self._ranks(st, tp_ranks, stage))
            if st.kind == "collective":
                queued = same_tier if st.group != EP else self._ep_queued(stage)
                out.append((_COLLECTIVE, 0.0, c, queued, st.unit))
            else:
                extra, exposed = overlap_cost(st.duration, c, self.sigma)
                out.append((_OVERLAP, st.duration, extra + exposed, False, st.unit))
        self._programs_of[key] = out
        self.ev._keep.append(steps)  # the key holds its id: keep it alive as long as the program
        return out

    def walk_steps(self, steps: list[Step], stage: int, launches: dict[int, list[float]],
                   gathers: list[float] | None, now: float, busy: float, first_dep: float,
                   first_gather: float | None = None) -> tuple[float, float, float, float]:
        """Run a step list from time `now` beside the communication stream, busy until `busy` (the
        simulator's per-device streams, `dlsim.plan.iteration` and `dlsim.plan.syncplan`): `launches`
        maps a step position to the collective durations it enqueues when it ends; `gathers` (ZeRO-3)
        the all-gather of each parameter unit, which the unit's first step waits for. A unit's gather is
        enqueued behind what the stream holds once the previous unit's first step has ended (the first
        unit's once `first_dep`, the end of the previous pass's first step, has passed): at most two
        units gathered at a time; `first_gather`, when given, is when the first unit's gather ends
        (issued before the pass started). Compute runs slowed by σ while the stream is busy; a tensor-parallel
        collective on the data-parallel link tier waits for the queue that holds its ports. Returns
        (end, stream busy until, seconds compute was slowed, end of the first step)."""
        sigma = self.sigma
        program = self._program(steps, stage)
        slowed = 0.0
        unit = None
        dep = first_dep  # what the next unit's gather waits for
        unit_first = False
        first_end = -1.0
        ahead = -1  # a unit whose gather is already queued
        nxt = {}
        if gathers is not None and not launches:  # nothing queued between a unit's gather and the next one's:
            order = [st.unit for st in steps if st.unit >= 0]  # it is queued once the unit's first step ends
            nxt = {a: b for a, b in zip(order, order[1:]) if a != b}
        for pos, (kind, d, c, queued, st_unit) in enumerate(program):
            if gathers is not None and st_unit >= 0 and st_unit != unit:
                if unit is None and first_gather is not None:
                    busy = max(busy, first_gather)
                elif st_unit != ahead:
                    busy = max(busy, dep) + gathers[st_unit]
                unit = st_unit
                now = max(now, busy)
                unit_first = True
            if kind == _COMPUTE:
                if busy > now and sigma > 0:
                    window = busy - now
                    if d * (1 + sigma) <= window:
                        slowed += d * sigma
                        now += d * (1 + sigma)
                    else:
                        done = window / (1 + sigma)
                        slowed += window - done
                        now = busy + (d - done)
                else:
                    now += d
            elif kind == _COLLECTIVE:
                if queued and busy > now:  # waits for the bucket holding the ports, delays the rest
                    busy += c
                    now = busy
                else:
                    now += c
            else:
                now += d + c  # overlap: its kernels and what the collective beside them adds (`_program`)
            if unit_first:
                dep, unit_first = now, False
                if unit in nxt:
                    ahead = nxt[unit]
                    busy = max(busy, dep) + gathers[ahead]  # type: ignore[index]
            if first_end < 0:
                first_end = now
            if launches:
                for dur in launches.get(pos, ()):
                    busy = max(busy, now) + dur
        return now, busy, slowed, first_end if first_end >= 0 else now

    def _programs(self, parts: list[tuple], c: list[float]) -> tuple[list[list[float]], list[float], list[float]]:
        """ZeRO-2/3: every stage's op order (`pipeline_walk`), each pass walked (`walk_steps`) beside the
        stage's communication stream, which carries over from pass to pass as the simulator's does (a
        backward pass's reductions delay the next pass's gathers, slow its kernels, and the last ones
        end the iteration). Returns (ends[r][local chunk] of the last backward passes, when each
        stage's stream empties, each stage's seconds inside its passes)."""
        s = self.s
        p = s.pp
        state = [(0.0, 0.0) for _ in range(p)]  # per stage: stream busy until, end of the last pass's first step
        inside = [0.0] * p
        memo: dict[tuple, tuple[float, float, float]] = {}

        first_unit: dict[tuple, int] = {}  # (chunk, kind) -> the pass's first parameter unit (-1: none)

        def run_op(r: int, op, k: int, t: float) -> float:
            busy, dep = state[r]
            fwd, rec, bwd, launches, gathers = parts[k]
            # passes are time-invariant: keyed by relative times, a stream idle before the start and a
            # first gather (issued once the previous pass's first step ended) done before it are alike
            gather = None
            if gathers:
                unit = first_unit.get((k, op.kind))
                if unit is None:
                    steps = fwd if op.kind == FORWARD else bwd
                    unit = first_unit[(k, op.kind)] = next((st.unit for st in steps if st.unit >= 0), -1)
                if unit >= 0:
                    gather = max(0.0, max(busy, dep) - t + gathers[unit])
            key = (k, op.kind, max(0.0, busy - t), gather)
            got = memo.get(key)
            if got is None:
                q = key[2]
                if op.kind == FORWARD:
                    end, q, _, first = self.walk_steps(fwd, r, {}, gathers, 0.0, q, 0.0, gather)
                else:
                    now, first = 0.0, -1.0
                    if rec:
                        now, q, _, first = self.walk_steps(rec, r, {}, None, now, q, 0.0)
                    end, q, _, first_b = self.walk_steps(bwd, r, launches, gathers, now, q, 0.0, gather)
                    first = first if rec else first_b
                got = memo[key] = (end, q, first)
            end, q, first = got
            state[r] = (t + q, t + first)
            inside[r] += end
            return t + end

        last = pipeline_walk(s.schedule, p, s.num_microbatches, s.virtual_stages, (), (), c, run_op)
        return last, [state[r][0] for r in range(p)], inside

    def _param_gathers(self, k: int, dp_ranks: list[int], stage: int) -> float:
        """ZeRO-1/2's all-gathers of chunk k's updated parameters: the dense ones over dp, the routed
        experts' over the expert-data-parallel group (`dlsim.plan.syncplan`)."""
        es = self.chunk_entries[k]
        expert = expert_params_of(es)
        seconds = self.price("allgather", (sum(e.params for e in es) - expert) * self.ev.gb, dp_ranks)
        if expert and self.s.dp // self.s.ep > 1:
            seconds += self.price("allgather", expert * self.ev.gb, edp_group(self.lay, self.s.ep, 0, 0, stage))
        return seconds

    def _ep_queued(self, stage: int) -> bool:
        """Whether an expert-parallel all-to-all shares its link tier with the gradient reductions (of
        the data-parallel or the expert-data-parallel group) queued on the communication stream."""
        if self.s.dp == 1:
            return False
        tier = self.pricer.tier(self.ev.ep_ranks(self.s, stage))
        groups = (self.dpg(stage), edp_group(self.lay, self.s.ep, 0, 0, stage))
        return any(len(g) > 1 and self.pricer.tier(g) == tier for g in groups)

    def _ranks(self, st: Step, tp_ranks: list[int], stage: int) -> list[int]:
        """The ranks of a step's collective: its expert-parallel group or context-parallel ring, else
        the tensor-parallel one."""
        if st.group == "cp":
            return self.lay.cp_group(0, 0, stage)
        return self.ev.ep_ranks(self.s, stage) if st.group == EP else tp_ranks

    def _bucket_launches(self, steps: list[Step], buckets, stage: int) -> dict[int, list[float]]:
        dp_ranks = self.dpg(stage)
        edp_ranks = edp_group(self.lay, self.s.ep, 0, 0, stage)
        base = gradient_collective(self.s.zero)
        out: dict[int, list[float]] = {}
        for pos, st in enumerate(steps):
            for j in st.buckets:
                plan = plan_sync(self.s.compression, buckets[j].nbytes, self.ev.gb, self.s.dp, base)
                group = edp_ranks if buckets[j].group == EDP else dp_ranks
                out.setdefault(pos, []).append(sum(self.price(op, n, group) for op, n in plan.collectives))
        return out

    def _chunk(self, k: int) -> tuple:
        """Per micro-batch times of global chunk k: (f_t, f_c, f_m, r_t, r_c, r_m, b_t, b_c, b_m, sync
        seconds, walked backward (steps, launches, seconds), per-micro-batch reductions outlast the pass).
        Cached per evaluator by everything it depends on."""
        s, ev = self.s, self.ev
        p, tp, r = s.pp, s.tp, k % s.pp
        tp_ranks, dp_ranks = self.tpg(r), self.dpg(r)
        groups = (self.pricer.tier(tp_ranks), self.lay.ranks_per_node(tp_ranks), self.pricer.tier(dp_ranks),
                  self.lay.ranks_per_node(dp_ranks)) if s.dp > 1 or s.tp > 1 else ()
        a, b = self.ranges[k]
        key = ("chunk", self.t.signature(a, b, ev.instance), tp, s.dp, groups, s.recompute, s.recompute_layers,
               s.tp_async_backward, s.zero, s.bucket_size, s.first_bucket_size, s.collective)
        got = ev._cache.get(key)
        if got is not None:
            return got  # type: ignore[return-value]
        overlap = s.tp_async_backward
        dp_sync = s.dp > 1
        per_mb = reduces_every_microbatch(s.zero) and dp_sync
        zero3 = s.zero == 3 and dp_sync
        comm_bound = False
        # the pieces that depend on fewer fields are kept apart, so that candidates differing only in
        # recomputation, ZeRO stage or data-parallel degree share their step lists and pass times
        sig, tpg, dpg = key[1], groups[:2], groups[2:]
        has_buckets = dp_sync or bool(s.zero)
        # forward and recomputation steps do not depend on the gradient accumulation: keyed by the
        # chunk of the table without it, shared by every micro-batch count
        fsig = self.t.base.signature(a, b, ev.instance)  # type: ignore[union-attr]
        fkey = ("forward", fsig, tp, tpg, s.collective, s.bucket_size, s.first_bucket_size, has_buckets, zero3)
        forward = ev._cache.get(fkey)
        if forward is None:
            es = self.chunk_entries[k]
            buckets = self._buckets_of(es)
            fwd = forward_steps(es, tp)
            units = units_of(es, buckets) if zero3 and buckets else None
            fwd_u = forward_steps(es, tp, unit_of=units) if units is not None else fwd
            forward = ev._cache[fkey] = (buckets, units, fwd_u, self.steps_time(fwd, r))
        buckets, units, fwd_u, (f_t, f_c, f_m) = forward  # type: ignore[misc]
        pkey = ("backward", sig, tp, tpg, s.collective, overlap, s.bucket_size, s.first_bucket_size, has_buckets,
                zero3)
        passes = ev._cache.get(pkey)
        if passes is None:
            es = self.chunk_entries[k]
            ready: dict[int, tuple[int, ...]] = {}
            for j, bu in enumerate(buckets):
                ready[bu.ready_after] = ready.get(bu.ready_after, ()) + (j,)
            bwd = backward_steps(es, tp, ready, units, overlap=overlap) if units is not None else \
                backward_steps(es, tp, ready, overlap=overlap)
            passes = ev._cache[pkey] = (bwd, self.steps_time(bwd, r))
        bwd, (b_t, b_c, b_m) = passes  # type: ignore[misc]
        rkey = ("recompute", fsig, tp, tpg, s.collective, s.recompute)
        rec_time = ev._cache.get(rkey)
        if rec_time is None:
            es = self.chunk_entries[k]
            if s.recompute == "full":
                rec = forward_steps([e for e in es if ev.instance[e.name]], tp, "recompute")
            elif s.recompute == "selective":
                rec = selective_recompute_steps(es)
            else:
                rec = []
            rec_time = ev._cache[rkey] = (rec, self.steps_time(rec, r))
        rec, (r_t, r_c, r_m) = rec_time  # type: ignore[misc]
        if dp_sync and buckets:
            lkey = ("launches", pkey, s.dp, dpg, s.zero, s.collective, s.compression)
            launches = ev._cache.get(lkey)
            if launches is None:
                launches = ev._cache[lkey] = self._bucket_launches(bwd, buckets, r)
        else:
            launches = {}
        chunk_sync = sum(sum(x) for x in launches.values())  # type: ignore[union-attr]
        gathers = None
        if zero3:
            dp_ranks = self.dpg(r)
            gathers = [self.price("allgather", bu.nbytes, dp_ranks) for bu in buckets]
            wf, qf, sf = self._walk(fwd_u, r, {}, gathers)
            wb, qb, sb = self._walk(bwd, r, launches, gathers)
            left = max(0.0, qb - wb)
            extra = overlap_cost(wf + r_t, left, self.sigma)[0] + max(0.0, left - (wf + r_t) * (1 + self.sigma))
            f_m += wf - f_t
            b_m += wb - b_t + extra
            f_t, b_t = wf, wb + extra
        elif per_mb and launches:
            wb, qb, sb = self._walk(bwd, r, launches, None)
            left = max(0.0, qb - wb)
            if left > 0:
                comm_bound = True
            extra = wb - b_t + overlap_cost(f_t + r_t, left, self.sigma)[0] \
                + max(0.0, left - (f_t + r_t) * (1 + self.sigma))
            b_t += extra
            b_m += extra
        out = (f_t, f_c, f_m, r_t, r_c, r_m, b_t, b_c, b_m, chunk_sync, (bwd, launches, b_t), comm_bound,
               (fwd_u, rec, bwd, launches, gathers))
        ev._cache[key] = out
        return out

    def run(self) -> Evaluation:
        s, ev = self.s, self.ev
        p, v, m = s.pp, s.virtual_stages, s.num_microbatches
        tp = s.tp
        overlap = s.tp_async_backward
        if s.recompute == "full":
            inside = ev.instance
        dp_sync = s.dp > 1
        per_mb = reduces_every_microbatch(s.zero) and dp_sync
        zero3 = s.zero == 3 and dp_sync
        K = p * v
        comm_bound = False
        f = [0.0] * K  # per global chunk and micro-batch: forward, and recompute + backward seconds
        bk = [0.0] * K
        comp = [0.0] * p
        recomp = [0.0] * p
        comm = [0.0] * p
        chunk_sync = [0.0] * K  # data-parallel collectives of a chunk's buckets (one backward pass)
        walked: list[tuple] = [()] * K  # (backward steps, launches, backward seconds without recompute)
        parts: list[tuple] = [()] * K  # (forward, recompute, backward steps, launches, gathers)
        for k in range(K):
            r = k % p
            f_t, f_c, f_m, r_t, r_c, r_m, b_t, b_c, b_m, chunk_sync[k], walked[k], bound, parts[k] = self._chunk(k)
            comm_bound = comm_bound or bound
            f[k], bk[k] = f_t, r_t + b_t
            comp[r] += f_c + b_c
            recomp[r] += r_c
            comm[r] += f_m + r_m + b_m
        # pipeline: when each stage's last backward pass of each local chunk ends
        c_fwd = self._p2p_times()
        programs = per_mb and p * m * v <= WALK_OPS and (zero3 or comm_bound)
        if programs:  # every pass walked beside the stage's communication stream, which carries over
            last, queue_end, busy_s = self._programs(parts, c_fwd)
            comm = [(busy_s[r] - m * (comp[r] + recomp[r])) / m for r in range(p)]
        elif p > 1 and p * m * v <= WALK_PLAIN_OPS:
            last = pipeline_walk(s.schedule, p, m, v, f, bk, c_fwd)
        else:
            last = self._pipeline_ends(f, bk, c_fwd)
        stage_end = []
        sync_exposed = [0.0] * p
        slowed = [0.0] * p
        for r in range(p):
            bwd, launches, b_plain = walked[r]  # local chunk 0 runs the iteration's last backward pass
            end = last[r][0]
            pass_start = end - b_plain
            if programs:
                wait = max(end, queue_end[r])
            elif dp_sync and not per_mb and launches:
                if s.overlap:
                    busy = 0.0  # the other local chunks' buckets, launched when their last pass ended
                    for t_end, secs in sorted((last[r][c], chunk_sync[c * p + r]) for c in range(1, v)):
                        busy = max(busy, t_end) + secs
                    wb, qb, sb = self._walk(bwd, r, launches, None, max(0.0, busy - pass_start))
                    end = pass_start + wb
                    wait = max(end, pass_start + qb)
                    slowed[r] = sb
                else:
                    wait = end + sum(chunk_sync[c * p + r] for c in range(v))
            else:
                wait = end
            sync_exposed[r] = wait - last[r][0]
            stage_end.append(wait)
        tied = self._tied_sync()
        if tied is not None:
            first, lst, secs = tied
            start = max(stage_end[first], stage_end[lst])
            for r in (first, lst):
                sync_exposed[r] += start + secs - stage_end[r]
                stage_end[r] = start + secs
        totals = []
        for r in range(p):
            chunks = [c * p + r for c in range(v)]
            params = sum(e.params for k in chunks for e in self.chunk_entries[k])
            # the simulator's optimizer step (`dlsim.plan.syncplan`): the stage's own parameters, 1/dp
            # of them under ZeRO; the copy of a tied embedding is not in it
            expert = expert_params_of([e for k in chunks for e in self.chunk_entries[k]])
            updated = updated_params(params - expert, expert, s.zero, s.dp, s.ep)
            opt = optimizer_timer(ev.device, ev.dtype, s.optimizer, ev.step_kernels(self.t, p))(updated).seconds
            end = stage_end[r] + opt
            if dp_sync and gathers_updated_params(s.zero):
                dp_ranks = self.dpg(r)
                gather = sum(self._param_gathers(k, dp_ranks, r) for k in chunks)
                end += gather
                sync_exposed[r] += gather
            totals.append((end, opt))
        T = max(e for e, _ in totals)
        # breakdown: means over stages, as the simulator reports
        cmp = sum(m * comp[r] + totals[r][1] for r in range(p)) / p
        rc = sum(m * recomp[r] for r in range(p)) / p
        ex = sum(m * comm[r] + sync_exposed[r] for r in range(p)) / p
        bubble = max(0.0, T - cmp - rc - ex)
        outside = []
        if p > 1 and p * m * v > WALK_PLAIN_OPS:
            outside.append("pipeline timed by its closed form (p·m·v beyond WALK_PLAIN_OPS)")
        if zero3 and not programs:
            outside.append("ZeRO-3 parameter gathers beside compute")
        if comm_bound and not programs:
            outside.append("ZeRO-2 gradient reductions longer than the backward pass")
        if s.schedule == "interleaved" and m == p:
            outside.append("interleaved schedule with num_microbatches = pp")
        if p > 1 and tp > 1 and self._p2p_shares_tp_ports():
            outside.append("pipeline transfers sharing the tensor-parallel link ports")
        if p > 1 and s.ep > 1 and self._p2p_shares_ep_ports():
            outside.append("pipeline transfers sharing the expert-parallel link ports")
        if s.ep > 1 and s.zero == 2 and s.dp > 1:
            outside.append("ZeRO-2 with expert parallelism (per-micro-batch reductions beside the all-to-alls)")
        if s.cp > 1 and s.dp == 1:
            outside.append("context parallelism with dp 1 (the gradient reduction over the cp ranks not timed)")
        if s.hybrid_shard:
            outside.append("hybrid sharding (collectives priced over the whole dp group)")
        if s.offload != "none":
            outside.append(f"offload {s.offload} (host copies not timed; activations kept on the device)")
        return Evaluation(s, T, cmp, rc, ex, bubble, self.mem, ev.capacity, tuple(outside))

    def _buckets_of(self, es):
        return self.ev._buckets(self.s, es)

    def _p2p_shares_ep_ports(self) -> bool:
        """Whether pipeline transfers use the link tier of the expert-parallel all-to-alls (the
        simulator serialises the two on the ports; not modelled here)."""
        lay = self.lay
        ep_tier = self.pricer.tier(self.ev.ep_ranks(self.s, 0))
        return any(self.pricer.tier([lay.rank(0, 0, r), lay.rank(0, 0, r + 1)]) == ep_tier for r in range(self.s.pp - 1))

    def _p2p_shares_tp_ports(self) -> bool:
        """Whether pipeline transfers use the link tier of the tensor-parallel collectives."""
        lay = self.lay
        tp_tier = self.pricer.tier(lay.tp_group(0, 0))
        return any(self.pricer.tier([lay.rank(0, 0, r), lay.rank(0, 0, r + 1)]) == tp_tier for r in range(self.s.pp - 1))

    def _p2p_times(self) -> list[float]:
        """Seconds of the transfer across each chunk boundary k → k+1."""
        s = self.s
        bounds = self.ev.boundaries(self.t, self.ranges)
        out = []
        for k, nbytes in enumerate(bounds):
            a = self.lay.rank(0, 0, k % s.pp)
            b = self.lay.rank(0, 0, (k + 1) % s.pp)
            out.append(self.pricer.p2p(nbytes, a, b).seconds)
        return out

    def _pipeline_ends(self, f: list[float], b: list[float], c: list[float]) -> list[list[float]]:
        """Closed forms (see the module docstring): ends[r][local chunk] of the last backward passes."""
        s = self.s
        p, m, v = s.pp, s.num_microbatches, s.virtual_stages
        F = [sum(f[c * p + r] for c in range(v)) for r in range(p)]
        B = [sum(b[c * p + r] for c in range(v)) for r in range(p)]
        if p == 1:
            return [[m * (F[0] + B[0]) - sum(b[1:c]) if c else m * (F[0] + B[0]) for c in range(v)]]
        total_c = sum(c)
        step = [F[r] + B[r] for r in range(p)]
        if s.schedule == "gpipe":
            end0 = sum(F) + (m - 1) * max(F) + sum(B) + (m - 1) * max(B) + 2 * total_c
        elif s.schedule == "interleaved":
            end0 = m * max(step) + (sum(step) - max(step)) / v + 2 * total_c / v
        else:
            end0 = sum(step) + 2 * total_c + (m - 1) * max(step)
        ends = []
        back = 0.0
        for r in range(p):  # stage r's last backward ends before stage 0's by the path back to it
            if r:
                back += B[r - 1] / v + (c[r - 1] if v == 1 else total_c / (p * v - 1))
            # the other local chunks' last passes: p backward passes of chunk 0 (and the later chunks) after them
            ends.append([end0 - back - (c_ * p * B[r] / v if c_ else 0.0) for c_ in range(v)])
        return ends

    def _tied_sync(self) -> tuple[int, int, float] | None:
        """(first stage, last stage, seconds) of the tied-embedding all-reduce, if there is one."""
        s = self.s
        if s.pp == 1:
            return None
        stage_of = {}
        for k, (a, b) in enumerate(self.ranges):
            for i in range(a, b):
                stage_of[self.t.entries[i].name] = k % s.pp
        by_name = {e.name: e for e in self.t.entries}
        for e in self.t.entries:
            tied = self.ev.model.layers[e.index].attrs.get("tied_to") if e.type == "linear" else None
            if tied and stage_of[tied] != stage_of[e.name]:
                first, last = stage_of[tied], stage_of[e.name]
                ranks = [self.lay.rank(0, 0, first), self.lay.rank(0, 0, last)]
                return first, last, self.pricer.collective("allreduce", by_name[tied].params * self.ev.gb,
                                                           ranks).seconds
        return None


def evaluate_all(evaluator: Evaluator, strategies: Sequence[Strategy]) -> list[Evaluation]:
    """`evaluator.evaluate` over `strategies` (in order)."""
    return [evaluator.evaluate(s) for s in strategies]


__all__ = ["Evaluation", "Evaluator", "StageMemory", "evaluate_all", "supports", "Estimate"]
