"""The analytic evaluator: iteration time and memory of strategies for one model on one cluster.
"""

from __future__ import annotations

from typing import Sequence

from dlsim.cost.pricing import KernelTimes
from dlsim.plan.comm import CommPricer, Layout
from dlsim.plan.expertparallel import (ep_group)
from dlsim.plan.blocks import recompute_layers
from dlsim.plan.fsdp import last_block
from dlsim.plan.steptime import elementwise_timer
from dlsim.plan.scenario import LayerTable, PricerFactory, ScenarioBuilder
from dlsim.plan.spatial import halo_time
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.spec.strategy import Strategy
from dlsim.units import DTYPE_BYTES
from dlsim.plan.evaluate.records import (replicas, WALK_OPS, WALK_PLAIN_OPS, Evaluation, StageMemory)
from dlsim.plan.evaluate.bounds import LowerBounds
from dlsim.plan.evaluate.memory import MemoryModel
from dlsim.plan.evaluate.timing import Timing


class Evaluator(LowerBounds, MemoryModel):
    """Analytic iteration time and memory of strategies for one model on one cluster.

    Its scenarios come from one `ScenarioBuilder` (the simulator's assembly, `dlsim.plan.scenario`),
    whose caches (layer tables, partitions, pricers) every evaluated strategy shares; `pricer(layout,
    collective)` gives the simulator's `CommPricer`. A builder may be passed instead of the model,
    cluster, dtype, pricer and tables it was made from (`Evaluator.of`)."""

    def __init__(self, model: Model, cluster: Cluster, dtype: str, pricer: PricerFactory,
                 tables: KernelTimes | None = None, *, builder: ScenarioBuilder | None = None):
        self.builder = builder or ScenarioBuilder(model, cluster, dtype, pricer, tables)
        b = self.builder
        self.fp8, self.model, self.cluster, self.dtype = b.fp8, b.model, b.cluster, b.dtype
        self.device, self.tables = b.device, b.tables
        self.capacity = self.device.memory_bytes - self.device.memory_reserved
        self.sigma = self.device.overlap_slowdown
        self._prices: dict[tuple, float] = {}
        self._groups: dict[tuple, tuple[str, int]] = {}
        self._cache: dict[tuple, object] = {}
        self.instance = recompute_layers(self.model)
        self.elementwise_time = elementwise_timer(self.device, self.dtype)
        self.last_block = last_block([layer.name for layer in self.model.layers])
        self.gb = DTYPE_BYTES[self.dtype]
        self._defaults: dict | None = None
        self._keep: list = []  # step lists whose ids key cached programs (`Timing._program`)
        self._memories: dict[Strategy, tuple[StageMemory, ...]] = {}  # `memory`, kept for `evaluate`
        self._last_base: tuple = (None, None)  # (strategy, its `strategy_base`)

    def holds_last_block(self, entries) -> bool:
        """Whether `entries` (a chunk) hold a layer of the model's last block (FSDP2 keeps its unit
        gathered, `dlsim.plan.fsdp.kept_units`)."""
        return self.last_block is not None and any(self.instance.get(e.name) == self.last_block for e in entries)

    @classmethod
    def of(cls, builder: ScenarioBuilder) -> "Evaluator":
        """The evaluator of the scenarios `builder` makes, one per builder (kept in `builder.kept`), so
        that a caller keeping a builder across predictions (a sweep's worker) keeps the evaluator's caches."""
        got = builder.kept.get(cls)
        if got is None:
            got = builder.kept[cls] = cls(builder.model, builder.cluster, builder.record_dtype, builder._pricer,
                                          builder.tables, builder=builder)
        return got

    # -- the scenario's pieces (`dlsim.plan.scenario`) ----------------------------------------
    def base_table(self, tp: int, sp: bool, mbs: int, fused: tuple[str, ...] = (), ep: int = 1,
                   ep_overlap: bool = False, cp: int = 1, microbatches: int = 1) -> LayerTable:
        """`ScenarioBuilder.base_table`: the layer table without gradient accumulation."""
        return self.builder.base_table(tp, sp, mbs, fused, ep, ep_overlap, cp, microbatches)

    def table(self, tp: int, sp: bool, mbs: int, fused: tuple[str, ...] = (), ep: int = 1,
              ep_overlap: bool = False, accumulation: float = 0.0, cp: int = 1, microbatches: int = 1) -> LayerTable:
        """`ScenarioBuilder.table`: the layer table with `accumulation` bytes per parameter."""
        return self.builder.table(tp, sp, mbs, fused, ep, ep_overlap, accumulation, cp, microbatches)

    def strategy_base(self, s: Strategy) -> LayerTable:
        """The layer table of `s` without its gradient accumulation (what memory and the partition use;
        the last strategy's kept: the search asks for its memory floor, memory and lower bound in turn)."""
        last = self._last_base
        if last[0] is s:
            return last[1]
        t = self.builder.strategy_base(s)
        self._last_base = (s, t)
        return t

    def strategy_table(self, s: Strategy) -> LayerTable:
        """The layer table `s` runs on (tp, sequence parallelism, micro-batch, fusions, ep, accumulation)."""
        return self.builder.strategy_table(s)

    def ranges(self, s: Strategy, t: LayerTable) -> list[tuple[int, int]]:
        """The scenario's stage partition of table `t` (`ScenarioBuilder.ranges`)."""
        return self.builder.ranges(s, t)

    def pricer(self, s: Strategy) -> CommPricer:
        """The scenario's communication pricer (`ScenarioBuilder.pricer`)."""
        return self.builder.pricer(s)

    def stage_groups(self, s: Strategy, stage: int) -> tuple[list[int], list[int], tuple]:
        """Replica 0's tensor-parallel group and tensor rank 0's data-parallel group on `stage`, and
        (tier, ranks per node) of each: kept per layout, which every candidate of it shares (the
        lists are read, never changed)."""
        key = ("stage groups", s.dp, s.tp, s.pp, s.domain, s.collective, stage)
        got = self._cache.get(key)
        if got is None:
            lay = Layout(s.dp, s.tp, s.pp, self.cluster.devices_per_node, s.domain)
            pricer = self.pricer(s)
            tp, dp = lay.tp_group(0, stage), lay.dp_group(0, stage)
            got = self._cache[key] = (tp, dp, (pricer.tier(tp), lay.ranks_per_node(tp), pricer.tier(dp),
                                               lay.ranks_per_node(dp)))
        return got  # type: ignore[return-value]

    def _price(self, pricer: CommPricer, s: Strategy, op: str, nbytes: float, ranks: list[int],
               messages: tuple = ()) -> float:
        if len(ranks) < 2:
            return 0.0
        gkey = (s.dp, s.tp, s.pp, s.domain, ranks[0], len(ranks), ranks[-1])
        group = self._groups.get(gkey)
        if group is None:
            lay = Layout(s.dp, s.tp, s.pp, self.cluster.devices_per_node, s.domain)
            group = self._groups[gkey] = (pricer.tier(ranks), lay.ranks_per_node(ranks))
        key = (s.collective, op, nbytes, len(ranks)) + group + ((messages, ranks[0]) if messages else ())
        v = self._prices.get(key)
        if v is None and op == "halo":  # a spatial halo exchange: the busiest rank's ports (dlsim.plan.spatial)
            v = self._prices[key] = halo_time(messages, ranks, pricer.p2p).seconds
        elif v is None and op == "sendrecv":  # a context-parallel ring step: the slowest hop (dlsim.plan.iteration)
            v = self._prices[key] = max(pricer.p2p(nbytes, a, b).seconds for a, b in zip(ranks, ranks[1:] + ranks[:1]))
        elif v is None:
            v = self._prices[key] = pricer.collective(op, nbytes, ranks).seconds
        return v

    def ep_ranks(self, s: Strategy, stage: int) -> list[int]:
        """The expert-parallel group of data-parallel rank 0 on `stage`."""
        return ep_group(Layout(s.dp, s.tp, s.pp, self.cluster.devices_per_node, s.domain), s.ep, 0, 0, stage)

    # -- time ----------------------------------------------------------------------------------
    def maybe_approximate(self, s: Strategy) -> bool:
        """Whether `evaluate(s)` may come flagged `Evaluation.approximate`, known before timing `s` (a
        superset, for the search's pruning): a field other than those of the validated space off its
        default, a pipeline timed by its closed form, ZeRO-2/3 not walked pass by pass, interleaved
        with m = pp, pipeline transfers on the tensor-parallel link tier, a pipeline beside parameter
        gathers."""
        if self._off_default(s) or self.shared_network(s):
            return True
        p, m, v = s.pp, s.num_microbatches, s.virtual_stages
        if (p > 1 and p * m * v > WALK_PLAIN_OPS) or (p * m * v > WALK_OPS and s.zero >= 2 and replicas(s) > 1):
            return True
        if s.schedule == "interleaved" and m == p:
            return True
        if p > 1 and replicas(s) > 1 and (s.zero == 3 or s.param_gather_overlap):
            return True  # pipeline transfers may share the data-parallel ports with parameter gathers
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

    def shared_network(self, s: Strategy) -> bool:
        """Whether `s` spans nodes of a network whose links its groups share (`dlsim.plan.contention`):
        the simulation prices every group where it sits, the evaluator each group shape once."""
        inter = self.cluster.inter
        return inter is not None and inter.fabric.shared and s.devices > self.cluster.devices_per_node

    def evaluate(self, s: Strategy, memory: tuple[StageMemory, ...] | None = None) -> Evaluation:
        """Iteration time and memory of `s` (see `dlsim.plan.evaluate`)."""
        t = self.strategy_table(s)
        ranges = self.ranges(s, t)
        memory = memory or self._memories.get(s) or self._memory(s, t, ranges)
        return Timing(self, s, t, ranges, memory).run()


def evaluate_all(evaluator: Evaluator, strategies: Sequence[Strategy]) -> list[Evaluation]:
    """`evaluator.evaluate` over `strategies` (in order)."""
    return [evaluator.evaluate(s) for s in strategies]


