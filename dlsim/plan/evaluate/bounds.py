"""Lower bounds of a strategy's iteration time, O(chunks) from cached prefix sums, for the
strategy search's pruning (`dlsim.plan.search`); see `LowerBounds.lower_bound`.
"""

from __future__ import annotations


from dlsim.cost.memory import grad_accumulation_bytes
from dlsim.cost.overlap import overlap_cost
from dlsim.plan.comm import CommPricer, Layout
from dlsim.plan.compression import plan_sync
from dlsim.plan.fsdp import fsdp_block_units
from dlsim.plan.dataparallel import reduce_element_bytes
from dlsim.plan.layertable import LayerEntry, grad_accumulation_times
from dlsim.plan.oprecompute import alternate_layers
from dlsim.plan.scenario import LayerTable
from dlsim.plan.templates import backward_steps, forward_steps
from dlsim.plan.zero import gathers_updated_params, gradient_collective, optimizer_share
from dlsim.spec.strategy import Strategy
from dlsim.plan.evaluate.records import (WALK_OPS, WALK_PLAIN_OPS, replicas)


class LowerBounds:
    """Lower bounds of the evaluator's iteration time for the search's pruning, and the cached
    per-chunk sums they are made of (a part of `Evaluator`)."""

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

    def _pass_prefix(self, s: Strategy, t: LayerTable,
                     passes: tuple[list[float], list[float], list[float]]) -> tuple[list[float], ...]:
        """Prefix sums over the entries of what each adds to a micro-batch's forward pass, its
        recomputation and its backward pass, each run alone: its kernels, its tensor-parallel
        collectives, and kernels beside an asynchronous collective as `overlap_cost` prices them
        (`Timing.steps_time` of `forward_steps`, the recomputation's steps and `backward_steps`,
        summed layer by layer). The forward and backward sums and each entry's forward (`_passes`,
        which do not depend on the recomputation) are given."""
        fw, bw, forwards = passes
        rc = [0.0]
        alternate = alternate_layers(self.model) if s.recompute == "selective_layer" else {}
        for e, f in zip(t.entries, forwards):
            x = 0.0
            if s.recompute == "full" and self.instance[e.name]:
                x = f
            elif s.recompute == "selective_layer" and alternate[e.name]:
                x = f
            elif s.recompute == "selective" and e.core.seconds > 0:
                x = e.core.seconds
            elif s.recompute == "selective_op" and self.instance[e.name]:
                x = e.op_core.seconds
            rc.append(rc[-1] + x)
        return fw, rc, bw

    def _passes(self, s: Strategy, t: LayerTable, pricer: CommPricer,
                ranks: list[int]) -> tuple[list[float], list[float], list[float]]:
        """The forward and backward prefix sums of `_pass_prefix` and each entry's forward seconds."""
        def price(c) -> float:
            return self._price(pricer, s, c.op, c.nbytes, ranks)

        fw, bw, forwards = [0.0], [0.0], []
        for e in t.entries:
            chunked = self._chunked_alone(s, e, price) if e.tp_overlap else None
            f = chunked[0] if chunked else e.forward.seconds + sum(price(c) for c in e.tp.before + e.tp.after_fwd)
            moe_f, moe_b = self._experts_comm(s, e, pricer, ranks)
            f += moe_f
            beside = {c.overlap: c for c in e.tp.before_bwd + e.tp.after_bwd if s.tp_async_backward and c.overlap}
            y = sum(price(c) for c in e.tp.before_bwd + e.tp.after_bwd if c not in beside.values())
            if chunked:
                y = chunked[1]
            elif beside:
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
            bw.append(bw[-1] + y)
            forwards.append(f)
        return fw, bw, forwards

    def _chunked_alone(self, s: Strategy, e: LayerEntry, price) -> tuple[float, float]:
        """Forward and backward of a layer whose GEMMs run chunked beside its collectives
        (`LayerEntry.tp_overlap`), each run alone: its steps (`forward_steps`, `backward_steps`) as
        `Timing.steps_time` prices them, a context-parallel ring's steps by their kernels only."""
        out = []
        for steps in (forward_steps([e], s.tp), backward_steps([e], s.tp, overlap=s.tp_async_backward)):
            total = 0.0
            for st in steps:
                if st.kind == "compute" or st.group != "tp":
                    total += st.duration if st.kind != "collective" else 0.0
                elif st.kind == "collective":
                    total += price(st.collective)
                else:
                    total += st.duration + sum(overlap_cost(st.duration, price(st.collective), st.sigma(self.sigma)))
            out.append(total)
        return out[0], out[1]

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
        reduce-scatter the previous unit launched when it finished (`Timing.walk_steps`): between
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
        lay = Layout(s.dp, s.tp, s.pp, self.cluster.devices_per_node, s.domain)
        pricer = self.pricer(s)
        zero3 = s.zero == 3 and replicas(s) > 1
        # each layer's accumulation kernel adds its seconds to the backward pass; beside an
        # asynchronous collective it may hide some of it, so it is left out there
        acc = None if s.tp_async_backward else \
            self._accumulation_prefix(t, grad_accumulation_bytes(s.grad_accumulation, self.dtype, m))
        per_stage = self._stage_prefixes(s, t, lay, pricer)
        bwd_chain = zero3 and s.ep == 1 and s.compression.kind == "none"
        units = self._zero3_chunks(s, t, ranges, bwd_chain) if zero3 else []
        work = [0.0] * p
        passes = []
        for k, (a, b) in enumerate(ranges):
            fw, rc, bw = per_stage[k % p]
            f, x, y = fw[b] - fw[a], rc[b] - rc[a], bw[b] - bw[a]
            if acc is not None:
                y += acc[b] - acc[a]
            if zero3:
                g, g_b, chain, _ = units[k]
                f = max(f, g)
                if bwd_chain:
                    y += chain
                y = max(y, g_b)
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
        step = self.builder.optimizer_timer(s, t)
        share = optimizer_share(s.zero, replicas(s))
        bound += step(sum(self._params(t, *ranges[k]) for k in chunks0) * share).seconds
        if zero3 and p * m * v <= WALK_OPS and s.ep == 1 and s.compression.kind == "none":
            for r in range(p):
                chunks = range(r, len(ranges), p)
                stream = sum(units[k][3] for k in chunks)
                bound = max(bound, m * stream + step(sum(self._params(t, *ranges[k]) for k in chunks) * share).seconds)
        if replicas(s) > 1 and gathers_updated_params(s.zero) and s.ep == 1:  # with ep: dense and expert gathers
            dp0 = lay.dp_group(0, 0)
            bound += sum(self._price(pricer, s, "allgather", self._params(t, *ranges[k]) * self.gb, dp0)
                         for k in chunks0)
        return bound * (1 - 1e-9)

    def _stage_prefixes(self, s: Strategy, t: LayerTable, lay: Layout, pricer: CommPricer) -> list[tuple[list[float], ...]]:
        """`_pass_prefix` of each stage's tensor-parallel group (stages whose groups sit alike share
        one), kept per table and layout: every candidate of them asks."""
        lkey = ("bound stages", id(t), s.tp, s.collective, s.tp_async_backward, s.recompute, s.dp, s.pp, s.domain)
        got = self._cache.get(lkey)
        if got is None:
            got = []
            for r in range(s.pp):
                ranks = lay.tp_group(0, r)
                where = (id(t), s.tp, s.collective, s.tp_async_backward,
                         pricer.tier(ranks) if s.tp > 1 else None, lay.ranks_per_node(ranks) if s.tp > 1 else None)
                key = ("bound", s.recompute) + where
                prefix = self._cache.get(key)
                if prefix is None:
                    passes = self._cache.get(("bound passes",) + where)
                    if passes is None:
                        passes = self._cache[("bound passes",) + where] = self._passes(s, t, pricer, ranks)
                    prefix = self._cache[key] = self._pass_prefix(s, t, passes)  # type: ignore[arg-type]
                got.append(prefix)
            self._cache[lkey] = got
        return got  # type: ignore[return-value]

    def _zero3_chunks(self, s: Strategy, t: LayerTable, ranges, chain: bool) -> list[tuple[float, float, float, float]]:
        """`_zero3_chunk` of each chunk of `ranges` over its stage's data-parallel group, kept by the
        table, the ranges and what `_zero3_chunk` keys by besides the chunk (one lookup a candidate)."""
        key = ("zero3 chunks", t.key, tuple(ranges), s.fsdp_units if fsdp_block_units(s) else None, s.ep > 1,
               replicas(s), s.zero, s.compression, s.bucket_size, s.first_bucket_size, s.grad_reduce_dtype,
               s.zero_grad_reduce, s.collective, s.dp, s.tp, s.pp, s.domain, chain)
        got = self._cache.get(key)
        if got is None:
            p = s.pp
            dp_groups = [self.stage_groups(s, r)[1] for r in range(p)]
            got = self._cache[key] = [self._zero3_chunk(s, t, a, b, dp_groups[k % p], chain)
                                      for k, (a, b) in enumerate(ranges)]
        return got  # type: ignore[return-value]

    def _zero3_chunk(self, s: Strategy, t: LayerTable, a: int, b: int, dp_ranks: list[int],
                     chain: bool) -> tuple[float, float, float, float]:
        """(`_gathers`, with `chain` `_unit_chain` else 0, and what one micro-batch's passes put on the
        communication stream: forward and backward gathers and reductions) of entries a..b, kept by
        what `_unit_prices` keys by and the units FSDP2 keeps gathered."""
        key = ("zero3 chunk", self._bucket_chunk(s, t, a, b) if not fsdp_block_units(s) else (t.key, a, b, s.fsdp_units),
               replicas(s), s.zero, s.compression, s.bucket_size, s.first_bucket_size, s.grad_reduce_dtype,
               s.zero_grad_reduce, s.collective, self._tier(self.pricer(s), dp_ranks), len(dp_ranks), s.tp, s.domain,
               chain)
        got = self._cache.get(key)
        if got is None:
            g, g_b = self._gathers(s, t, a, b, dp_ranks)
            gathers, reductions = self._unit_prices(s, t, a, b, dp_ranks)
            stream = sum(gathers) + sum(self._backward_gathers(s, t, a, b, gathers)) + sum(reductions)
            got = self._cache[key] = (g, g_b, self._unit_chain(s, t, a, b, dp_ranks) if chain else 0.0, stream)
        return got  # type: ignore[return-value]

    def _tier(self, pricer: CommPricer, ranks: list[int]) -> object:
        """`pricer.tier(ranks)`, cached by the group's first rank, size and last rank (a layout's
        groups are arithmetic progressions)."""
        key = ("tier", id(pricer), ranks[0], len(ranks), ranks[-1])
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = pricer.tier(ranks)
        return got

    def _accumulation_prefix(self, t: LayerTable, accumulation: float) -> list[float] | None:
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

    def _params(self, t: LayerTable, a: int, b: int) -> int:
        pre = t.prefix.get("params")
        if pre is None:
            pre = [0]
            for e in t.entries:
                pre.append(pre[-1] + e.params)
            t.prefix["params"] = pre  # type: ignore[assignment]
        return pre[b] - pre[a]  # type: ignore[return-value]

    def _unit_prices(self, s: Strategy, t: LayerTable, a: int, b: int,
                     dp_ranks: list[int]) -> tuple[list[float], list[float]]:
        """Per gradient bucket (ZeRO-3 parameter unit) of entries a..b over `dp_ranks`: the seconds of
        its all-gather and of its reduction (one backward pass's, as `Timing._bucket_launches` prices
        them); cached."""
        pricer = self.pricer(s)
        key = ("unit prices", self._bucket_chunk(s, t, a, b), replicas(s), s.zero, s.compression, s.bucket_size,
               s.first_bucket_size, s.grad_reduce_dtype, s.zero_grad_reduce, s.collective, self._tier(pricer, dp_ranks),
               len(dp_ranks), s.tp, s.domain)  # with the group's size, what places it on the nodes
        got = self._cache.get(key)
        if got is None:
            base = gradient_collective(s)
            nbytes = self._bucket_bytes(s, t, a, b)
            element = reduce_element_bytes(s, self.dtype)
            got = self._cache[key] = (
                [self._price(pricer, s, "allgather", n, dp_ranks) for n in self._bucket_bytes(s, t, a, b, True)],
                [sum(self._price(pricer, s, op, m, dp_ranks)
                     for op, m in plan_sync(s.compression, n, element, replicas(s), base).collectives) for n in nbytes])
        return got  # type: ignore[return-value]

    def _gathers(self, s: Strategy, t: LayerTable, a: int, b: int, dp_ranks: list[int]) -> tuple[float, float]:
        """Seconds of ZeRO-3's all-gathers of the parameter units of entries a..b in a forward pass and
        in a backward pass (without FSDP2's units kept gathered from the forward, `dlsim.plan.fsdp`)."""
        gathers = self._unit_prices(s, t, a, b, dp_ranks)[0]
        return sum(gathers), sum(self._backward_gathers(s, t, a, b, gathers))

    def _backward_gathers(self, s: Strategy, t: LayerTable, a: int, b: int, gathers: list[float]) -> list[float]:
        """The unit gathers of entries a..b a backward pass runs: all but FSDP2's kept units."""
        kept = self._kept(s, t, a, b) if fsdp_block_units(s) else frozenset()
        return [g for j, g in enumerate(gathers) if j not in kept] if kept else gathers

    def _unit_chain(self, s: Strategy, t: LayerTable, a: int, b: int, dp_ranks: list[int]) -> float:
        """Σ gathers − the largest + Σ reductions − the largest over the ZeRO-3 parameter units of
        entries a..b a backward pass gathers and reduces: what its chain of units adds at least to its
        steps alone (see `lower_bound`)."""
        gathers, reductions = self._unit_prices(s, t, a, b, dp_ranks)
        gathers = self._backward_gathers(s, t, a, b, gathers)
        return sum(gathers) - max(gathers, default=0.0) + sum(reductions) - max(reductions, default=0.0)
