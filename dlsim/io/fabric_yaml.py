"""A link tier's network keys in a profile: `topology` and the shape of its fabric (`dlsim.spec.network`).

Each family reads its own keys, and a key no family of the tier's `topology` uses is refused (it
would be ignored otherwise):

    fat-tree, rail-optimized:  levels: [{fanout: N, oversubscription: X}, ...]   (leaves first)
    torus:                     dims: [X, Y, ...], link_bandwidth_gbytes_per_s | _gbits_per_s
    dragonfly:                 nodes_per_router, routers_per_group, global_links_per_router,
                               global_link_bandwidth_gbytes_per_s | _gbits_per_s

A fat-tree without `levels` is non-blocking (as one switch); the intra-node tier and the host link
take only kinds without shared links (a crossbar or a board wiring, `dlsim.spec.cluster.TOPOLOGIES`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dlsim import units
from dlsim.errors import SpecError
from dlsim.spec.cluster import TOPOLOGIES
from dlsim.spec.network import FABRICS, Fabric, TreeLevel

_RATES = ("link_bandwidth", "global_link_bandwidth")
_USES = {
    "fat-tree": ("levels",),
    "rail-optimized": ("levels",),
    "torus": ("dims", "link_bandwidth"),
    "dragonfly": ("nodes_per_router", "routers_per_group", "global_links_per_router", "global_link_bandwidth"),
}
KEYS = {"topology", "levels", "dims", "nodes_per_router", "routers_per_group", "global_links_per_router",
        "oversubscription"} | {f"{r}_{u}" for r in _RATES for u in ("gbytes_per_s", "gbits_per_s")}
"""Every network key a link tier may carry (`dlsim.io.profile_yaml` adds them to the tier's keys)."""


def _base(key: str) -> str:
    for rate in _RATES:
        if key.startswith(rate + "_"):
            return rate
    return key


def _count(value: Any, path: Path, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"must be a positive integer, got {value!r}", path=path, field=field)
    return value


def _counts(value: Any, path: Path, field: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or len(value) > 8:
        raise SpecError("must be a list of 1 to 8 positive integers", path=path, field=field)
    return tuple(_count(v, path, f"{field}[{i}]") for i, v in enumerate(value))


def _rate(data: dict, name: str, path: Path, field: str) -> float:
    gbytes, gbits = f"{name}_gbytes_per_s", f"{name}_gbits_per_s"
    if gbytes in data and gbits in data:
        raise SpecError(f"give {name} in GB/s or in Gbit/s, not both", path=path, field=field)
    key = gbytes if gbytes in data else gbits
    if key not in data:
        raise SpecError(f"missing required field ({gbytes} or {gbits})", path=path, field=f"{field}.{gbytes}")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SpecError(f"must be a positive number, got {value!r}", path=path, field=f"{field}.{key}")
    return float(value) * (units.GBYTE_PER_S if key == gbytes else units.GBIT_PER_S)


def _levels(value: Any, path: Path, field: str) -> tuple[TreeLevel, ...]:
    if not isinstance(value, list) or not value or len(value) > 8:
        raise SpecError("must be a list of 1 to 8 levels, leaves first: {fanout: N, oversubscription: X}",
                        path=path, field=field)
    out = []
    for i, level in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(level, dict):
            raise SpecError("must be a mapping {fanout: N, oversubscription: X}", path=path, field=where)
        unknown = sorted(set(level) - {"fanout", "oversubscription", "source"})
        if unknown:
            raise SpecError(f"unknown key {unknown[0]!r} (use fanout, oversubscription, source)", path=path,
                            field=where)
        if "fanout" not in level:
            raise SpecError("missing required field", path=path, field=f"{where}.fanout")
        ratio = level.get("oversubscription", 1.0)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio < 1:
            raise SpecError(f"is bandwidth down / bandwidth up of a switch and must be at least 1, got {ratio!r}",
                            path=path, field=f"{where}.oversubscription")
        out.append(TreeLevel(_count(level["fanout"], path, f"{where}.fanout"), float(ratio)))
    return tuple(out)


def read_fabric(data: dict, path: Path, field: str, *, between_nodes: bool) -> tuple[str, Fabric]:
    """(topology, fabric) of one link tier's mapping `data` (module doc); `between_nodes` for the
    inter-node tier, the only one that may have shared links."""
    kind = data.get("topology", "switch")
    if kind not in TOPOLOGIES:
        raise SpecError(f"unknown topology {kind!r} (use {', '.join(TOPOLOGIES)})", path=path, field=f"{field}.topology")
    if kind in FABRICS and not between_nodes:
        raise SpecError(f"a {kind} joins nodes: describe it on inter_node (this tier is one node's or one "
                        "device's own link)", path=path, field=f"{field}.topology")
    if "oversubscription" in data:
        raise SpecError("give the oversubscription of each switch level: topology: fat-tree, levels: "
                        "[{fanout: NODES_PER_LEAF, oversubscription: X}, ...]", path=path,
                        field=f"{field}.oversubscription")
    uses = _USES.get(kind, ())
    for key in data:
        name = _base(key)
        if name in KEYS | set(_RATES) and name != "topology" and name not in uses:
            users = [k for k, v in _USES.items() if name in v]
            raise SpecError(f"is used by topology {' or '.join(users)} only, not by {kind}", path=path,
                            field=f"{field}.{key}")
    if kind in ("fat-tree", "rail-optimized"):
        levels = _levels(data["levels"], path, f"{field}.levels") if "levels" in data else ()
        return kind, Fabric(kind, levels=levels)
    if kind == "torus":
        if "dims" not in data:
            raise SpecError("missing required field", path=path, field=f"{field}.dims")
        return kind, Fabric(kind, dims=_counts(data["dims"], path, f"{field}.dims"),
                            link_bandwidth=_rate(data, "link_bandwidth", path, field))
    if kind == "dragonfly":
        for key in ("nodes_per_router", "routers_per_group", "global_links_per_router"):
            if key not in data:
                raise SpecError("missing required field", path=path, field=f"{field}.{key}")
        return kind, Fabric(kind, nodes_per_router=_count(data["nodes_per_router"], path, f"{field}.nodes_per_router"),
                            routers_per_group=_count(data["routers_per_group"], path, f"{field}.routers_per_group"),
                            global_links=_count(data["global_links_per_router"], path,
                                                f"{field}.global_links_per_router"),
                            global_bandwidth=_rate(data, "global_link_bandwidth", path, field))
    return kind, Fabric(kind if kind in ("switch", "nvswitch", "fully-connected") else "switch")
