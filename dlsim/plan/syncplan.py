"""Gradient synchronisation and the optimizer step of one device, emitted into the iteration graph.

* DDP / ZeRO-1: gradients accumulate over micro-batches; the backward pass of the micro-batch that
  completes a chunk's gradients launches one collective per bucket as it becomes ready (`overlap`),
  or all of them after the last backward pass (no overlap). ZeRO-2/3 reduce-scatter every
  micro-batch's buckets. ZeRO-3 also all-gathers a chunk's parameters before each forward and
  backward pass of it (prefetched one pass ahead on the communication stream) and frees them after.
* Compression (`dlsim.plan.compression`): a compress kernel on the compute stream as the bucket
  becomes ready, the compressed collectives, and the decompress kernels before the optimizer step;
  a sparse allreduce's sum is instead added into the gradient on the communication stream as it
  arrives (SparCML reduces inside the library), which frees the bucket's buffers there.
* Word embeddings tied across the first and last stage: their gradients are all-reduced between the
  two stages (Megatron-LM `_allreduce_word_embedding_grads`), in the gradient buffer's dtype
  (`dlsim.plan.dataparallel.buffer_element_bytes`: fp32 under DeepSpeed's BF16_Optimizer).
* The optimizer step (on 1/dp of the parameters under ZeRO), then ZeRO-1/2's all-gather of the
  updated parameters.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol, Sequence

from dlsim.plan.comm import op_label, parse_sparse_op
from dlsim.plan.compression import plan_sync
from dlsim.plan.dataparallel import Bucket, buffer_element_bytes, reduce_element_bytes
from dlsim.plan.expertparallel import EDP, expert_params_of, updated_params
from dlsim.plan.fsdp import copy_in_bytes, fsdp_copies
from dlsim.plan.layertable import LayerEntry
from dlsim.plan.offload import OFFLOAD_SLICES
from dlsim.plan.taskgraph import BUFFERS, COMM, COMPUTE, STAGING, TRANSIENT_PARAMS
from dlsim.plan.zero import (GATHER_PREFETCH, gathers_in_forward, gathers_updated_params, gradient_collective, reduces_every_microbatch,
                             sharded_sync)
from dlsim.plan.taskgraph import TaskGraph
from dlsim.results import Estimate
from dlsim.spec.strategy import Strategy
from dlsim.units import DTYPE_BYTES


class GraphBuilder(Protocol):
    """What the synchronisation emitters need of the iteration builder (`dlsim.plan.iteration`):
    its inputs, graph, devices and streams, buckets, and its pricing and collective helpers. A
    protocol, so that this module does not import the builder (no import cycle)."""

    x: Any                                   # dlsim.plan.iteration.IterationInputs
    s: Strategy
    g: TaskGraph
    p: int
    v: int
    m: int
    dev: dict[tuple[int, int, int], int]
    cstream: list[int]
    mstream: list[int]
    chunk_entries: list[Sequence[LayerEntry]]
    buckets: list[list[Bucket]]
    pending: dict[tuple, list[int]]

    def dp_synced(self, e: LayerEntry) -> bool: ...

    def price(self, op: str, nbytes: float, ranks: list[int], tier: str | None = None,
              per_node: int | None = None) -> Estimate: ...

    def port(self, device: int, tier: str, direction: str) -> int: ...

    def group_ranks(self, kind: str, d: int, t: int, stage: int) -> list[int]: ...

    offloaded: dict[int, float]

    def host_copy(self, pos: tuple[int, int, int], direction: str, nbytes: float, deps: list[int], name: str,
                  mem_start: tuple = (), mem_end: tuple = ()) -> int: ...

    def collective(self, name: str, op: str, nbytes: float, kind: str, pos: tuple[int, int, int], key: tuple,
                   stream: int, deps: list[int], label: tuple) -> int: ...


class SyncEmitter:
    """Creates the per-device synchronisation emitters of one iteration graph."""

    def __init__(self, builder: GraphBuilder):
        self.b = builder
        x = builder.x
        chunk_of = {}
        for k, (a, e) in enumerate(x.ranges):
            for i in range(a, e):
                chunk_of[x.entries[i].name] = k
        self.tied: list[tuple[int, int, float]] = []
        gb = buffer_element_bytes(builder.s, x.dtype)  # all-reduced in the gradient buffer's own dtype
        for entry in x.entries:
            tied = x.model.layers[entry.index].attrs.get("tied_to") if entry.type == "linear" else None
            if tied and chunk_of[tied] % builder.p != chunk_of[entry.name] % builder.p:
                target = next(t for t in x.entries if t.name == tied)
                self.tied.append((chunk_of[tied] % builder.p, chunk_of[entry.name] % builder.p, target.params * gb))

    def start(self, pos: tuple[int, int, int]) -> "DeviceSync":
        return DeviceSync(self, pos)


class DeviceSync:
    """Synchronisation tasks of one simulated device (called by the iteration builder in program order)."""

    def __init__(self, parent: SyncEmitter, pos: tuple[int, int, int]):
        self.parent, self.b, self.pos = parent, parent.b, pos
        b = self.b
        self.s = b.s
        self.device = b.dev[pos]
        self.cs, self.ms = b.cstream[self.device], b.mstream[self.device]
        self.gb = DTYPE_BYTES[b.x.dtype]
        self.active = self.s.sync == "allreduce"
        self.syncs: list[int] = []
        self.decompress: list[tuple[float, float, int, str]] = []
        self.prev_first = -1
        self.prev_last = -1
        self.stage = pos[2]
        # ZeRO shard group: all of dp x cp, or with hybrid sharding the position's node
        self.shard_kind = "shard" if self.s.hybrid_shard else "dp"
        self.shard = len(b.group_ranks("shard", *pos)) if self.s.hybrid_shard else self.s.dp_cp
        self.replicas = len(b.group_ranks("replica", *pos)) if self.s.hybrid_shard else 1
        # (chunk, unit) -> [bytes, micro-batches holding it] of FSDP2's units kept gathered from forward to
        # backward: one copy, however many micro-batches are in flight between the two
        self.kept_held: dict[tuple[int, int], list] = {}

    def _chunk_bytes(self, k: int, experts: bool = False) -> float:
        """Bytes of chunk k's parameters reduced over dp (or with `experts` its routed experts', reduced
        over the expert-data-parallel group)."""
        es = self.b.chunk_entries[k]
        expert = expert_params_of(es)
        if experts:
            return expert * self.gb
        return (sum(e.params for e in es if self.b.dp_synced(e)) - expert) * self.gb

    # -- per-op hooks: buckets ready, ZeRO-3 parameter units -------------------------------
    def before_op(self) -> list[int]:
        return []

    def after_op(self, first: int, last: int, hooks: "OpHooks | None") -> None:
        self.prev_first, self.prev_last = first, last
        if hooks is not None:
            hooks.close(last)

    def hooks(self, k: int, i: int, phase: str, producing: bool) -> "OpHooks | None":
        """Hooks for one op: gather ZeRO-3 units, launch bucket reductions; None when neither applies."""
        if not self.active or self.s.dp_cp == 1:
            return None
        gather = bool(self.b.buckets[k]) and (self.s.zero == 3 or (
            phase == "F" and i == 0 and gathers_in_forward(self.s)))
        buckets = phase == "B" and (reduces_every_microbatch(self.s.zero) or (producing and self.s.overlap))
        if not (gather or buckets):
            return None
        order: tuple[int, ...] = ()
        split: frozenset[int] = frozenset()
        if gather:
            steps = self.b.fwd_units[k] if phase == "F" else self.b.bwd_units[k]
            runs = [st.unit for n, st in enumerate(steps) if st.unit >= 0 and (n == 0 or steps[n - 1].unit != st.unit)]
            order = tuple(dict.fromkeys(runs))
            if len(runs) > len(order):
                split = frozenset(u for u, n in Counter(runs).items() if n > 1)
        return OpHooks(self, k, i, phase, buckets, gather, order, self.b.kept[k] if self.s.zero == 3 else frozenset(),
                       split)

    def _bucket(self, k: int, j: int, i: int, ready: int) -> None:
        b, s = self.b, self.s
        bucket = b.buckets[k][j]
        base = gradient_collective(s)
        plan = plan_sync(s.compression, bucket.nbytes, reduce_element_bytes(s, self.b.x.dtype),
                         s.dp_cp, base)
        steps = [(op, nbytes, bucket.group) for op, nbytes in plan.collectives]
        if s.zero:  # uncompressed (compression needs zero 0): sharded, maybe hybrid
            steps = sharded_sync(s, bucket.nbytes, self.shard, self.replicas)
            if bucket.group == EDP:  # routed experts' gradients: sharded over the expert-data-parallel group
                steps = [(op, nbytes, EDP) for op, nbytes, _ in steps]
        deps = [ready]
        buffer = 0.0
        if fsdp_copies(s) and bucket.group != EDP:  # FSDP2's copy-in into the reduce dtype, on the reduce stream
            est = b.x.elementwise_time(0.0, copy_in_bytes(bucket.nbytes, b.x.dtype, reduce_element_bytes(s, b.x.dtype)))
            deps = [b.g.add(f"copy-in bucket{j} chunk{k} mb{i}", self.device, self.ms, est.seconds, COMM, deps,
                            source=est.source, label=("G", k, i, j))]
        if plan.compress[1] > 0:
            est = b.x.elementwise_time(*plan.compress)
            # the compressed payload and what the collectives gather into it live until decompression
            buffer = plan.buffer_bytes
            deps = [b.g.add(f"compress bucket{j} chunk{k}", self.device, self.cs, est.seconds, COMPUTE, deps,
                            source=est.source, label=("C", k, i, j), mem_start=((BUFFERS, buffer),))]
        last = -1
        for n, (op, nbytes, kind) in enumerate(steps):
            last = b.collective(f"{op_label(op)} bucket{j} chunk{k} mb{i}", op, nbytes, kind, self.pos, ("grad", k, j, i, n),
                                self.ms, deps, ("G", k, i, j))
            deps = [last]
        if plan.decompress[1] > 0 and parse_sparse_op(plan.collectives[-1][0]) is not None:
            # a sparse allreduce's result is added into the gradient as it arrives, on the communication
            # stream (SparCML reduces inside the library), freeing the bucket's buffers there
            est = b.x.elementwise_time(*plan.decompress)
            last = b.g.add(f"decompress bucket{j} chunk{k}", self.device, self.ms, est.seconds, COMPUTE, [last],
                           source=est.source, label=("D",), mem_end=((BUFFERS, -buffer),) if buffer else ())
        elif plan.decompress[1] > 0:
            self.decompress.append((*plan.decompress, last, f"decompress bucket{j} chunk{k}", buffer))
        elif buffer:
            b.g.tasks[last].mem_end += ((BUFFERS, -buffer),)
        self.syncs.append(last)

    # -- end of the iteration ----------------------------------------------------------------
    def finish(self, last_compute: int) -> None:
        b, s = self.b, self.s
        if not self.active:
            return
        if s.dp_cp > 1 and not s.overlap and not reduces_every_microbatch(s.zero):
            for c in range(b.v):
                k = c * b.p + self.stage
                for j in range(len(b.buckets[k])):
                    self._bucket(k, j, b.m - 1, last_compute)
        waits = list(self.syncs)
        for flops, nbytes, after, name, buffer in self.decompress:
            est = b.x.elementwise_time(flops, nbytes)
            waits.append(b.g.add(name, self.device, self.cs, est.seconds, COMPUTE, [after], source=est.source,
                                 label=("D",), mem_end=((BUFFERS, -buffer),) if buffer else ()))
        d, t, stage = self.pos
        for first_stage, last_stage, nbytes in self.parent.tied:
            if stage in (first_stage, last_stage):
                waits.append(self._embedding_sync(first_stage, last_stage, nbytes, last_compute))
        params = sum(e.params for c in range(b.v) for e in b.chunk_entries[c * b.p + stage])
        synced = sum(e.params for c in range(b.v) for e in b.chunk_entries[c * b.p + stage] if b.dp_synced(e))
        expert = expert_params_of([e for c in range(b.v) for e in b.chunk_entries[c * b.p + stage]])
        updated = updated_params(synced - expert, expert, s.zero, self.shard, s.ep) + (params - synced)
        staged = b.offloaded.get(stage, 0.0)  # optimizer state in host memory: streamed through for the step
        if staged:
            opt = self._offloaded_step(updated, staged, waits)
        else:
            est = b.x.optimizer_time(updated)
            opt = b.g.add(f"optimizer step ({s.optimizer})", self.device, self.cs, est.seconds, COMPUTE,
                          [w for w in waits if w >= 0], source=est.source, label=("O",))
        if s.dp_cp > 1 and gathers_updated_params(s.zero):
            for c in range(b.v):
                k = c * b.p + stage
                if not gathers_in_forward(s):
                    b.collective(f"allgather params chunk{k}", "allgather", self._chunk_bytes(k), self.shard_kind,
                                 self.pos, ("upd", k), self.ms, [opt], ("U", k))
                if self._chunk_bytes(k, experts=True) and s.dp_cp // s.ep > 1:
                    b.collective(f"allgather expert params chunk{k}", "allgather", self._chunk_bytes(k, experts=True),
                                 EDP, self.pos, ("upd-experts", k), self.ms, [opt], ("U", k))

    def _offloaded_step(self, params: float, state: float, waits: list[int]) -> int:
        """The optimizer step over state kept in host memory (`dlsim.plan.offload`): in
        `OFFLOAD_SLICES` equal slices, each copied in (prefetched from the start of the last backward
        pass; at most two slices on the device), stepped, and copied out. Returns the last step."""
        b, s = self.b, self.s
        n = OFFLOAD_SLICES
        est = b.x.optimizer_time(params / n)
        ins: list[int] = []
        outs: list[int] = []
        last = -1
        for j in range(n):
            after = [self.prev_first] + ([outs[j - 2]] if j >= 2 else [])
            ins.append(b.host_copy(self.pos, "in", state / n, after, f"H2D optimizer state {j + 1}/{n}",
                                   mem_start=((STAGING, state / n),)))
            deps = [ins[j]] + ([w for w in waits if w >= 0] if j == 0 else [])
            last = b.g.add(f"optimizer step ({s.optimizer}) {j + 1}/{n}", self.device, self.cs, est.seconds, COMPUTE,
                           deps, source=est.source, label=("O",))
            outs.append(b.host_copy(self.pos, "out", state / n, [last], f"D2H optimizer state {j + 1}/{n}",
                                    mem_end=((STAGING, -state / n),)))
        return last

    def _embedding_sync(self, first_stage: int, last_stage: int, nbytes: float, after: int) -> int:
        b = self.b
        d, t, _ = self.pos
        lay = b.x.layout
        ranks = [lay.rank(d, t, first_stage), lay.rank(d, t, last_stage)]
        est = b.price("allreduce", nbytes, ranks)
        tid = b.g.add("allreduce tied embedding grads", self.device, self.ms, est.seconds, "comm", [after],
                      source=est.source, label=("E",), info={"op": "allreduce", "bytes": nbytes, "group": "embedding",
                                                            "ranks": 2, "source": est.source.value})
        key = ("embed", d, t, first_stage, last_stage)
        members = b.pending.setdefault(key, [])
        members.append(tid)
        if len(members) == 2:
            tier = b.x.pricer.tier(ranks)
            devs = [b.g.tasks[m].device for m in members]
            ports = tuple(sorted(b.port(dv, tier, dr) for dv in devs for dr in ("out", "in")))
            b.g.add_group(members, est.seconds, ports)
            del b.pending[key]
        return tid


class OpHooks:
    """Step hooks of one forward or backward op (see `dlsim.plan.templates.StepHooks`).

    ZeRO-3 / FSDP: each parameter unit is all-gathered on the communication stream before its first
    step, prefetched `GATHER_PREFETCH` units ahead: when a unit starts, the gathers of the next units
    are issued, so a unit's gather runs beside the compute of the one before it (the pass's first
    units once the previous pass has ended and released its units: at most 1 + `GATHER_PREFETCH`
    units gathered at a time, as FSDP2 allows); each gathered unit is held until its last step ends. ZeRO-1/2 with `gathers_in_forward`: the first micro-batch's forward pass of each
    chunk waits for its units' gathers, all dispatched at the iteration's start (the optimizer step's
    end), chunk after chunk in the order the device runs them; nothing held (the device keeps its
    whole parameters). Buckets: launch a
    bucket's reduction after the step that completes its gradients.
    """

    def __init__(self, sync: DeviceSync, k: int, i: int, phase: str, buckets: bool, gather: bool,
                 order: tuple[int, ...] = (), kept: frozenset[int] = frozenset(), split: frozenset[int] = frozenset()):
        self.sync, self.k, self.i, self.phase = sync, k, i, phase
        self.buckets, self.gather = buckets, gather
        self.order = order  # the pass's parameter units in step order
        self.kept = kept  # units kept gathered from the forward pass to the backward (FSDP2, `dlsim.plan.fsdp`)
        self.split = split  # units whose steps come back later in the pass (FSDP2's root): held until its end
        self.released: set[int] = set()  # kept units this backward pass has released
        self.unit = -1
        self.last = -1
        self.issued: dict[int, int] = {}  # unit -> its gather task
        self.held: dict[int, float] = {}  # unit -> gathered bytes held (ZeRO-3)

    def before(self, step) -> list[int]:
        if not self.gather or step.unit < 0 or step.unit == self.unit:
            return []
        sync = self.sync
        if self.unit >= 0 and self.unit not in self.split:
            self._release(self.unit)
        j = self.order.index(step.unit)
        ahead = len(self.order) if sync.s.zero != 3 else j + 1 + GATHER_PREFETCH
        for q in range(j, min(len(self.order), ahead)):
            unit = self.order[q]
            if unit in self.issued:
                continue
            if self.phase == "B" and unit in self.kept:  # still gathered since its forward pass
                self.issued[unit] = -1
                continue
            if sync.s.zero != 3:  # the updated parameters: every gather dispatched when the step ended
                deps = []
            elif q <= GATHER_PREFETCH:  # the pass's first units once the previous pass has ended (released its units)
                deps = [sync.prev_last] if sync.prev_last >= 0 else []
            else:  # issued as unit j starts, once the step before it has run
                deps = [self.last] if self.last >= 0 else []
            self.issued[unit] = self._gather(unit, deps)
        self.unit = step.unit
        return [self.issued[step.unit]] if self.issued[step.unit] >= 0 else []

    def _gather(self, unit: int, deps: list[int]) -> int:
        sync, b = self.sync, self.sync.b
        nbytes = b.buckets[self.k][unit].gather_nbytes
        tid = b.collective(f"allgather unit{unit} chunk{self.k} {self.phase} mb{self.i}", "allgather", nbytes,
                           sync.shard_kind, sync.pos, ("ag", self.phase, self.k, self.i, unit), sync.ms, deps,
                           ("AG", self.k, self.i, unit))
        if sync.s.zero == 3:  # ZeRO-1/2 keep their whole parameters; ZeRO-3 holds a gathered unit until it ends
            held = nbytes * (sync.shard - 1) / sync.shard
            if unit in self.kept:  # until the end of its backward pass, one copy for the micro-batches in flight
                entry = sync.kept_held.setdefault((self.k, unit), [held, 0])
                entry[1] += 1
                if entry[1] > 1:
                    return tid
            else:
                self.held[unit] = held
            b.g.tasks[tid].mem_start += ((TRANSIENT_PARAMS, held),)
        return tid

    def after(self, step, tid: int) -> None:
        self.last = tid
        if self.buckets:
            for j in step.buckets:
                self.sync._bucket(self.k, j, self.i, tid)

    def _release(self, unit: int) -> None:
        held = self.held.pop(unit, 0.0)
        entry = None
        if self.phase == "B" and unit in self.kept and unit not in self.released:
            self.released.add(unit)
            entry = self.sync.kept_held.get((self.k, unit))
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                held += self.sync.kept_held.pop((self.k, unit))[0]
        if held and self.last >= 0:
            self.sync.b.g.tasks[self.last].mem_end += ((TRANSIENT_PARAMS, -held),)

    def close(self, last: int) -> None:
        self.last = last
        for unit in list(self.held) + ([u for u in self.kept if u in self.issued] if self.phase == "B" else []):
            self._release(unit)
