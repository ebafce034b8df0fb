"""The task graph of one synchronous training iteration under dp × tp × pp (and layer groups).

Every simulated device runs its pipeline stage's op order (`dlsim.plan.pipeline`); each op is a
chunk's forward or backward step list (`dlsim.plan.templates`) for one micro-batch, on the device's
compute stream, with tensor-parallel collectives inline (they block the stream, as Megatron-LM's
all-reduces on the default stream do). Activations and gradients cross stage boundaries as
point-to-point transfers on per-pair channels (`dlsim.plan.p2pplan`). Gradient buckets are reduced on the communication
stream as they become ready (`dlsim.plan.dataparallel`, ZeRO per `dlsim.plan.zero`), then each
device runs its optimizer step.

Symmetry: with `explicit_dp` / `explicit_tp` off, one data-parallel replica and one tensor-parallel
rank per stage are simulated and their collectives priced at the full rank count; the result is
the same as simulating all ranks when they are identical (tests/test_sim_symmetry.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from dlsim.cost.overlap import overlap_cost
from dlsim.plan.comm import INTER, INTRA, CommPricer, Layout, op_label
from dlsim.plan.compression import error_feedback_bytes
from dlsim.plan.dataparallel import buffer_element_bytes
from dlsim.plan.fusion import fuse_steps
from dlsim.plan.expertparallel import EDP, EP, edp_group, ep_group, expert_params_of, expert_states
from dlsim.plan.layertable import LayerEntry, boundary_bytes
from dlsim.plan.offload import UnitOffload, host_transfer, offloads_activations, offloads_optimizer
from dlsim.plan.passes import chunk_passes
from dlsim.plan.pipeline import BACKWARD, FORWARD, stage_ops
from dlsim.plan.p2pplan import emit_transfers
from dlsim.plan.spatial import SPATIAL, halo_time
from dlsim.plan.syncplan import SyncEmitter
from dlsim.plan.taskgraph import (ACTIVATIONS, COMM, COMPUTE, RECOMPUTE, WORKSPACE, Message, SimDevice, TaskGraph,
                                  measured_fraction)
from dlsim.plan.templates import Step, StepHooks
from dlsim.plan.zero import model_state_bytes
from dlsim.results import Estimate
from dlsim.spec.cluster import LinkTier
from dlsim.spec.model import Model
from dlsim.spec.strategy import Strategy


@dataclass(frozen=True)
class IterationInputs:
    """What `build_iteration` needs. `optimizer_time(params)` and `elementwise_time(flops, bytes)`
    price the optimizer step and compression kernels on one device; `overlap_slowdown` is the
    device's compute slowdown beside communication (`dlsim.cost.overlap`); `host` the device's
    link to host memory, for offloading (`dlsim.plan.offload`)."""

    model: Model
    entries: tuple[LayerEntry, ...]
    ranges: tuple[tuple[int, int], ...]
    strategy: Strategy
    layout: Layout
    pricer: CommPricer
    dtype: str
    device_name: str
    capacity: float
    optimizer_time: Callable[[float], Estimate]
    elementwise_time: Callable[[float, float], Estimate]
    explicit_dp: bool = False
    explicit_tp: bool = False
    expand: bool = False
    overlap_slowdown: float = 0.0
    host: LinkTier | None = None


class _Builder:
    def __init__(self, x: IterationInputs):
        self.x, s = x, x.strategy
        self.s = s
        self.g = TaskGraph()
        self.p, self.v, self.m, self.K = s.pp, s.virtual_stages, s.num_microbatches, s.chunks
        self.dps = list(range(s.dp)) if x.explicit_dp else [0]
        self.tps = list(range(s.tp)) if x.explicit_tp else [0]
        self.chunk_entries = [x.entries[a:b] for a, b in x.ranges]
        self.boundary = boundary_bytes(x.model, x.entries, x.ranges)
        self.price_cache: dict[tuple, Estimate] = {}
        self.placed = getattr(x.pricer, "contention", None) is not None
        self.group_cache: dict[tuple, tuple] = {}
        self.collective_plans: dict[tuple, tuple] = {}  # `collective`'s, by (op, bytes, group kind, position)
        self.busy_cache: dict[tuple, set[str]] = {}
        # per (step list, position): whether it fuses, and the fused task's (parts, ports)
        self.fuse_cache: dict[tuple[int, tuple[int, int, int]], tuple | None] = {}
        # per (step list, position): its tasks' (name, duration, category, measured, ports, info) when the
        # list runs as a plain chain (`_chain`), else None
        self.chains: dict[tuple[int, tuple[int, int, int]], tuple | None] = {}
        self.p2p_cache: dict[tuple[float, int, int], tuple[Estimate, str]] = {}
        self.ports: dict[tuple[int, str, str], int] = {}
        self.pending: dict[tuple, list[int]] = {}
        self.host_streams: dict[tuple[int, str], int] = {}
        self.offloaded: dict[int, float] = {}  # stage -> optimizer-state bytes kept in host memory
        self.side_streams: dict[int, int] = {}  # device -> its stream for `Step.own_stream` collectives
        self.sync = SyncEmitter(self)
        self._templates()
        self._devices()

    # -- setup -------------------------------------------------------------------------------
    def _templates(self) -> None:
        p = chunk_passes(self.x.model, self.s, self.x.dtype, self.x.elementwise_time, self.x.entries, self.x.ranges,
                         self.boundary, self.dp_synced)
        self.fwd, self.bwd, self.buckets, self.ready = p.fwd, p.bwd, p.buckets, p.ready
        self.bwd_split, self.fwd_units, self.bwd_units, self.kept = p.bwd_split, p.fwd_units, p.bwd_units, p.kept
        self.last_block, self.unit_off, self.recomp, self.act = p.last_block, p.unit_off, p.recomp, p.act

    def dp_synced(self, e: LayerEntry) -> bool:
        """Parameters reduced across data-parallel replicas (not those of layers split over them)."""
        return e.params > 0 and e.tp_degree == self.s.tp

    def _devices(self) -> None:
        x, s, lay = self.x, self.s, self.x.layout
        self.dev: dict[tuple[int, int, int], int] = {}
        self.cstream: list[int] = []
        self.mstream: list[int] = []
        mult = (s.dp // len(self.dps)) * (s.tp // len(self.tps)) * s.domain
        for stage in range(self.p):
            chunks = [c * self.p + stage for c in range(self.v)]
            params = sum(e.params for k in chunks for e in self.chunk_entries[k])
            synced = sum(e.params for k in chunks for e in self.chunk_entries[k] if self.dp_synced(e))
            params += self._tied_copy(chunks)
            shard = len(lay.shard_group(0, 0, stage)) if s.hybrid_shard else s.dp_cp
            grad = buffer_element_bytes(s, x.dtype)
            states = model_state_bytes(synced, x.dtype, s.optimizer, s.zero, shard, grad)
            expert = expert_params_of([e for k in chunks for e in self.chunk_entries[k]])
            states = expert_states(states, expert, x.dtype, s.optimizer, s.zero, shard, s.ep, grad)
            local = model_state_bytes(params - synced, x.dtype, s.optimizer, 0, 1, grad)
            static = [(k, states[k] + local[k]) for k in ("weights", "gradients", "optimizer")]
            if offloads_optimizer(s.offload):  # in host memory; on the device only for its step
                self.offloaded[stage] = static[2][1]
                static[2] = ("optimizer", 0.0)
            static.append(("error_feedback", error_feedback_bytes(s.compression, synced)))
            workspace = max((e.workspace for k in chunks for e in self.chunk_entries[k]), default=0.0)
            static.append((WORKSPACE, workspace))
            for d in self.dps:
                for t in self.tps:
                    rank = lay.rank(d, t, stage)
                    i = len(self.g.devices)
                    self.g.devices.append(SimDevice(f"rank{rank} (dp{d} tp{t} pp{stage})", rank, stage, mult,
                                                    x.capacity, tuple(static)))
                    self.dev[(d, t, stage)] = i
                    self.cstream.append(self.g.add_stream(f"rank{rank} compute", i, "compute"))
                    self.mstream.append(self.g.add_stream(f"rank{rank} comm", i, "comm"))

    def _tied_copy(self, chunks: list[int]) -> int:
        """Parameters of weights tied to a layer on another stage (Megatron keeps a copy of the word
        embedding on the last stage and all-reduces its gradient with the first stage)."""
        mine = {e.name for k in chunks for e in self.chunk_entries[k]}
        extra = 0
        for k in chunks:
            for e in self.chunk_entries[k]:
                tied = self.x.model.layers[e.index].attrs.get("tied_to") if e.type == "linear" else None
                if tied and tied not in mine:
                    target = next(t for t in self.x.entries if t.name == tied)
                    extra += target.params
        return extra

    # -- pricing -----------------------------------------------------------------------------
    def price(self, op: str, nbytes: float, ranks: list[int], tier: str | None = None,
              per_node: int | None = None, messages: tuple = ()) -> Estimate:
        lay = self.x.layout
        tier = tier or self.x.pricer.tier(ranks)
        per_node = per_node or lay.ranks_per_node(ranks)
        key = (op, nbytes, len(ranks), tier, per_node) + ((messages, ranks[0]) if messages else ())
        if self.placed and tier != INTRA:  # on a shared network the price depends on where the group sits
            key += tuple(ranks)
        est = self.price_cache.get(key)
        if est is None:
            est = self.price_cache[key] = self._sendrecv(nbytes, ranks) if op == "sendrecv" else \
                halo_time(messages, ranks, self.x.pricer.p2p) if op == "halo" else \
                self.x.pricer.collective(op, nbytes, ranks)
        return est

    def _sendrecv(self, nbytes: float, ranks: list[int]) -> Estimate:
        """Every member of a ring sends `nbytes` to the next and receives from the previous at once
        (one port out, one in per rank, no contention): the slowest hop's point-to-point time."""
        hops = [self.x.pricer.p2p(nbytes, a, b) for a, b in zip(ranks, ranks[1:] + ranks[:1])]
        return max(hops, key=lambda e: e.seconds)

    def port(self, device: int, tier: str, direction: str) -> int:
        key = (device, tier, direction)
        pid = self.ports.get(key)
        if pid is None:
            pid = self.ports[key] = self.g.add_port(f"{self.g.devices[device].name} {tier} {direction}",
                                                    device, tier, direction)
        return pid

    def group_ranks(self, kind: str, d: int, t: int, stage: int) -> list[int]:
        lay = self.x.layout
        if kind == EP:
            return ep_group(lay, self.s.ep, d, t, stage)
        if kind == EDP:
            return edp_group(lay, self.s.ep, d, t, stage)
        if kind in ("cp", SPATIAL):
            return lay.cp_group(d, t, stage)
        if kind == "shard":
            return lay.shard_group(d, t, stage)
        if kind == "replica":
            return lay.replica_group(d, t, stage)
        return lay.tp_group(d, stage) if kind == "tp" else lay.dp_group(t, stage)

    def _group_info(self, kind: str, pos: tuple[int, int, int]) -> tuple[list[int], str, int, tuple[int, int]]:
        """(ranks, tier, ranks per node, this device's ports on that tier) of a position's group."""
        key = (kind,) + pos
        info = self.group_cache.get(key)
        if info is None:
            ranks = self.group_ranks(kind, *pos)
            tier = self.x.pricer.tier(ranks)
            device = self.dev[pos]
            info = (ranks, tier, self.x.layout.ranks_per_node(ranks),
                    (self.port(device, tier, "out"), self.port(device, tier, "in")))
            self.group_cache[key] = info
        return info

    def collective(self, name: str, op: str, nbytes: float, kind: str, pos: tuple[int, int, int], key: tuple,
                   stream: int, deps: list[int], label: tuple, messages: tuple = ()) -> int:
        """A collective task for position `pos` = (dp, tp, stage) over its `kind` group ("tp" or "dp").
        Solo (priced, holding this device's ports) when that group is not simulated explicitly,
        else a member of a group joined by `key`."""
        plan_key = (op, nbytes, kind, pos) if not messages else None
        plan = self.collective_plans.get(plan_key) if plan_key is not None else None
        if plan is None:
            plan = self._collective_plan(op, nbytes, kind, pos, messages)
            if plan_key is not None:
                self.collective_plans[plan_key] = plan
        ranks, device, info, est, ports, explicit = plan
        if est is None:
            return self.g.add(name, device, stream, 0.0, COMM, deps, label=label, info=dict(info))
        if not explicit:
            return self.g.add(name, device, stream, est.seconds, COMM, deps, source=est.source, ports=ports,
                              label=label, info=dict(info))
        tid = self.g.add(name, device, stream, est.seconds, COMM, deps, source=est.source, label=label,
                         info=dict(info))
        gkey = (kind, op, nbytes, tuple(ranks)) + key
        members = self.pending.setdefault(gkey, [])
        members.append(tid)
        if len(members) == self._simulated(kind, ranks):
            self._close_group(gkey, members, op, nbytes, ranks, est, kind)
        return tid

    def _collective_plan(self, op: str, nbytes: float, kind: str, pos: tuple[int, int, int],
                         messages: tuple) -> tuple:
        """What `collective` adds for an op of so many bytes over position `pos`'s `kind` group,
        whatever the micro-batch (kept per builder): (ranks, device, info, estimate or None for a group
        of one, ports, whether its members are simulated one by one)."""
        ranks, tier, per_node, ports = self._group_info(kind, pos)
        info = {"op": op_label(op), "bytes": nbytes, "group": kind, "ranks": len(ranks)}
        if len(ranks) == 1:
            return ranks, self.dev[pos], info, None, ports, False
        est = self.price(op, nbytes, ranks, tier, per_node, messages)
        info.update(tier=tier, source=est.source.value)
        return ranks, self.dev[pos], info, est, ports, self._explicit(kind)

    def _flows(self) -> bool:
        """Whether transfers run as flows on the shared network's links (`ClusterPricer.flows`)."""
        return bool(getattr(self.x.pricer, "flows", False))

    def _flow(self, src: int, dst: int, tier: str, wire: float) -> tuple[tuple[int, ...], float, float]:
        """(links, wire, rate) of a transfer from rank `src` to rank `dst`: its route on the shared
        network when transfers run as flows there, else none."""
        if tier != INTER or not self._flows():
            return (), 0.0, 0.0
        pricer = self.x.pricer
        links = pricer.route(src, dst)
        if not links:
            return (), 0.0, 0.0
        self.g.links = pricer.links
        return links, wire, pricer.rate(tier)

    def _simulated(self, kind: str, ranks: list[int]) -> int:
        """Members of a group simulated one by one: all of a tp group; of a data-parallel group (dp,
        shard, replica) those at their cp ring's rank 0, which stands for its ring."""
        tp, cp = self.s.tp, self.s.domain
        if kind == "tp" or cp == 1:
            return len(ranks)
        return sum(1 for r in ranks if (r // tp) % cp == 0)

    def _explicit(self, kind: str) -> bool:
        """Whether a group's members are simulated one by one (the ranks of a cp ring never are:
        they are identical under load balancing, so one stands for all)."""
        if kind in ("cp", SPATIAL):
            return False
        return self.x.explicit_tp if kind == "tp" else self.x.explicit_dp

    def _close_group(self, gkey, members, op, nbytes, ranks, est, kind) -> None:
        devices = [self.g.tasks[m].device for m in members]
        tier = self.x.pricer.tier(ranks)
        ports = tuple(sorted(self.port(dv, tier, dr) for dv in devices for dr in ("out", "in")))
        messages = ()
        if self.x.expand:
            transfers = self.x.pricer.expand(op, nbytes, ranks)
            if transfers is not None:
                messages = tuple(Message(devices[tr.src], devices[tr.dst], tr.nbytes, tr.duration, tr.deps,
                                         (self.port(devices[tr.src], INTRA if tr.intra else tier, "out"),
                                          self.port(devices[tr.dst], INTRA if tr.intra else tier, "in")),
                                         tr.hold, tr.recv_hold,
                                         *self._flow(ranks[tr.src], ranks[tr.dst], INTRA if tr.intra else tier,
                                                     tr.wire))
                                 for tr in transfers)
        self.g.add_group(members, est.seconds, ports, messages)
        del self.pending[gkey]

    # -- ops ---------------------------------------------------------------------------------
    def _busy_tiers(self, pos: tuple[int, int, int]) -> set[str]:
        """Link tiers this device uses outside its compute stream (p2p, gradient and tied syncs)."""
        d, t, stage = pos
        lay, pricer = self.x.layout, self.x.pricer
        me = lay.rank(*pos)
        tiers = set()
        if self.p > 1:
            for other in ((stage + 1) % self.p, (stage - 1) % self.p):
                tiers.add(pricer.tier([me, lay.rank(d, t, other)]))
        if self.s.dp_cp > 1:
            tiers.add(pricer.tier(lay.dp_group(t, stage)))
            if self.s.hybrid_shard:
                tiers.add(pricer.tier(lay.shard_group(d, t, stage)))
        if self.s.ep > 1:  # expert gradients on the communication stream
            tiers.add(pricer.tier(edp_group(lay, self.s.ep, d, t, stage)))
        return tiers

    def _fusable(self, steps: list[Step], pos: tuple[int, int, int]) -> bool:
        """Whether a step list can run as one task: its collectives are priced (not simulated member by
        member) and their ports are used by nothing else on the device, so nothing can come between."""
        busy = self.busy_cache.get(pos)
        if busy is None:
            busy = self.busy_cache[pos] = self._busy_tiers(pos)
        for st in steps:
            if st.kind != "compute":
                explicit = self._explicit(st.group)
                ranks, tier, _, _ = self._group_info(st.group, pos)
                if len(ranks) > 1 and (explicit or tier in busy):
                    return False
        return True

    def _fused_parts(self, steps: list[Step], pos: tuple[int, int, int]) -> tuple | None:
        """(parts, ports) of `steps` run as one task on `pos`, or None when they cannot fuse; cached
        per step list and position (the same lists are instantiated for every micro-batch)."""
        key = (id(steps), pos)
        out = self.fuse_cache.get(key, False)
        if out is not False:
            return out
        out = None
        if len(steps) > 1 and self._fusable(steps, pos):
            out = self._fuse(steps, pos)
        self.fuse_cache[key] = out
        return out

    def _fuse(self, steps: list[Step], pos: tuple[int, int, int]) -> tuple:
        return fuse_steps(steps, lambda group: self._group_info(group, pos), self.price, self.x.overlap_slowdown)

    def _emit_fused(self, fused: tuple, pos: tuple[int, int, int], label: tuple, deps: list[int]) -> int:
        parts, ports, rigid, info = fused
        name = f"{label[0]} chunk{label[1]} mb{label[2]}"
        device = self.dev[pos]
        return self.g.add(name, device, self.cstream[device], 0.0, COMPUTE if label[0] != "R" else RECOMPUTE,
                          list(deps), ports=ports, label=label, parts=parts, rigid=rigid, part_info=info)

    def emit(self, steps: list[Step], pos: tuple[int, int, int], label: tuple, deps: list[int],
             hooks: StepHooks | None = None) -> tuple[int, int]:
        """Instantiate a step list on device `pos`; returns (first task, last task)."""
        device = self.dev[pos]
        cs = self.cstream[device]
        if hooks is None:
            if len(steps) > 1:
                fused = self._fused_parts(steps, pos)
                if fused is not None:
                    tid = self._emit_fused(fused, pos, label, deps)
                    return tid, tid
            chain = self.chains.get((id(steps), pos), False)
            if chain:
                return self.g.add_chain(chain, device, cs, deps, label)
        first = last = -1
        beside: list[int] = []  # collectives running beside the previous step, which the next waits for
        for i, st in enumerate(steps):
            step_deps = (list(deps) if first < 0 else []) + beside
            beside = []
            if hooks is not None:
                step_deps += hooks.before(st)
            if st.kind == "overlap":  # its collective also waits for the step before it on the compute stream
                last, beside = self._emit_overlap(st, pos, label, i, step_deps, last)
            elif st.kind == "compute":
                last = self.g.add(f"{label[0]} {st.name} mb{label[2]}", device, cs, st.duration, st.category,
                                  step_deps, label=label, info={"layers": st.name})
                self.g.tasks[last].measured = _kernel_share(st)
            else:
                c = st.collective
                last = self.collective(f"{label[0]} {st.name} mb{label[2]}", c.op, c.nbytes, st.group, pos,
                                       label + (i,), cs, step_deps, label, c.messages)
            if first < 0:
                first = last
            if hooks is not None:
                hooks.after(st, last)
        if beside:  # the pass ends when the collectives beside its last kernels end
            last = self.g.add(f"{label[0]} join mb{label[2]}", device, cs, 0.0, COMPUTE, beside, label=label)
        if hooks is None and (id(steps), pos) not in self.chains:
            self.chains[(id(steps), pos)] = self._chain(steps, pos)
        return first, last

    def _chain(self, steps: list[Step], pos: tuple[int, int, int]) -> tuple | None:
        """What `emit` made of `steps` on `pos` without hooks, as `TaskGraph.add_chain` makes it again for
        the next micro-batches: one task per step on the compute stream, each collective priced alone
        (none simulated member by member, no overlap step, no halo messages); None otherwise. Read
        from the plans and prices the first instantiation left, so that making it adds no port and
        prices nothing."""
        chain = []
        for st in steps:
            if st.kind == "compute":
                chain.append((st.name, st.duration, st.category, _kernel_share(st), (), {"layers": st.name}))
                continue
            c = st.collective
            plan = self.collective_plans.get((c.op, c.nbytes, st.group, pos)) if st.kind == "collective" else None
            if plan is None or c.messages:
                return None
            _, _, info, est, ports, explicit = plan
            if est is None:
                chain.append((st.name, 0.0, COMM, 0.0, (), info))
            elif explicit:
                return None
            else:
                chain.append((st.name, est.seconds, COMM, measured_fraction(est.source), ports, info))
        return tuple(chain)

    def _emit_overlap(self, st: Step, pos: tuple[int, int, int], label: tuple, i: int,
                      deps: list[int], previous: int = -1) -> tuple[int, list[int]]:
        """A compute run on the compute stream and a collective on the communication stream, started
        together; the compute run is stretched by the overlap's slowdown (`dlsim.cost.overlap`)."""
        device = self.dev[pos]
        c = st.collective
        ranks, tier, per_node, _ = self._group_info(st.group, pos)
        comm = self.price(c.op, c.nbytes, ranks, tier, per_node, c.messages).seconds if len(ranks) > 1 else 0.0
        extra = overlap_cost(st.duration, comm, st.sigma(self.x.overlap_slowdown))[0]
        parts = ((st.category, st.duration, st.measured), (COMM, extra, 0.0)) if extra > 0 else ()
        name = f"{label[0]} {st.name} mb{label[2]}"
        # the kernels' slowdown beside this collective is priced here: the engine must not slow them again
        kernels = self.g.add(name, device, self.cstream[device], st.duration, st.category, list(deps), label=label,
                             parts=parts, rigid=(0,) if comm > 0 else (), info={"layers": st.name},
                             part_info=({"layers": st.name}, {"op": c.op, "why": c.why, "bytes": c.nbytes,
                                                              "exposed_beside": st.name}) if parts else ())
        stream = self.own_stream(device) if st.own_stream else self.mstream[device]
        tid = self.collective(f"{name} {c.why}", c.op, c.nbytes, st.group, pos, label + (i,), stream,
                              list(deps) + ([previous] if previous >= 0 else []), label, c.messages)
        return kernels, [tid]

    def own_stream(self, device: int) -> int:
        """The device's stream for collectives of their own (`Step.own_stream`: Transformer Engine's
        userbuffer streams), made when first needed."""
        sid = self.side_streams.get(device)
        if sid is None:
            sid = self.side_streams[device] = self.g.add_stream(f"{self.g.devices[device].name} tp overlap", device,
                                                                "comm")
        return sid

    def build(self) -> TaskGraph:
        s = self.s
        self.g.overlap_slowdown = self.x.overlap_slowdown
        self.fwd_first: dict[tuple, int] = {}
        self.fwd_last: dict[tuple, int] = {}
        self.bwd_first: dict[tuple, int] = {}
        self.bwd_last: dict[tuple, int] = {}
        self.ops = [stage_ops(s.schedule, self.p, self.m, self.v, stage) for stage in range(self.p)]
        for stage in range(self.p):
            ops = self.ops[stage]
            last_b = {}
            for n, op in enumerate(ops):
                if op.kind == BACKWARD:
                    last_b[op.chunk] = n
            for d in self.dps:
                for t in self.tps:
                    self._device_program((d, t, stage), ops, last_b)
        emit_transfers(self)
        return self.g

    def host_copy(self, pos: tuple[int, int, int], direction: str, nbytes: float, deps: list[int], name: str,
                  mem_start: tuple = (), mem_end: tuple = ()) -> int:
        """A copy between device and host memory over the host link, on the device's stream for that
        direction ("in": host to device, "out": device to host; one copy engine each, FIFO)."""
        device = self.dev[pos]
        stream = self.host_streams.get((device, direction))
        if stream is None:
            stream = self.host_streams[(device, direction)] = self.g.add_stream(
                f"{self.g.devices[device].name} host {'H2D' if direction == 'in' else 'D2H'}", device, "link")
        est = host_transfer(self.x.host, nbytes)
        return self.g.add(name, device, stream, est.seconds, COMM, [x for x in deps if x >= 0], source=est.source,
                          label=("H", direction), mem_start=mem_start, mem_end=mem_end,
                          info={"op": "host copy", "bytes": nbytes, "source": est.source.value})

    def _device_program(self, pos, ops, last_b) -> None:
        s, (d, t, stage) = self.s, pos
        device = self.dev[pos]
        last_compute = -1
        sync = self.sync.start(pos)
        offload = offloads_activations(s.offload)
        saved_out: dict[tuple[int, int], int] = {}  # (chunk, micro-batch) -> its activations' copy to the host
        in_units: dict[tuple[int, int], UnitOffload] = {}  # offloaded one unit at a time inside the passes
        prev_first = -1
        for n, op in enumerate(ops):
            k = op.chunk * self.p + stage
            i = op.microbatch
            kept, fwd_extra, re_extra = self.act[k]
            if op.kind == FORWARD:
                hooks = sync.hooks(k, i, FORWARD, False)
                steps = self.fwd_units[k] if hooks is not None else self.fwd[k]
                following = ops[n + 1] if n + 1 < len(ops) else None
                adjacent = following is not None and following.kind == BACKWARD and following.chunk == op.chunk \
                    and following.microbatch == i
                units = self.unit_off[k] if offload and adjacent else None
                if units is not None:
                    unit = in_units[(k, i)] = UnitOffload(units[0], lambda *a, **kw: self.host_copy(pos, *a, **kw),
                                                          self.g, f"chunk{k} mb{i}", hooks)
                    first, last = self.emit(units[1], pos, ("F", k, i), sync.before_op(), unit)
                else:
                    first, last = self.emit(steps, pos, ("F", k, i), sync.before_op(), hooks)
                self.g.tasks[first].mem_start += ((ACTIVATIONS, (kept if units is None else 0.0) + fwd_extra),)
                if fwd_extra:
                    self.g.tasks[last].mem_end += ((ACTIVATIONS, -fwd_extra),)
                self.fwd_first[(d, t, k, i)], self.fwd_last[(d, t, k, i)] = first, last
                sync.after_op(first, last, hooks)
                if offload and kept > 0 and not adjacent:
                    saved_out[(k, i)] = self.host_copy(pos, "out", kept, [last], f"D2H activations chunk{k} mb{i}",
                                                       mem_end=((ACTIVATIONS, -kept),))
            else:
                deps = [self.fwd_last[(d, t, k, i)]] + sync.before_op()
                if (k, i) in saved_out:  # fetched back, prefetched from the start of the op before
                    deps.append(self.host_copy(pos, "in", kept, [saved_out.pop((k, i)), prev_first],
                                               f"H2D activations chunk{k} mb{i}", mem_start=((ACTIVATIONS, kept),)))
                first = -1
                if self.recomp[k]:
                    first, rlast = self.emit(self.recomp[k], pos, ("R", k, i), deps)
                    if re_extra:
                        self.g.tasks[first].mem_start += ((ACTIVATIONS, re_extra),)
                    deps = []
                producing = n == last_b[op.chunk]
                hooks = sync.hooks(k, i, BACKWARD, producing)
                if hooks is None:
                    steps = self.bwd[k]
                elif s.zero == 3:
                    steps = self.bwd_units[k]
                else:
                    steps = self.bwd_split[k]
                unit = in_units.pop((k, i), None)
                if unit is not None:
                    unit.start_backward(hooks)
                    bfirst, last = self.emit(self.unit_off[k][2], pos, ("B", k, i), deps, unit)  # type: ignore[index]
                    unit.close()
                else:
                    bfirst, last = self.emit(steps, pos, ("B", k, i), deps, hooks)
                first = bfirst if first < 0 else first
                freed = (kept if unit is None else 0.0) + (re_extra if self.recomp[k] else 0.0)
                self.g.tasks[last].mem_end += ((ACTIVATIONS, -freed),)
                self.bwd_first[(d, t, k, i)], self.bwd_last[(d, t, k, i)] = first, last
                sync.after_op(first, last, hooks)
            last_compute = self.g.orders[self.cstream[device]][-1]
            prev_first = first
        sync.finish(last_compute)


def _kernel_share(st: Step) -> float:
    """The share of a compute step's duration priced from measured (or interpolated) tables."""
    return st.measured / st.duration if st.duration > 0 and st.measured else 0.0


def build_iteration(x: IterationInputs) -> TaskGraph:
    """The task graph of one iteration (see the module docstring)."""
    builder = _Builder(x)
    try:
        return builder.build()
    finally:
        # the emitter points back at the builder: unlinked, both are freed as soon as the graph is
        # returned, by reference counting, instead of waiting for the cyclic collector
        builder.sync = None
