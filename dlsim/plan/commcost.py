"""Communication prices for the task graph from a cluster profile, through `dlsim.cost.collectives`.

A group of ranks on one node uses the intra-node tier, otherwise the inter-node tier (with the
intra-node tier for the hierarchical algorithm and `ranks_per_node` from the rank layout). The
strategy's `collective` names the algorithm (auto: the cheapest by closed form, as NCCL's tuner
picks); where a collective has no algorithm of that name, auto is used for it. Reductions cost
γ = 1 / `Cluster.reduce_bandwidth` seconds per byte. Point-to-point transfers use the tier's
point-to-point model (`dlsim.cost.p2p`: LogGP when the tier has an overhead or gap, else Hockney).

Groups that span nodes are priced knowing the nodes (`dlsim.cost.collectives.costs`): g group
members per node own g/devices_per_node of the node's NICs, a node-contiguous ring or tree puts one
flow per node on them, hierarchical algorithms split intra- and inter-node work.

Shared networks: on an inter-node tier with a fabric (`LinkTier.fabric`: fat-tree with oversubscribed
levels, rail-optimised, torus, dragonfly) a collective or transfer that crosses nodes is slowed by
the concurrent copies of itself that share the network's links (`dlsim.plan.contention`); the
algorithm `auto` picks is the one it would pick alone (NCCL's tuner does not see the other jobs'
flows). With `flows` (the simulation's `--expand-collectives`) transfers and expanded collectives
are priced alone and carry their route instead: the event engine shares the links between the
flows actually in flight (`dlsim.sim.engine`).

Measured collectives: with a profile's measured table (`measured`, from ``comm_collectives.csv``:
`dlsim calibrate comm` or imported nccl-tests output) a collective of a measured kind, rank count
and size range is priced from the table — the rows of the library's own choice (``default``) when
the strategy's algorithm is auto, else the rows of the named algorithm — measured or interpolated
in size (`dlsim.cost.collectives.measured`); anything else falls back to the model, and the
estimate's note says why.
"""

from __future__ import annotations

from typing import Any, Sequence

from dlsim.cost.collectives import ALGORITHMS, choose_algorithm, collective_time, expand_schedule, make_costs
from dlsim.cost.collectives.measured import MeasuredCollectives
from dlsim.cost.collectives.registry import applicable
from dlsim.cost.collectives.traffic import patterns
from dlsim.cost.fabric import Link
from dlsim.cost.p2p import p2p_model
from dlsim.errors import SpecError
from dlsim.plan.comm import INTER, INTRA, CommPricer, Layout, Transfer, parse_sparse_op
from dlsim.plan.contention import Contention
from dlsim.results import Estimate, Source
from dlsim.spec.cluster import Cluster, LinkTier

OP_NAMES = {"allreduce": "allreduce", "reduce_scatter": "reduce-scatter", "allgather": "allgather",
            "alltoall": "all-to-all", "broadcast": "broadcast", "reduce": "reduce"}
"""Ops of the task graph by the collective they are priced as; a sparse allreduce's op carries its
density and value size (`dlsim.plan.comm.sparse_op`)."""


