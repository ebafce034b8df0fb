"""The shared links of a network between nodes and the route of every flow (`dlsim.spec.network`).

Endpoints are devices (node, local index). A node reaches the network through its devices' ports,
B_dev each (the tier's achievable bandwidth, `LinkTier.effective_bandwidth`), so a node injects at
most d·B_dev (d devices per node). Only links that concurrent flows can oversubscribe are built;
every other hop is one a flow's own port already limits (a non-blocking switch, a non-blocking
fat-tree level), so a network without such links prices exactly as one switch. Routing is
deterministic: the same pair of endpoints always takes the same links.

Fat-tree (`levels` from the leaves, fanout f_k and oversubscription o_k): a switch of level k
serves F_k = f_1·…·f_k nodes (node n under switch n // F_k); the link from it to level k + 1 carries,
each way,

    C_1 = f_1·E / o_1,   C_k = f_k·C_{k−1} / o_k        (E = d·B_dev per node)

and is built when o_k > 1 (with o_k = 1 it carries whatever its children can send). A flow climbs
from its source's leaf to the lowest level whose switch holds both ends (the non-blocking core
above the last level otherwise) and descends to the destination's leaf: up-links of the source's
switches, down-links of the destination's.

Rail-optimised (DGX SuperPOD): the same levels per rail, E = B_dev (one NIC per device); a flow
travels on the rail of its destination device (NCCL's PXN: NVLink to the GPU on the right rail
first, [NCCL 2.12 release notes, NCCL_PXN_DISABLE]), so rail r's switches carry only rail r.

Torus (`dims`, node n at coordinates n = x_0 + D_0·(x_1 + D_1·(…))): dimension-order routing,
each dimension the shorter way round (ties: upwards), every hop a link of `link_bandwidth`.

Dragonfly (Kim et al. 2008): router = node // p, group = router // R (R routers per group). Adaptive
routing (UGAL, Kim et al. §4; Aries routes adaptively at every level) spreads the traffic inside a
group over its direct and two-hop paths and the traffic leaving a group over all its global links,
so a group is non-blocking inside and the global links of a group act as one egress and one ingress
link of R·h·B_global each: every flow between two groups crosses its source group's egress and its
destination group's ingress.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlsim.errors import SpecError
from dlsim.spec.network import Fabric


@dataclass(frozen=True)
class Link:
    """One direction of a shared link (or of an aggregate of parallel links): its bytes/s."""

    name: str
    capacity: float


class FabricLinks:
    """The shared links of `fabric` over `nodes` nodes of `devices_per_node` devices, each device's port
    at `port` bytes/s (the tier's achievable bandwidth), and the route between two devices."""

    def __init__(self, fabric: Fabric, nodes: int, devices_per_node: int, port: float):
        self.fabric, self.nodes, self.per_node, self.port = fabric, nodes, devices_per_node, port
        self.links: list[Link] = []
        self._ids: dict[tuple, int] = {}
        self._routes: dict[tuple[int, int, int, int], tuple[int, ...]] = {}
        kind = fabric.kind
        if kind in ("fat-tree", "rail-optimized"):
            self._tree_setup()
        elif kind == "torus":
            if math.prod(fabric.dims) < nodes:
                raise SpecError(f"the torus {'x'.join(map(str, fabric.dims))} has {math.prod(fabric.dims)} nodes, "
                                f"the job needs {nodes}", field="inter_node.dims")

    # -- links -------------------------------------------------------------------------------
    def _link(self, key: tuple, name: str, capacity: float) -> int:
        i = self._ids.get(key)
        if i is None:
            i = self._ids[key] = len(self.links)
            self.links.append(Link(name, capacity))
        return i

    def route(self, src_node: int, src_dev: int, dst_node: int, dst_dev: int) -> tuple[int, ...]:
        """The shared links (indices into `links`) a flow from device `src_dev` of `src_node` to device
        `dst_dev` of `dst_node` crosses, in order; () inside a node or where nothing is shared."""
        if src_node == dst_node or not self.fabric.shared:
            return ()
        key = (src_node, src_dev, dst_node, dst_dev)
        hit = self._routes.get(key)
        if hit is None:
            kind = self.fabric.kind
            if kind in ("fat-tree", "rail-optimized"):
                hit = self._tree_route(src_node, dst_node, dst_dev if kind == "rail-optimized" else -1)
            elif kind == "torus":
                hit = self._torus_route(src_node, dst_node)
            else:
                hit = self._dragonfly_route(src_node, dst_node)
            self._routes[key] = hit
        return hit

    # -- fat-tree and rail-optimised ---------------------------------------------------------
    def _tree_setup(self) -> None:
        per_endpoint = self.port * (1 if self.fabric.kind == "rail-optimized" else self.per_node)
        self._span: list[int] = []      # nodes under one switch of each level
        self._cap: list[float] = []     # capacity of that level's link upwards
        span, cap = 1, per_endpoint
        for level in self.fabric.levels:
            span *= level.fanout
            cap = level.fanout * cap / level.oversubscription
            self._span.append(span)
            self._cap.append(cap)

    def _tree_route(self, a: int, b: int, rail: int) -> tuple[int, ...]:
        up: list[int] = []
        down: list[int] = []
        tag = "" if rail < 0 else f" rail{rail}"
        for k, (span, level) in enumerate(zip(self._span, self.fabric.levels)):
            sa, sb = a // span, b // span
            if sa == sb:
                break
            if level.oversubscription > 1:
                up.append(self._link(("up", k, sa, rail), f"L{k + 1} switch {sa}{tag} up", self._cap[k]))
                down.append(self._link(("down", k, sb, rail), f"L{k + 1} switch {sb}{tag} down", self._cap[k]))
        return tuple(up + down[::-1])

    # -- torus -------------------------------------------------------------------------------
    def _torus_route(self, a: int, b: int) -> tuple[int, ...]:
        dims = self.fabric.dims
        pos, goal = _coords(a, dims), _coords(b, dims)
        out = []
        for k, size in enumerate(dims):
            ahead = (goal[k] - pos[k]) % size
            step = 1 if ahead <= size - ahead else -1
            while pos[k] != goal[k]:
                here = _index(pos, dims)
                pos[k] = (pos[k] + step) % size
                name = f"torus node {here} dim{k}{'+' if step > 0 else '-'}"
                out.append(self._link(("t", here, k, step), name, self.fabric.link_bandwidth))
        return tuple(out)

    # -- dragonfly ---------------------------------------------------------------------------
    def _dragonfly_route(self, a: int, b: int) -> tuple[int, ...]:
        f = self.fabric
        ga = a // f.nodes_per_router // f.routers_per_group
        gb = b // f.nodes_per_router // f.routers_per_group
        if ga == gb:
            return ()
        cap = f.routers_per_group * f.global_links * f.global_bandwidth
        return (self._link(("out", ga), f"group {ga} global links out", cap),
                self._link(("in", gb), f"group {gb} global links in", cap))


def _coords(index: int, dims: tuple[int, ...]) -> list[int]:
    out = []
    for size in dims:
        out.append(index % size)
        index //= size
    return out


def _index(coords: list[int], dims: tuple[int, ...]) -> int:
    out, scale = 0, 1
    for c, size in zip(coords, dims):
        out += c * scale
        scale *= size
    return out
