"""The per-message prices the collective formulas are written in: T(s), S(s) and the reduction r(s).

    T(s)  time of one message of s bytes (Hockney, LogP or LogGP; `dlsim.cost.p2p`)
    S(s)  injection gap between back-to-back messages at one port (S ≤ T)
    r(s)  = γ·s, the time to combine s received bytes; γ is seconds per byte of reduction compute
          (Dryden's γ, S003), normally 1 / `Cluster.reduce_bandwidth`; None means free reduction.

Every closed form in this package is a sum of these terms over the steps of its schedule, so the
same function serves scalars and NumPy arrays.

Nodes. When a group of p ranks lies g per node on N = p/g ≥ 2 nodes (node-contiguous, as NCCL and
MPI lay ranks out) the prices also know what crosses each NIC. A tier's bandwidth B_dev is per
device with every device of a node using it (node NIC bandwidth / devices per node), so the g ranks
of the group own g·B_dev of their node's NICs. One flow per node — a node-contiguous ring's or a
node-level tree's single inter-node hop, which NCCL spreads over several channels so that all of
the node's NICs carry it [doc: NCCL environment variables NCCL_MIN_NCHANNELS / NCCL_CROSS_NIC;
Sanders et al. 2009 for the trees] — therefore moves at

    B_node = min(g·B_dev, B_intra)     (the intra-node hops of the same step run at B_intra)

with the inter tier's start-up α. `Costs.node` prices that flow (`T_node(s)`); steps in which all
g ranks of a node send across at once share the NIC and stay on `main` (B_dev each).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dlsim.cost.p2p import Bytes, PointToPoint, p2p_model
from dlsim.errors import SpecError
from dlsim.spec.cluster import LinkTier


@dataclass(frozen=True)
class Costs:
    """Prices for one collective call: the main tier, the intra-node tier and γ; with `node` (one flow
    per node at B_node, module doc) and `ranks_per_node` g when the group spans nodes."""

    main: PointToPoint
    intra: PointToPoint
    gamma: float = 0.0
    node: PointToPoint | None = None
    ranks_per_node: int = 1

    def spans(self, p):
        """Whether p ranks lie g per node on ≥ 2 nodes with a node model (vectorised in p)."""
        g = self.ranks_per_node
        if self.node is None:
            return np.zeros(np.shape(p), dtype=bool) if np.ndim(p) else False
        if isinstance(p, int):
            return p % g == 0 and p >= 2 * g
        q = np.asarray(p)
        out = (q % g == 0) & (q >= 2 * g)
        return out if np.ndim(p) else bool(out)

    def flat(self) -> "Costs":
        """The same prices without node awareness (for the per-node-index groups inside hierarchical)."""
        return replace(self, node=None, ranks_per_node=1) if self.node is not None else self

    def node_step(self, s: Bytes, reduce: bool = False) -> Bytes:
        """One step of a node-contiguous pattern: one flow per node across (T_node), the rest on the
        intra-node tier at the same time: max(T_node(s), T_intra(s)) (+ r(s))."""
        t = np.maximum(self.node.time(s), self.intra.time(s))
        return t + self.r(s) if reduce else t

    def t(self, s: Bytes, intra: bool = False) -> Bytes:
        return (self.intra if intra else self.main).time(s)

    def gap(self, s: Bytes, intra: bool = False) -> Bytes:
        return (self.intra if intra else self.main).spacing(s)

    def r(self, s: Bytes) -> Bytes:
        return self.gamma * s

    def step(self, s: Bytes, reduce: bool = False, intra: bool = False) -> Bytes:
        """One step in which every active rank sends and receives at most one message of s bytes."""
        return self.t(s, intra) + self.r(s) if reduce else self.t(s, intra)


def node_link(link: LinkTier, intra: LinkTier, ranks_per_node: int) -> LinkTier:
    """The inter tier as one flow per node sees it: B_node = min(g·B_dev, B_intra) (module doc)."""
    rate = min(ranks_per_node * link.effective_bandwidth, intra.effective_bandwidth)
    return replace(link, name=f"{link.name} x{ranks_per_node} (node)", bandwidth=rate, bandwidth_efficiency=1.0)


def make_costs(link: LinkTier, *, gamma: float | None = None, intra: LinkTier | None = None,
               model: "str | PointToPoint" = "auto", ranks_per_node: int | None = None,
               contention: float = 1.0) -> Costs:
    """`Costs` from link tiers; `gamma` in seconds per byte (None: reductions are free).

    `model` is a p2p model name, or a ready `PointToPoint` (e.g. `p2p.table_model` of measured
    times) that prices the main tier instead of `link`'s parameters. With `intra` given, a
    different `link` (the inter tier) and `ranks_per_node` g ≥ 2, the costs know the nodes
    (`Costs.node`, module doc); token-bucket links keep the per-device prices. `contention` ≥ 1
    multiplies the per-byte time of the main tier and of the node flows (`PointToPoint.slowed`:
    the share of a shared network the call gets, `dlsim.plan.contention`); the intra-node tier keeps
    its own.
    """
    g = 0.0 if gamma is None else float(gamma)
    if not np.isfinite(g) or g < 0:
        raise SpecError(f"gamma must be a finite non-negative number of seconds per byte, got {gamma!r}", field="gamma")
    if not np.isfinite(contention) or contention < 1:
        raise SpecError(f"contention must be a finite factor >= 1, got {contention!r}", field="contention")
    if isinstance(model, PointToPoint):
        main = model.slowed(contention)
        inner = p2p_model(intra) if intra is not None else main
        return Costs(main, inner, g)
    main = p2p_model(link, model)
    inner = p2p_model(intra, main.model if model == "auto" else model) if intra is not None else main
    main = main.slowed(contention)
    g_node = ranks_per_node or 1
    if intra is None or intra == link or g_node < 2 or link.burst > 0 or intra.burst > 0:
        return Costs(main, inner, g)
    node = p2p_model(node_link(link, intra, g_node), main.model).slowed(contention)
    return Costs(main, inner, g, node, g_node)