class ClusterPricer:
    """`CommPricer` over a `Cluster` and a rank `Layout` (see the module docstring)."""

    def __init__(self, cluster: Cluster, layout: Layout, algorithm: str = "auto",
                 measured: MeasuredCollectives | None = None, flows: bool = False):
        known = {name for table in ALGORITHMS.values() for name in table} | {"auto"}
        if algorithm not in known:
            raise SpecError(f"unknown collective algorithm {algorithm!r} (use {', '.join(sorted(known))})",
                            field="collective")
        self.cluster, self.layout, self.algorithm = cluster, layout, algorithm
        self.measured = measured if measured else None
        self.gamma = 1.0 / cluster.reduce_bandwidth if cluster.reduce_bandwidth > 0 else None
        self._p2p = {tier: p2p_model(self.link(tier)) for tier in (INTRA, INTER)}
        shared = cluster.inter is not None and cluster.inter.fabric.shared
        self.contention = Contention(cluster, layout) if shared else None
        self.flows = flows and shared

    def with_flows(self) -> "ClusterPricer":
        """This pricer for a simulation that runs transfers as flows on the shared network (module doc)."""
        return ClusterPricer(self.cluster, self.layout, self.algorithm, self.measured, flows=True)

    @property
    def links(self) -> list[Link]:
        """The network's shared links routed so far (`route` adds to them); empty without a fabric."""
        return self.contention.net.links if self.contention is not None else []

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """The shared links (indices into `links`) a flow from rank `src` to rank `dst` crosses."""
        if self.contention is None:
            return ()
        per = self.cluster.devices_per_node
        return self.contention.net.route(src // per, src % per, dst // per, dst % per)

    def rate(self, tier: str) -> float:
        """A flow's rate alone on `tier`: its achievable bandwidth (the cap of `dlsim.cost.fairshare`)."""
        return self.link(tier).effective_bandwidth

    def link(self, tier: str) -> LinkTier:
        if tier == INTER and self.cluster.inter is not None:
            return self.cluster.inter
        return self.cluster.intra

    def tier(self, ranks: Sequence[int]) -> str:
        if self.cluster.inter is None:
            return INTRA
        return self.layout.tier(ranks)

    def _call(self, op: str, ranks: Sequence[int]) -> tuple[str, str, LinkTier, int | None]:
        name = OP_NAMES.get(op) or ("sparse-allreduce" if parse_sparse_op(op) is not None else None)
        if name is None:
            raise ValueError(f"unknown collective {op!r}")
        tier = self.tier(ranks)
        per_node = self.layout.ranks_per_node(ranks) if tier == INTER else None
        if per_node is not None and (per_node < 2 or len(ranks) % per_node):
            per_node = None
        algo = self.algorithm
        table = ALGORITHMS[name]
        if algo != "auto":
            entry = table.get(algo)
            from dlsim.cost.collectives.core import make_options
            if entry is None or not applicable(entry, len(ranks), make_options(ranks_per_node=per_node)):
                algo = "auto"
        return name, algo, self.link(tier), per_node

    def runs(self, op: str, ranks: Sequence[int]) -> str:
        """The algorithm a call of `op` over `ranks` runs: the strategy's, or auto where it does not apply."""
        return self._call(op, ranks)[1]

    def price_key(self, op: str, ranks: Sequence[int]) -> tuple | None:
        """What `collective(op, nbytes, ranks)` depends on besides `nbytes` and the cluster's links,
        reduction rate and measured table: the algorithm asked for, the op, the tier, the rank count,
        the ranks per node and, with a measured table, the nodes they span; None on a shared network
        (the price depends on where the ranks sit). Equal keys on clusters of one profile resized to
        other node counts give equal prices (`MemoPricer`'s shared memo)."""
        if self.contention is not None:
            return None
        tier = self.tier(ranks)
        per_node = self.layout.ranks_per_node(ranks) if tier == INTER else None
        nodes = len({self.layout.node(r) for r in ranks}) if self.measured is not None else None
        return (self.algorithm, op, tier, len(ranks), per_node, nodes)

    def collective(self, op: str, nbytes: float, ranks: Sequence[int]) -> Estimate:
        name, algo, link, per_node = self._call(op, ranks)
        sparse = parse_sparse_op(op) or {}
        if self.contention is not None and nbytes > 0 and len(ranks) > 1 and self.tier(ranks) == INTER:
            model = self._contended(name, algo, float(nbytes), ranks, link, per_node, sparse)
        else:
            model = collective_time(name, algo, float(nbytes), len(ranks), link, gamma=self.gamma,
                                    ranks_per_node=per_node, intra=self.cluster.intra, **sparse)
        if self.measured is None or nbytes <= 0 or len(ranks) < 2:
            return model
        table_algo = "default" if self.algorithm == "auto" else self.algorithm
        nodes = len({self.layout.node(r) for r in ranks})
        hit = self.measured.lookup(name, len(ranks), float(nbytes), table_algo, nodes)
        if hit is not None:
            return hit
        why = self.measured.describe_range(name, len(ranks), table_algo, nodes)
        return Estimate(model.seconds, model.source, f"{model.note}; {why}")

    def _contended(self, name: str, algo: str, nbytes: float, ranks: Sequence[int], link: LinkTier,
                   per_node: int | None, sparse: dict[str, float]) -> Estimate:
        """The closed form slowed by the call's concurrent copies on the shared network (module doc);
        `sparse` the density and value bytes of a sparse allreduce (`parse_sparse_op`)."""
        kw = dict(gamma=self.gamma, ranks_per_node=per_node, intra=self.cluster.intra, **sparse)
        chosen = choose_algorithm(name, nbytes, len(ranks), link, **kw) if algo == "auto" else algo

        def schedule_of(collective: str, algorithm: str, p: int):
            return expand_schedule(collective, algorithm, nbytes, p, link=link, **kw)
        factor, note = self.contention.collective(
            (name, chosen, per_node, *sorted(sparse.items())), ranks,
            lambda: patterns(name, chosen, len(ranks), per_node, schedule_of))
        est = collective_time(name, chosen, nbytes, len(ranks), link, contention=factor, **kw)
        base = est.note + (" chosen by auto" if algo == "auto" else "")
        return Estimate(est.seconds, est.source, f"{base}; {note}" if note else base)

    def p2p(self, nbytes: float, src: int, dst: int) -> Estimate:
        tier = self.tier([src, dst])
        model = self._p2p[tier]
        note = f"send {model.model} over {self.link(tier).name}"
        if self.contention is not None and tier == INTER and not self.flows and nbytes > 0:
            factor, why = self.contention.p2p(src, dst)
            if factor != 1.0:
                return Estimate(float(model.slowed(factor).time(float(nbytes))), Source.MODEL, f"{note}; {why}")
        return Estimate(float(model.time(float(nbytes))) if nbytes > 0 else 0.0, Source.MODEL, note)

    def expand(self, op: str, nbytes: float, ranks: Sequence[int]) -> list[Transfer] | None:
        name, algo, link, per_node = self._call(op, ranks)
        schedule = expand_schedule(name, algo, float(nbytes), len(ranks), link=link, gamma=self.gamma,
                                   ranks_per_node=per_node, intra=self.cluster.intra, **(parse_sparse_op(op) or {}))
        costs = make_costs(link, gamma=self.gamma, intra=self.cluster.intra)
        # on a token-bucket link (LinkTier.burst) each transfer is priced from a full bucket: the
        # simulator does not carry token state between transfers (collective() above does)
        out = []
        for m in schedule.messages:
            arrive, spacing, reduce = (float(costs.t(m.nbytes, m.intra)), float(costs.gap(m.nbytes, m.intra)),
                                       float(costs.r(m.reduce_bytes)))
            port = costs.intra if m.intra else costs.main
            wire = min(float(port.payload(m.nbytes)) * port.gap_per_byte, spacing)
            out.append(Transfer(m.src, m.dst, m.nbytes, arrive + reduce, m.deps, spacing, spacing + reduce, m.intra,
                                wire))
        return out

    def wire(self, nbytes: float, tier: str) -> float:
        """Seconds a point-to-point transfer of `nbytes` on `tier` moves bytes at its rate alone (payload × G,
        at most its whole time): the part a shared network stretches."""
        model = self._p2p[tier]
        return min(float(model.payload(float(nbytes))) * model.gap_per_byte, float(model.time(float(nbytes))))


class MemoPricer:
    """A `CommPricer` with its prices remembered: collective and point-to-point prices are pure
    functions of their arguments, and a sweep or a script asks for the same ones again and again
    (every bucket of every strategy with the same layout). Same prices, same events, same result;
    everything else is the wrapped pricer's. With `shared`, a memo of the pricers of one cluster
    profile's network (the same links, reduction rate and measured table, any node count: a sweep's
    cluster sizes), collective prices are kept there too under the wrapped pricer's `price_key`,
    where it has one."""

    def __init__(self, inner: CommPricer, shared: dict[tuple, Estimate] | None = None):
        self._inner = inner
        self._coll: dict[tuple, Estimate] = {}
        self._p2p: dict[tuple, Estimate] = {}
        self._shared = shared
        self._key = getattr(inner, "price_key", None) if shared is not None else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def collective(self, op: str, nbytes: float, ranks: Sequence[int]) -> Estimate:
        key = (op, float(nbytes), tuple(ranks))
        hit = self._coll.get(key)
        if hit is None:
            shared = self._key(op, ranks) if self._key is not None else None
            if shared is None:
                hit = self._inner.collective(op, nbytes, ranks)
            else:
                shared += (float(nbytes),)
                hit = self._shared.get(shared)  # type: ignore[union-attr]
                if hit is None:
                    hit = self._shared[shared] = self._inner.collective(op, nbytes, ranks)  # type: ignore[index]
            self._coll[key] = hit
        return hit

    def p2p(self, nbytes: float, src: int, dst: int) -> Estimate:
        key = (float(nbytes), src, dst)
        hit = self._p2p.get(key)
        if hit is None:
            hit = self._p2p[key] = self._inner.p2p(nbytes, src, dst)
        return hit
