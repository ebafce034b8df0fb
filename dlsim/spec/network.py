"""The network between nodes as data: what a link tier's `topology` describes beyond one switch.

A `Fabric` names a topology family and its shape; `dlsim.cost.fabric` builds its links and routes
flows over them. Every family attaches nodes (or, rail-optimised, each device's NIC) to the network
at the tier's own bandwidth and says which shared links lie between two endpoints:

* ``switch`` (and every intra-node kind: ``nvswitch``, ``fully-connected``): one non-blocking switch,
  no shared link; the only limit is each device's port (the tier's bandwidth).
* ``fat-tree`` (Leiserson 1985; the folded Clos of InfiniBand clusters): `levels` from the leaves up,
  each a switch's `fanout` (nodes under a leaf, switches of the level below otherwise) and its
  `oversubscription` (bandwidth down / bandwidth up, 1 = non-blocking); above the last level a
  non-blocking core joins the top switches.
* ``rail-optimized`` (NVIDIA DGX SuperPOD): the same levels, but NIC r of every node of a leaf group
  ("scalable unit") hangs off the leaf switch of rail r; NCCL's PXN moves data over NVLink to the GPU
  on the destination's rail first, so a flow travels on the rail of its destination device.
* ``torus`` (Blue Gene, TPU pods, Fugaku's Tofu): nodes at the points of a `dims` torus, neighbours
  joined by links of `link_bandwidth` each way, dimension-order routing, shorter way round.
* ``dragonfly`` (Kim, Dally, Scott, Abts, ISCA 2008; Cray XC's Aries): `nodes_per_router` nodes on a
  router, `routers_per_group` routers in a group, each router with `global_links` links of
  `global_bandwidth` to other groups. Adaptive routing (UGAL; Aries routes adaptively at every level)
  spreads a flow over the group's direct and two-hop paths and over all the group's global links, so
  a group is non-blocking inside and its global links are shared by all the traffic leaving (and
  entering) it.

All bandwidths are bytes/s per direction (SI); a profile gives them with their unit in the key name
(`dlsim.io.profile_yaml`).
"""

from __future__ import annotations

from dataclasses import dataclass

NON_BLOCKING = ("switch", "nvswitch", "fully-connected")
"""Kinds that are one non-blocking crossbar: no shared link between two ports."""

FABRICS = ("fat-tree", "rail-optimized", "torus", "dragonfly")
"""Kinds with shared links that concurrent flows divide (`dlsim.cost.fabric`)."""


@dataclass(frozen=True)
class TreeLevel:
    """One level of a fat-tree: children per switch, and down / up bandwidth of its switches."""

    fanout: int
    oversubscription: float = 1.0


@dataclass(frozen=True)
class Fabric:
    """A topology family and its shape (module doc). `kind` is one of `NON_BLOCKING` or `FABRICS`."""

    kind: str = "switch"
    levels: tuple[TreeLevel, ...] = ()
    dims: tuple[int, ...] = ()
    link_bandwidth: float = 0.0
    nodes_per_router: int = 0
    routers_per_group: int = 0
    global_links: int = 0
    global_bandwidth: float = 0.0
    source: str = ""

    @property
    def shared(self) -> bool:
        """Whether concurrent flows can oversubscribe a link of this network: a torus, a dragonfly, a
        fat-tree with a level whose switches have less bandwidth up than down (a non-blocking one prices
        as one switch)."""
        if self.kind in ("fat-tree", "rail-optimized"):
            return any(level.oversubscription > 1 for level in self.levels)
        return self.kind in FABRICS

    def describe(self) -> str:
        """One line for notes and summaries."""
        if self.kind in ("fat-tree", "rail-optimized"):
            levels = ", ".join(f"{lv.fanout} per switch at {lv.oversubscription:g}:1" for lv in self.levels)
            return f"{self.kind} ({levels})" if levels else self.kind
        if self.kind == "torus":
            return f"torus {'x'.join(str(d) for d in self.dims)}"
        if self.kind == "dragonfly":
            return f"dragonfly ({self.nodes_per_router} nodes per router, groups of {self.routers_per_group} routers)"
        return self.kind
