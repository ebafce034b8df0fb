"""Peak memory per pipeline stage of a strategy, as the simulator's memory tracker counts it:
model states (`dlsim.plan.zero`), activations of the micro-batches in flight
(`dlsim.plan.recompute`, the schedule's op order), ZeRO-3's gathered units, workspace.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from itertools import accumulate
from typing import Sequence

from dlsim.plan.comm import Layout
from dlsim.plan.fsdp import fsdp_block_units, kept_units, last_block
from dlsim.plan.dataparallel import buffer_element_bytes
from dlsim.plan.gradbuckets import gradient_buckets
from dlsim.plan.expertparallel import (expert_params_of,
                                      expert_states)
from dlsim.plan.layertable import LayerEntry, crossing_bytes, cut_positions
from dlsim.plan.offload import OFFLOAD_SLICES, offloads_optimizer
from dlsim.plan.pipeline import peak_inflight
from dlsim.plan.oprecompute import alternate_layers
from dlsim.plan.recompute import (EXACT_BYTES, ChunkActivations, full_recompute_memory, op_recompute_memory,
                                  selective_recompute_memory)
from dlsim.plan.scenario import LayerTable
from dlsim.plan.zero import model_state_bytes
from dlsim.spec.records import made
from dlsim.spec.strategy import Strategy
from dlsim.plan.evaluate.records import (PRICED_FIELDS, VALIDATED_FIELDS, WALK_MEMORY_OPS, StageMemory,
                                         replicas)
from dlsim.plan.evaluate.pipeline import activation_peak, cached_stage_steps


KEPT_MEMORIES = 1 << 16
"""Strategies whose memory `MemoryModel.memory` keeps for their evaluation (a search space's worth)."""


class MemoryModel:
    """The evaluator's memory per stage (a part of `Evaluator`; its caches are the evaluator's)."""

    def memory(self, s: Strategy) -> tuple[StageMemory, ...]:
        """Peak memory of each stage's devices (as the simulator's memory tracker counts it); kept for
        `evaluate`, which sizes the same strategy after the search has (the table with gradient
        accumulation holds the same layers, only their backward times differ)."""
        got = self._memories.get(s)
        if got is None:
            t = self.strategy_base(s)
            got = self._memory(s, t, self.ranges(s, t))
            if len(self._memories) >= KEPT_MEMORIES:
                self._memories.clear()
            self._memories[s] = got
        return got

    def _off_default(self, s: Strategy) -> bool:
        """Whether a field outside `VALIDATED_FIELDS` and `PRICED_FIELDS` is off its default."""
        if self._defaults is None:
            default = Strategy()
            self._defaults = {k: getattr(default, k) for k in Strategy.__dataclass_fields__
                              if k not in VALIDATED_FIELDS and k not in PRICED_FIELDS}
        return any(getattr(s, k) != v for k, v in self._defaults.items())

    def memory_floor(self, s: Strategy) -> float:
        """A lower bound of max(x.total for x in memory(s)) without partitioning: the model states
        (`model_state_bytes`, linear in the parameters) of a stage holding the mean share 1/pp of the
        parameters, which the stage holding the most reaches at least. 0 for a strategy outside the
        validated fields (sharding, offload and expert placement change what a device holds)."""
        if self._off_default(s):
            return 0.0
        t = self.strategy_base(s)
        states = model_state_bytes(self._params(t, 0, len(t.entries)) / s.pp, self.dtype, s.optimizer, s.zero, replicas(s),
                                   buffer_element_bytes(s, self.dtype))
        return (states["weights"] + states["gradients"] + states["optimizer"]) * (1 - 1e-9)

    def _chunk_acts(self, s: Strategy, t: LayerTable, ranges) -> list[tuple[float, float, float]]:
        key = ("acts", t.key, tuple(ranges), s.recompute, s.recompute_layers)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = self._chunk_acts_uncached(s, t, ranges)
        return got  # type: ignore[return-value]

    def boundaries(self, t: LayerTable, ranges) -> list[float]:
        """`boundary_bytes` of the table cut at `ranges` (cached, and each cut's `crossing_bytes` by
        the table and the position: partitions into different chunk counts share their cuts' bytes)."""
        key = ("bounds", t.key, tuple(ranges))
        got = self._cache.get(key)
        if got is None:
            crossing = self._cache.setdefault(("crossing", t.key), {})
            got = []
            for a in cut_positions(self.model, t.entries, ranges):
                x = crossing.get(a)  # type: ignore[union-attr]
                if x is None:
                    x = crossing[a] = crossing_bytes(self.model, t.entries, a)  # type: ignore[index]
                got.append(x)
            self._cache[key] = got
        return got  # type: ignore[return-value]

    def tied(self, t: LayerTable, ranges, pp: int) -> dict[int, int]:
        """Per stage, parameters of weights tied to a layer on another stage (Megatron's copy of the
        word embedding on the last stage; cached)."""
        key = ("tied", t.key, tuple(ranges), pp)
        got = self._cache.get(key)
        if got is None:
            out: dict[int, int] = {}
            for stage, tied_stage, params in self._ties_across(t, ranges, pp):
                out[stage] = out.get(stage, 0) + params
            got = self._cache[key] = out
        return got  # type: ignore[return-value]

    def _ties_across(self, t: LayerTable, ranges, pp: int) -> list[tuple[int, int, int]]:
        """(stage of the layer, stage of the weight it is tied to, that weight's parameters) of each
        linear layer of table `t` tied to a weight on another stage, in layer order: the table's ties
        (found once per table) placed by the chunks' first entries."""
        key = ("ties", t.key)
        ties = self._cache.get(key)
        if ties is None:
            position = {e.name: i for i, e in enumerate(t.entries)}
            ties = self._cache[key] = [
                (i, position[tied], t.entries[position[tied]].params) for i, e in enumerate(t.entries)
                if e.type == "linear" and (tied := self.model.layers[e.index].attrs.get("tied_to"))]
        if not ties:
            return []
        starts = [a for a, _ in ranges]
        out = []
        for i, j, params in ties:  # type: ignore[union-attr]
            stage, tied_stage = (bisect_right(starts, i) - 1) % pp, (bisect_right(starts, j) - 1) % pp
            if stage != tied_stage:
                out.append((stage, tied_stage, params))
        return out

    def _chunk_acts_uncached(self, s: Strategy, t: LayerTable, ranges) -> list[tuple[float, float, float]]:
        checkpoints = s.recompute in ("full", "selective_layer", "selective_op")
        bounds = self.boundaries(t, ranges) if checkpoints else []
        fast = self._table_acts(t)
        if fast.exact and (s.recompute in ("none", "selective") or (
                s.recompute == "full" and s.recompute_layers == 1 and fast.contiguous
                and all(x.is_integer() and 0 <= x < EXACT_BYTES for x in bounds))):
            if s.recompute == "full":
                return [fast.full(a, b, bounds[k - 1] if k > 0 else 0.0) for k, (a, b) in enumerate(ranges)]
            if s.recompute == "selective":
                return [fast.selective(a, b) for a, b in ranges]
            return [fast.plain(a, b) for a, b in ranges]
        out = []
        for k, (a, b) in enumerate(ranges):
            es = t.entries[a:b]
            incoming = bounds[k - 1] if checkpoints and k > 0 else 0.0
            if s.recompute == "full":
                out.append(full_recompute_memory(self.model, es, s.recompute_layers, incoming, self.instance))
            elif s.recompute == "selective_layer":
                out.append(full_recompute_memory(self.model, es, 1, incoming, alternate_layers(self.model)))
            elif s.recompute == "selective_op":
                out.append(op_recompute_memory(self.model, es, incoming, self.instance))
            elif s.recompute == "selective" and any(e.core.seconds > 0 for e in es):
                out.append(selective_recompute_memory(es))
            else:
                out.append((sum(e.saved_bytes for e in es), 0.0, 0.0))
        return out

    def _table_acts(self, t: LayerTable) -> ChunkActivations:
        """The activation bytes of table `t`'s chunks (`ChunkActivations`, kept with the table: layer
        tables are shared by the builders of one model, `LayerTable.facts`)."""
        got = t.facts.get("chunk activations")
        if got is None:
            got = t.facts["chunk activations"] = ChunkActivations(self.model, t.entries, self.instance)
        return got

    def stages(self, t: LayerTable, ranges, pp: int, v: int) -> list[tuple[int, float, int, int]]:
        """Per stage: its parameters, largest workspace, routed-expert parameters and tied copies'
        parameters (cached)."""
        skey = ("stages", t.key, tuple(ranges), pp, v)
        stages = self._cache.get(skey)
        if stages is None:
            tied = self.tied(t, ranges, pp)
            prefix = self._param_prefix(t)
            if prefix is not None:  # integer parameters, no workspace, no experts: sums of the prefix
                return self._cache.setdefault(skey, [  # type: ignore[return-value]
                    (sum(prefix[ranges[c * pp + r][1]] - prefix[ranges[c * pp + r][0]] for c in range(v)), 0.0, 0,
                     tied.get(r, 0)) for r in range(pp)])
            stages = []
            for r in range(pp):
                es = [e for c in range(v) for e in t.entries[slice(*ranges[c * pp + r])]]
                stages.append((sum(e.params for e in es), max((e.workspace for e in es), default=0.0),
                               expert_params_of(es), tied.get(r, 0)))
            self._cache[skey] = stages
        return stages  # type: ignore[return-value]

    def _param_prefix(self, t: LayerTable) -> list[int] | None:
        """Prefix sums of table `t`'s parameters (cached), where `stages` may read its stages' sums
        from them, exactly: every entry's parameters an int, its workspace +0.0 and no routed experts
        (a stage's largest workspace is then 0.0 and its experts' parameters 0); else None."""
        key = ("param prefix", t.key)
        if key not in self._cache:
            es = t.entries
            plain = all(type(e.params) is int and type(e.workspace) is float and e.workspace == 0.0
                        and math.copysign(1.0, e.workspace) > 0 and e.experts is None for e in es)
            self._cache[key] = list(accumulate((e.params for e in es), initial=0)) if plain else None
        return self._cache[key]  # type: ignore[return-value]

    def tied_pair(self, t: LayerTable, ranges, pp: int) -> tuple[int, int, int] | None:
        """(stage of a tied weight, stage of its tied copy, parameters) of the first weight tied across
        stages (Megatron's word embedding and output layer), or None (cached)."""
        key = ("tied pair", t.key, tuple(ranges), pp)
        if key not in self._cache:
            ties = self._ties_across(t, ranges, pp)
            self._cache[key] = (ties[0][1], ties[0][0], ties[0][2]) if ties else None
        return self._cache[key]  # type: ignore[return-value]

    def _memory(self, s: Strategy, t: LayerTable, ranges) -> tuple[StageMemory, ...]:
        held = self._held(s, t, ranges)
        acts = self._stage_activations(s, t, ranges)
        # (a search makes one record per stage of every candidate: `made`, without the constructor)
        return tuple(made(StageMemory, weights=w, gradients=g, optimizer=o, activations=a, transient=tr, workspace=ws)
                     for (w, g, o, tr, ws, _), a in zip(held, acts))

    def peak_memory(self, s: Strategy) -> float:
        """max(x.total for x in memory(s)), the search's question, from the same cached per-stage
        bytes, without the `StageMemory` records of a strategy that is mostly never evaluated."""
        got = self._memories.get(s)
        if got is not None:
            return max(x.total for x in got)
        t = self.strategy_base(s)
        ranges = self.ranges(s, t)
        # (weights + gradients + optimizer) + activations + transient + workspace, as `StageMemory.total`
        return max(((states + a) + tr) + ws for (_, _, _, tr, ws, states), a in
                   zip(self._held(s, t, ranges), self._stage_activations(s, t, ranges)))

    def _held(self, s: Strategy, t: LayerTable, ranges) -> list[tuple[float, float, float, float, float, float]]:
        """Per stage what its devices hold besides activations: (weights, gradients, optimizer states,
        ZeRO-3's gathered units, workspace, weights + gradients + optimizer), kept by what it reads:
        the table and its ranges, the sharding and optimizer, and ZeRO-3's units."""
        zero3 = s.zero == 3 and replicas(s) > 1
        key = ("held", t.key, tuple(ranges), s.pp, s.virtual_stages, zero3, offloads_optimizer(s.offload),
               (s.dp, s.tp, s.domain) if s.hybrid_shard else None, s.dp_cp, s.optimizer, s.zero,
               buffer_element_bytes(s, self.dtype), s.ep, fsdp_block_units(s), s.fsdp_units,
               (replicas(s), s.bucket_size, s.first_bucket_size, s.grad_reduce_dtype, s.zero_grad_reduce)
               if zero3 else ())
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = self._held_uncached(s, t, ranges, zero3)
        return got  # type: ignore[return-value]

    def _held_uncached(self, s: Strategy, t: LayerTable, ranges,
                       zero3: bool) -> list[tuple[float, float, float, float, float, float]]:
        stages = self.stages(t, ranges, s.pp, s.virtual_stages)
        offload = offloads_optimizer(s.offload)
        lay = Layout(s.dp, s.tp, s.pp, self.cluster.devices_per_node, s.domain) if s.hybrid_shard else None
        grad = buffer_element_bytes(s, self.dtype)
        block_units = fsdp_block_units(s)
        # what a stage holds besides its activations depends on its parameters and, under ZeRO-3, its
        # chunks' units: stages alike (a deep pipeline's middle ones) are counted once
        held: dict[tuple, tuple[float, float, float, float, float, float]] = {}
        contents = self._chunk_contents(s, t, ranges) if zero3 else None
        out = []
        pp, chunks = s.pp, range(0)
        for r in range(pp):
            stage = stages[r]  # type: ignore[index]
            if contents is not None:  # the stage's chunks c * pp + r, c < virtual_stages
                chunks = range(r, pp * s.virtual_stages, pp)
            hkey = (stage, tuple([contents[k] for k in chunks]) if contents is not None else (),
                    r if lay is not None else 0)
            got = held.get(hkey)
            if got is None:
                params, workspace, expert, tied_params = stage
                shard = len(lay.shard_group(0, 0, r)) if lay is not None else s.dp_cp
                states = self._states(params, s.optimizer, s.zero, shard, grad)
                if expert:
                    states = expert_states(states, expert, self.dtype, s.optimizer, s.zero, shard, s.ep, grad)
                local = self._states(tied_params, s.optimizer, 0, 1, grad)
                weights, gradients = states["weights"] + local["weights"], states["gradients"] + local["gradients"]
                optimizer = states["optimizer"] + local["optimizer"]
                if offload:  # in host memory, two of its streamed slices on the device
                    optimizer = 2 * optimizer / OFFLOAD_SLICES
                transient = 0.0
                if zero3:  # the unit being used and the one prefetched, (dp-1)/dp of each; FSDP2's units kept
                    # gathered from forward to backward (`dlsim.plan.fsdp.kept_units`) besides them
                    units, kept_bytes = [], 0.0
                    for k in chunks:
                        kept = self._kept(s, t, *ranges[k]) if block_units else frozenset()
                        for j, n in enumerate(self._bucket_bytes(s, t, *ranges[k], gathered=True)):
                            if j in kept:
                                kept_bytes += n
                            else:
                                units.append(n)
                    units.sort(reverse=True)
                    transient = (sum(units[:2]) + kept_bytes) * (replicas(s) - 1) / replicas(s)
                got = held[hkey] = (weights, gradients, optimizer, transient, workspace,
                                    weights + gradients + optimizer)
            out.append(got)
        return out

    def _stage_activations(self, s: Strategy, t: LayerTable, ranges) -> list[float]:
        """Per stage the peak bytes of its activations (kept per table, ranges, recomputation and schedule)."""
        key = ("stage acts", t.key, tuple(ranges), s.recompute, s.recompute_layers, s.schedule, s.pp,
               s.num_microbatches, s.virtual_stages)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = self._stage_activations_uncached(s, t, ranges)
        return got  # type: ignore[return-value]

    def _stage_activations_uncached(self, s: Strategy, t: LayerTable, ranges) -> list[float]:
        acts = self._chunk_acts(s, t, ranges)
        if s.virtual_stages == 1:  # n in flight, the extra of one pass beside them
            return [peak_inflight(s.schedule, s.pp, s.num_microbatches, 1, r) * kept + max(fwd_extra, re_extra)
                    for r, (kept, fwd_extra, re_extra) in enumerate(acts)]
        out = []
        for r in range(s.pp):
            chunks = [c * s.pp + r for c in range(s.virtual_stages)]
            if s.num_microbatches * s.virtual_stages <= WALK_MEMORY_OPS:
                akey = ("peak", s.schedule, s.pp, s.num_microbatches, s.virtual_stages, r,
                        tuple(acts[k] for k in chunks))
                activations = self._cache.get(akey)  # type: ignore[assignment]
                if activations is None:
                    activations = self._cache[akey] = activation_peak(
                        cached_stage_steps(s.schedule, s.pp, s.num_microbatches, s.virtual_stages, r), [acts[k] for k in chunks])
            else:  # the schedule's in-flight count (`peak_inflight`) of the largest chunk
                n = peak_inflight(s.schedule, s.pp, s.num_microbatches, s.virtual_stages, r)
                activations = n * max(acts[k][0] for k in chunks) + max(max(acts[k][1], acts[k][2]) for k in chunks)
            out.append(activations)
        return out

    def _states(self, params: float, optimizer: str, zero: int, shard: int, grad: float) -> dict[str, float]:
        """`model_state_bytes` (cached: the stages of a pipeline mostly hold the same parameters)."""
        key = ("states", params, optimizer, zero, shard, grad)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = model_state_bytes(params, self.dtype, optimizer, zero, shard, grad)
        return got  # type: ignore[return-value]

    def _bucket_chunk(self, s: Strategy, t: LayerTable, a: int, b: int) -> tuple:
        """What the gradient buckets of entries a..b of table `t` depend on among the entries: their
        content (`LayerTable.signature` of the base table, named once: the chunks of identical
        layers, such as a deep pipeline's middle stages, share their buckets' bytes), or the entries
        themselves where buckets follow layer names or tensor-parallel degrees (FSDP2's block units,
        expert parallelism)."""
        if s.ep > 1 or fsdp_block_units(s):
            return (t.key, a, b)
        key = ("content", t.key, a, b)
        got = self._cache.get(key)
        if got is None:
            names = self._cache.setdefault(("content names",), {})
            sig = (t.base or t).signature(a, b, self.instance)
            got = self._cache[key] = (names.setdefault(sig, len(names)),)  # type: ignore[union-attr]
        return got  # type: ignore[return-value]

    def _chunk_contents(self, s: Strategy, t: LayerTable, ranges) -> list[tuple]:
        """`_bucket_chunk` of each chunk of `ranges` (cached by the table and the ranges)."""
        key = ("chunk contents", t.key, tuple(ranges), s.ep > 1 or fsdp_block_units(s))
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = [self._bucket_chunk(s, t, a, b) for a, b in ranges]
        return got  # type: ignore[return-value]

    def _bucket_bytes(self, s: Strategy, t: LayerTable, a: int, b: int, gathered: bool = False) -> list[float]:
        """Bytes of the gradient buckets of entries a..b, or with `gathered` of their parameters (the
        ZeRO-3 units' gathers; cached by the chunk's content, `_bucket_chunk`)."""
        key = ("bucket bytes", self._bucket_chunk(s, t, a, b), replicas(s) > 1 or bool(s.zero), s.bucket_size,
               s.first_bucket_size, s.grad_reduce_dtype, s.zero_grad_reduce, gathered, fsdp_block_units(s))
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = [bu.gather_nbytes if gathered else bu.nbytes
                                      for bu in self._buckets(s, t.entries[a:b])]
        return got  # type: ignore[return-value]

    def _kept(self, s: Strategy, t: LayerTable, a: int, b: int) -> frozenset[int]:
        """FSDP2's units of entries a..b kept gathered from forward to backward (cached)."""
        key = ("kept units", t.key, a, b, s.zero, s.fsdp_units)
        got = self._cache.get(key)
        if got is None:
            es = t.entries[a:b]
            got = self._cache[key] = kept_units(self._buckets(s, es), {e.index: e.name for e in es},
                                                last_block([layer.name for layer in self.model.layers]))
        return got  # type: ignore[return-value]

    def _buckets(self, s: Strategy, es: Sequence[LayerEntry]):
        if not (replicas(s) > 1 or s.zero):
            return []
        return gradient_buckets(es, s, self.dtype, lambda e: e.params > 0)
