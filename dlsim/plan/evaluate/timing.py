"""One strategy's iteration time (see `dlsim.plan.evaluate`): per chunk the forward, recomputation
and backward step lists priced and walked, then the pipeline, the data-parallel reductions, the
tied-embedding all-reduce, the optimizer step and the parameter all-gathers.
"""

from __future__ import annotations


from dlsim.cost.overlap import overlap_cost
from dlsim.plan.comm import Layout
from dlsim.plan.compression import plan_sync
from dlsim.plan.dataparallel import buffer_element_bytes, reduce_element_bytes
from dlsim.plan.expertparallel import (EDP, EP, edp_group, expert_params_of,
                                      updated_params)
from dlsim.plan.fsdp import copy_in_bytes, fsdp_copies, unit_copies
from dlsim.plan.scenario import LayerTable
from dlsim.plan.oprecompute import alternate_layers
from dlsim.plan.templates import backward_steps, forward_steps, op_recompute_steps, selective_recompute_steps, units_of
from dlsim.plan.pipeline import FORWARD, scatter_gather
from dlsim.plan.spatial import SPATIAL
from dlsim.plan.evaluate.records import replicas
from dlsim.plan.zero import gathers_in_forward, gathers_updated_params, gradient_collective, reduces_every_microbatch
from dlsim.spec.strategy import Strategy
from dlsim.plan.evaluate.records import (WALK_OPS, WALK_PLAIN_OPS, Evaluation)
from dlsim.plan.evaluate.pipeline import pipeline_ends, pipeline_walk
from dlsim.plan.evaluate.leansteps import BUCKETS, DURATION, GROUP, KIND, LeanStep, sigma as step_sigma
from dlsim.plan.evaluate.stream import StreamWalk


class Timing(StreamWalk):
    """One strategy's timing (see the module docstring)."""

    def __init__(self, ev: "Evaluator",  # noqa: F821 (dlsim.plan.evaluate.core)
                 s: Strategy, t: LayerTable, ranges, memory):
        self.ev, self.s, self.t, self.ranges, self.mem = ev, s, t, ranges, memory
        self.pricer = ev.pricer(s)
        self.lay = Layout(s.dp, s.tp, s.pp, ev.cluster.devices_per_node, s.domain)
        self.sigma = ev.sigma
        self.chunk_entries = [t.entries[a:b] for a, b in ranges]
        self._same_tier: dict[int, bool] = {}
        self._stage_keys: dict[int, tuple] = {}  # `StreamWalk._stage_key` per stage
        self._programs_of = ev._cache  # priced programs are shared by the evaluations of one layout

    def price(self, op: str, nbytes: float, ranks: list[int], messages: tuple = ()) -> float:
        return self.ev._price(self.pricer, self.s, op, nbytes, ranks, messages)

    def tpg(self, stage: int) -> list[int]:
        """The tensor-parallel group of replica 0's `stage` (`Evaluator.stage_groups`)."""
        return self.ev.stage_groups(self.s, stage)[0]

    def dpg(self, stage: int) -> list[int]:
        """The data-parallel group of tensor rank 0's `stage` (`Evaluator.stage_groups`)."""
        return self.ev.stage_groups(self.s, stage)[1]

    def steps_time(self, steps: list[LeanStep], stage: int) -> tuple[float, float, float]:
        """(seconds, compute seconds, communication seconds) of a step list run alone."""
        total = comp = comm = 0.0
        ranks = self.tpg(stage)
        priced: dict[tuple, float] = {}  # a pass's repeated collectives (one per layer) priced once
        for st in steps:
            kind, d = st[KIND], st[DURATION]
            if kind == "compute":
                total += d
                comp += d
                continue
            c = self._step_price(st, ranks, stage, priced)
            if kind == "collective":
                total += c
                comm += c
            else:  # overlap: kernels beside an asynchronous collective
                extra, exposed = overlap_cost(d, c, step_sigma(st, self.sigma))
                total += d + extra + exposed
                comp += d
                comm += extra + exposed
        return total, comp, comm

    def _param_gathers(self, k: int, dp_ranks: list[int], stage: int) -> float:
        """ZeRO-1/2's all-gathers of chunk k's updated parameters: the dense ones over dp, the routed
        experts' over the expert-data-parallel group (`dlsim.plan.syncplan`)."""
        a, b = self.ranges[k]
        key = ("chunk params", self.t.key, a, b)  # a table's key is its base's: the same parameters
        got = self.ev._cache.get(key)
        if got is None:
            es = self.chunk_entries[k]
            got = self.ev._cache[key] = (sum(e.params for e in es), expert_params_of(es))
        params, expert = got  # type: ignore[misc]
        seconds = self.price("allgather", (params - expert) * self.ev.gb, dp_ranks)
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

    def _ranks(self, st: LeanStep, tp_ranks: list[int], stage: int) -> list[int]:
        """The ranks of a step's collective: its expert-parallel group or context-parallel ring, else
        the tensor-parallel one."""
        if st[GROUP] in ("cp", SPATIAL):
            return self.lay.cp_group(0, 0, stage)
        return self.ev.ep_ranks(self.s, stage) if st[GROUP] == EP else tp_ranks

    def _bucket_launches(self, steps: list[LeanStep], buckets, stage: int) -> dict[int, tuple[float, ...]]:
        """Per step position of a backward pass, the seconds of the reductions of the buckets complete
        after it, in launch order (tuples: kept by the evaluator, which the garbage collector then
        leaves alone)."""
        dp_ranks = self.dpg(stage)
        edp_ranks = edp_group(self.lay, self.s.ep, 0, 0, stage)
        base = gradient_collective(self.s)
        copies = fsdp_copies(self.s) and replicas(self.s) > 1
        element = reduce_element_bytes(self.s, self.ev.dtype)
        out: dict[int, list[float]] = {}
        priced: dict[tuple, float] = {}  # buckets of one size and group (most of a chunk's) priced once
        for pos, j in self._bucket_positions(steps):
            edp = buckets[j].group == EDP
            seconds = priced.get((buckets[j].nbytes, edp))  # type: ignore[assignment]
            if seconds is None:
                plan = plan_sync(self.s.compression, buckets[j].nbytes, element, replicas(self.s), base)
                group = edp_ranks if edp else dp_ranks
                seconds = sum(self.price(op, n, group) for op, n in plan.collectives)
                if copies and not edp:  # FSDP2's copy-in before the reduce-scatter, on its stream
                    seconds += self.ev.elementwise_time(0.0, copy_in_bytes(buckets[j].nbytes, self.ev.dtype,
                                                                           element)).seconds
                priced[(buckets[j].nbytes, edp)] = seconds
            out.setdefault(pos, []).append(seconds)
        return {pos: tuple(x) for pos, x in out.items()}

    def _chunk(self, k: int) -> tuple:
        """Per micro-batch times of global chunk k: (f_t, f_c, f_m, r_t, r_c, r_m, b_t, b_c, b_m, sync
        seconds, walked backward (steps, launches, seconds), per-micro-batch reductions outlast the pass).
        Cached per evaluator by everything it depends on."""
        s, ev = self.s, self.ev
        tp, r = s.tp, k % s.pp
        tp_ranks, dp_ranks, groups = ev.stage_groups(s, r)
        if not (replicas(s) > 1 or s.tp > 1):
            groups = ()
        a, b = self.ranges[k]
        key = ("chunk", self.t.signature(a, b, ev.instance), tp, s.dp, s.spatial, groups, s.recompute, s.recompute_layers,
               s.tp_async_backward, s.zero, s.bucket_size, s.first_bucket_size, s.collective,
               s.grad_reduce_dtype, s.zero_grad_reduce, s.param_gather_overlap)
        got = ev._cache.get(key)
        if got is not None:
            return got  # type: ignore[return-value]
        overlap = s.tp_async_backward
        dp_sync = replicas(s) > 1
        per_mb = reduces_every_microbatch(s.zero) and dp_sync
        zero3 = s.zero == 3 and dp_sync
        first_gathers = gathers_in_forward(s) and dp_sync  # ZeRO-1/2's updated parameters, in micro-batch 0
        comm_bound = False
        # the pieces that depend on fewer fields are kept apart, so that candidates differing only in
        # recomputation, ZeRO stage or data-parallel degree share their step lists and pass times
        sig, tpg, dpg = key[1], groups[:2], groups[2:]
        has_buckets = dp_sync or bool(s.zero)
        # forward and recomputation steps do not depend on the gradient accumulation: keyed by the
        # chunk of the table without it, shared by every micro-batch count
        fsig = (self.t.base or self.t).signature(a, b, ev.instance)
        # FSDP2's units (`dlsim.plan.fsdp`): which are kept gathered depends on whether the chunk holds
        # the model's last block; the copy-out runs at each gathered unit's first step
        fsdp = (s.fsdp_units, s.fsdp_copies, self._holds_last_block(k)) if zero3 else ()
        fkey = ("forward", fsig, tp, tpg, s.collective, s.bucket_size, s.first_bucket_size, has_buckets,
                zero3 or first_gathers, s.grad_reduce_dtype, s.zero_grad_reduce, fsdp)
        forward = ev._cache.get(fkey)
        if forward is None:
            es = self.chunk_entries[k]
            buckets = self._buckets_of(es)
            # the plain pass depends on the chunk's layers alone: shared by the candidates that bucket,
            # gather or shard differently
            plain_key = ("plain forward", fsig, tp, tpg, s.collective)
            plain = ev._cache.get(plain_key)
            if plain is None:
                fwd = forward_steps(es, tp, lean=True)
                plain = ev._cache[plain_key] = (fwd, self.steps_time(fwd, r))
            fwd, fwd_time = plain  # type: ignore[misc]
            units = units_of(es, buckets) if (zero3 or first_gathers) and buckets else None
            kept, copy_f, copy_b = unit_copies(es, buckets, s, ev.elementwise_time, ev.last_block) if zero3 \
                else (frozenset(), None, None)
            fwd_u = forward_steps(es, tp, unit_of=units, unit_lead=copy_f, lean=True) if units is not None else fwd
            # with FSDP2's copy-out, the unit-split pass is longer than the plain one by its copies
            forward = ev._cache[fkey] = (a, buckets, units, fwd_u, self.steps_time(fwd_u, r) if copy_f else fwd_time,
                                         kept, copy_b)
        # buckets and units name layers by index: those of the chunk they were made for, at a0
        a0, buckets, units, fwd_u, (f_t, f_c, f_m), kept, copy_b = forward  # type: ignore[misc]
        if units is not None and a0 != a:
            units = {i - a0 + a: u for i, u in units.items()}
        pkey = ("backward", sig, tp, tpg, s.collective, overlap, s.bucket_size, s.first_bucket_size, has_buckets,
                zero3, s.grad_reduce_dtype, s.zero_grad_reduce, fsdp)
        passes = ev._cache.get(pkey)
        if passes is None:
            es = self.chunk_entries[k]
            ready: dict[int, tuple[int, ...]] = {}
            for j, bu in enumerate(buckets):
                at = bu.ready_after - a0 + a
                ready[at] = ready.get(at, ()) + (j,)
            bwd = backward_steps(es, tp, ready, units, overlap=overlap, unit_lead=copy_b, lean=True) \
                if zero3 and units is not None else backward_steps(es, tp, ready, overlap=overlap, lean=True)
            passes = ev._cache[pkey] = (bwd, self.steps_time(bwd, r))
        bwd, (b_t, b_c, b_m) = passes  # type: ignore[misc]
        rkey = ("recompute", fsig, tp, tpg, s.collective, s.recompute)
        rec_time = ev._cache.get(rkey)
        if rec_time is None:
            es = self.chunk_entries[k]
            if s.recompute in ("full", "selective_layer"):
                inside = ev.instance if s.recompute == "full" else alternate_layers(ev.model)
                rec = forward_steps([e for e in es if inside[e.name]], tp, "recompute", lean=True)
            elif s.recompute == "selective":
                rec = selective_recompute_steps(es, lean=True)
            elif s.recompute == "selective_op":
                rec = op_recompute_steps(es, ev.instance, lean=True)
            else:
                rec = []
            rec_time = ev._cache[rkey] = (rec, self.steps_time(rec, r))
        rec, (r_t, r_c, r_m) = rec_time  # type: ignore[misc]
        if dp_sync and buckets:
            lkey = ("launches", pkey, replicas(s), dpg, s.zero, s.zero_grad_reduce, s.collective, s.compression, fsdp)
            launches = ev._cache.get(lkey)
            if launches is None:
                launches = ev._cache[lkey] = self._bucket_launches(bwd, buckets, r)
        else:
            launches = {}
        chunk_sync = sum(sum(x) for x in launches.values())  # type: ignore[union-attr]
        gathers = gathers_b = None
        if first_gathers and buckets:  # ZeRO-1/2's updated parameters, waited for in micro-batch 0
            gathers = gathers_b = [self.price("allgather", bu.gather_nbytes, self.dpg(r)) for bu in buckets]
        if zero3:
            dp_ranks = self.dpg(r)
            by_size: dict[float, float] = {}  # most units are one size: priced once
            gathers = [by_size[n] if n in by_size else by_size.setdefault(n, self.price("allgather", n, dp_ranks))
                       for n in (bu.gather_nbytes for bu in buckets)]
            # the backward gathers all but the units kept gathered since the forward (None: no gather)
            gathers_b = [None if u in kept else g for u, g in enumerate(gathers)] if kept else gathers
            wf, qf, sf = self._walk(fwd_u, r, {}, gathers)
            wb, qb, sb = self._walk(bwd, r, launches, gathers_b)
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
               (fwd_u, rec, bwd, launches, gathers, zero3, gathers_b))
        ev._cache[key] = out
        return out

    def run(self) -> Evaluation:
        s, ev = self.s, self.ev
        p, v, m = s.pp, s.virtual_stages, s.num_microbatches
        tp = s.tp
        dp_sync = replicas(s) > 1
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
        # (forward, recompute, backward steps, launches, gathers, every pass gathers, the backward's gathers)
        parts: list[tuple] = [()] * K
        for k in range(K):
            r = k % p
            f_t, f_c, f_m, r_t, r_c, r_m, b_t, b_c, b_m, chunk_sync[k], walked[k], bound, parts[k] = self._chunk(k)
            comm_bound = comm_bound or bound
            f[k], bk[k] = f_t, r_t + b_t
            comp[r] += f_c + b_c
            recomp[r] += r_c
            comm[r] += f_m + r_m + b_m
        # ZeRO-1/2's updated parameters gathered from the start, chunk after chunk in the order each
        # stage runs them (`gathers_in_forward`): when each unit's gather ends
        self.first_ready, self.first_busy = {}, [0.0] * p  # per stage: when its last such gather ends
        if gathers_in_forward(s) and dp_sync and not zero3:
            for r in range(p):
                offset = 0.0
                for c in range(v):
                    k = c * p + r
                    fwd_u, gathers = parts[k][0], parts[k][4]
                    if gathers:
                        ready = [0.0] * len(gathers)
                        for u in self._unit_order(fwd_u):
                            offset += gathers[u]
                            ready[u] = offset
                        self.first_ready[k] = ready
                self.first_busy[r] = offset
        # pipeline: when each stage's last backward pass of each local chunk ends
        c_fwd = self._p2p_times()
        programs = per_mb and p * m * v <= WALK_OPS and (zero3 or comm_bound)
        send_f = send_b = [0.0] * K  # blocking exchanges (no `p2p_overlap`): a pass's send holds its stage
        if p > 1 and not s.p2p_overlap and not programs:
            send_f, send_b, c_fwd = self._blocking_sends()
            f, bk = [x + y for x, y in zip(f, send_f)], [x + y for x, y in zip(bk, send_b)]
            comm = [comm[r] + sum(send_f[k] + send_b[k] for k in range(r, K, p)) for r in range(p)]
        if programs:  # every pass walked beside the stage's communication stream, which carries over
            last, queue_end, busy_s = self._programs(parts, c_fwd)
            comm = [(busy_s[r] - m * (comp[r] + recomp[r])) / m for r in range(p)]
        elif self.first_ready and (p == 1 or p * m * v <= WALK_PLAIN_OPS):
            waited = [0.0] * p

            def run_op(r: int, op, k: int, t: float) -> float:
                if op.kind == FORWARD and op.microbatch == 0 and k in self.first_ready:
                    end = self.walk_steps(parts[k][0], r, {}, None, 0.0, max(0.0, self.first_busy[r] - t), 0.0,
                                          [x - t for x in self.first_ready[k]])[0]
                    waited[r] += end - (f[k] - send_f[k])
                    return t + end + send_f[k]
                return t + (f[k] if op.kind == FORWARD else bk[k])
            last = pipeline_walk(s.schedule, p, m, v, (), (), c_fwd, run_op)
            comm = [comm[r] + waited[r] / m for r in range(p)]
        elif p > 1 and p * m * v <= WALK_PLAIN_OPS:
            wkey = ("walk", s.schedule, p, m, v, tuple(f), tuple(bk), tuple(c_fwd))
            last = ev._cache.get(wkey)  # type: ignore[assignment]
            if last is None:  # candidates differing in what follows the pipeline share it (ZeRO stage, ...)
                last = ev._cache[wkey] = pipeline_walk(s.schedule, p, m, v, f, bk, c_fwd)
        else:
            last = pipeline_ends(s.schedule, p, m, v, f, bk, c_fwd)
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
                    wb, qb, sb = self._walk_kept(bwd, r, launches, max(0.0, busy - pass_start))
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
        stages = ev.stages(self.t, self.ranges, p, v)
        timer = ev.builder.optimizer_timer(s, self.t)
        for r in range(p):
            chunks = [c * p + r for c in range(v)]
            # the simulator's optimizer step (`dlsim.plan.syncplan`): the stage's own parameters, 1/dp
            # of them under ZeRO; the copy of a tied embedding is not in it
            params, _, expert, _ = stages[r]
            updated = updated_params(params - expert, expert, s.zero, replicas(s), s.ep)
            okey = ("optimizer", id(timer), updated)  # the builder keeps its timers: ids stay theirs
            opt = ev._cache.get(okey)
            if opt is None:
                opt = ev._cache[okey] = timer(updated).seconds
            end = stage_end[r] + opt
            if dp_sync and gathers_updated_params(s.zero) and not gathers_in_forward(s):
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
        if p > 1 and programs and not s.p2p_overlap:
            outside.append("blocking pipeline exchanges beside ZeRO-2/3's per-pass stream walk (timed as overlapped)")
        if s.schedule == "interleaved" and m == p:
            outside.append("interleaved schedule with num_microbatches = pp")
        if p > 1 and tp > 1 and self._p2p_shares_tp_ports():
            outside.append("pipeline transfers sharing the tensor-parallel link ports")
        if p > 1 and scatter_gather(s):
            outside.append("scatter-gather pipeline transfers (their all-gathers share the tensor-parallel link ports)")
        if p > 1 and (zero3 or self.first_ready) and self._p2p_shares_dp_ports():
            outside.append("pipeline transfers sharing the data-parallel link ports with parameter gathers")
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
        if s.spatial > 1:
            outside.append("spatial parallelism (halo exchanges beside the interior walked as overlaps)")
        if self.ev.shared_network(s):
            outside.append("contention on a shared network (each group shape priced where it first occurs)")
        return Evaluation(s, T, cmp, rc, ex, bubble, self.mem, ev.capacity, tuple(outside))

    def _bucket_positions(self, steps: list[LeanStep]) -> tuple[tuple[int, int], ...]:
        """(step position, bucket) of every bucket a pass completes, in step order (kept per step list)."""
        key = ("bucket positions", id(steps))
        got = self.ev._cache.get(key)
        if got is None:
            got = self.ev._cache[key] = (tuple((pos, j) for pos, st in enumerate(steps) for j in st[BUCKETS]), steps)
        return got[0]  # type: ignore[index]

    def _holds_last_block(self, k: int) -> bool:
        """`Evaluator.holds_last_block` of chunk k, kept by the chunk's layers (their names: a table's
        key is its base's)."""
        a, b = self.ranges[k]
        key = ("holds last block", self.t.key, a, b)
        got = self.ev._cache.get(key)
        if got is None:
            got = self.ev._cache[key] = self.ev.holds_last_block(self.chunk_entries[k])
        return got  # type: ignore[return-value]

    def _buckets_of(self, es):
        return self.ev._buckets(self.s, es)

    def _shares_ports(self, group: str, ranks) -> bool:
        """Whether a pipeline transfer runs on the link tier of `ranks` (the `group` of stage 0),
        kept per layout: every candidate of it asks."""
        s = self.s
        key = ("p2p shares", group, s.dp, s.tp, s.pp, s.domain, s.collective, s.ep)
        got = self.ev._cache.get(key)
        if got is None:
            lay, tier = self.lay, self.pricer.tier(ranks())
            got = self.ev._cache[key] = any(self.pricer.tier([lay.rank(0, 0, r), lay.rank(0, 0, r + 1)]) == tier
                                            for r in range(s.pp - 1))
        return got  # type: ignore[return-value]

    def _p2p_shares_ep_ports(self) -> bool:
        """Whether pipeline transfers use the link tier of the expert-parallel all-to-alls (the
        simulator serialises the two on the ports; not modelled here)."""
        return self._shares_ports("ep", lambda: self.ev.ep_ranks(self.s, 0))

    def _p2p_shares_dp_ports(self) -> bool:
        """Whether pipeline transfers use the link tier of the data-parallel group, where parameter
        gathers run beside compute (the simulator serialises the two on the ports; not modelled here)."""
        return self._shares_ports("dp", lambda: self.lay.dp_group(0, 0))

    def _p2p_shares_tp_ports(self) -> bool:
        """Whether pipeline transfers use the link tier of the tensor-parallel collectives."""
        return self._shares_ports("tp", lambda: self.lay.tp_group(0, 0))

    def _p2p_times(self) -> list[float]:
        """Seconds of the transfer across each chunk boundary k → k+1 (`_p2p_parts`: the send, then the
        receiver's all-gather of a scatter-gather transfer)."""
        key = ("p2p times", *self._p2p_key())
        got = self.ev._cache.get(key)
        if got is None:
            got = self.ev._cache[key] = [x + y for x, y in zip(*self._p2p_parts())]  # read, never changed
        return got  # type: ignore[return-value]

    def _p2p_key(self) -> tuple:
        s = self.s  # the boundaries' bytes are the table's (its key) cut at the ranges; the prices the layout's
        return (self.t.key, tuple(self.ranges), scatter_gather(s), s.dp, s.tp, s.pp, s.domain, s.collective)

    def _p2p_parts(self) -> tuple[list[float], list[float]]:
        """Per chunk boundary k → k+1: the seconds of the send, and of the receiver's tensor-parallel
        all-gather (0 but for scatter-gather transfers: Megatron-LM's scatter_gather_tensors_in_pipeline,
        `dlsim.plan.iteration`, where each tensor-parallel rank sends 1/tp of the replicated tensor)."""
        key = ("p2p parts", *self._p2p_key())
        got = self.ev._cache.get(key)
        if got is not None:
            return got  # type: ignore[return-value]
        s = self.s
        gather = scatter_gather(s)
        sends: list[float] = []
        gathers: list[float] = []
        for k, nbytes in enumerate(self.ev.boundaries(self.t, self.ranges)):
            a = self.lay.rank(0, 0, k % s.pp)
            b = self.lay.rank(0, 0, (k + 1) % s.pp)
            split = gather and nbytes > 0
            sends.append(self.pricer.p2p(nbytes / s.tp if split else nbytes, a, b).seconds)
            gathers.append(self.price("allgather", nbytes, self.tpg((k + 1) % s.pp)) if split else 0.0)
        got = self.ev._cache[key] = (sends, gathers)  # read, never changed
        return got

    def _blocking_sends(self) -> tuple[list[float], list[float], list[float]]:
        """Blocking pipeline exchanges as the simulation runs them (`dlsim.plan.p2pplan`: without
        `p2p_overlap` a stage's next kernel waits for its send): per global chunk k, the send that ends
        its forward pass (across boundary k, none from the last chunk) and its backward pass (across
        boundary k − 1, none from the first), added to the passes' durations, and what is left of each
        boundary's transfer for the receiver to wait on (a scatter-gather transfer's all-gather). The
        walk's op ends are then the simulation's: a receiver starts at the send's end plus the rest."""
        K = self.s.pp * self.s.virtual_stages
        sends, gathers = self._p2p_parts()
        send_f = [sends[k] if k < K - 1 else 0.0 for k in range(K)]
        send_b = [sends[k - 1] if k > 0 else 0.0 for k in range(K)]
        return send_f, send_b, gathers

    def _tied_sync(self) -> tuple[int, int, float] | None:
        """(first stage, last stage, seconds) of the tied-embedding all-reduce, if there is one."""
        s = self.s
        if s.pp == 1:
            return None
        pair = self.ev.tied_pair(self.t, self.ranges, s.pp)
        if pair is None:
            return None
        first, last, params = pair
        eb = buffer_element_bytes(s, self.ev.dtype)  # the gradient buffer's own dtype (syncplan)
        key = ("tied sync", s.collective, s.dp, s.tp, s.pp, s.domain, first, last, params, eb)
        secs = self.ev._cache.get(key)
        if secs is None:
            ranks = [self.lay.rank(0, 0, first), self.lay.rank(0, 0, last)]
            secs = self.ev._cache[key] = self.pricer.collective("allreduce", params * eb, ranks).seconds
        return first, last, secs  # type: ignore[return-value]
