"""A link tier's network keys in a profile: `topology` and the shape of its fabric (`dlsim.spec.network`).

The keys are fields of the tier's typed record (`dlsim.io.profile_yaml.LinkRecord`, mixing in
`FabricFields`); each family reads its own, and a key no family of the tier's `topology` uses is
refused (it would be ignored otherwise):

    fat-tree, rail-optimized:  levels: [{fanout: N, oversubscription: X}, ...]   (leaves first)
    torus:                     dims: [X, Y, ...], link_bandwidth_gbytes_per_s | _gbits_per_s
    dragonfly:                 nodes_per_router, routers_per_group, global_links_per_router,
                               global_link_bandwidth_gbytes_per_s | _gbits_per_s

A fat-tree without `levels` is non-blocking (as one switch); the intra-node tier and the host link
take only kinds without shared links (a crossbar or a board wiring, `dlsim.spec.cluster.TOPOLOGIES`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from dlsim import units
from dlsim.errors import SpecError
from dlsim.spec.cluster import TOPOLOGIES
from dlsim.spec.network import FABRICS, NON_BLOCKING, Fabric, TreeLevel
from dlsim.spec.typed import Count, Positive, Record, Seq, Text, fail


class TreeLevelRecord(Record):
    """One level of a fat-tree, leaves first."""

    fanout: Count = Field(description="nodes under a leaf switch; switches of the level below under a higher one")
    oversubscription: Annotated[float, Field(ge=1)] = Field(
        1.0, description="bandwidth down / bandwidth up of a switch of this level (1: non-blocking)")
    source: Text | None = None


class FabricFields(Record):
    """The network keys of a link tier (module doc)."""

    topology: Literal[TOPOLOGIES] = "switch"  # type: ignore[valid-type]
    levels: Annotated[Seq[TreeLevelRecord], Field(min_length=1, max_length=8)] | None = Field(
        None, description="fat-tree, rail-optimized: switch levels from the leaves up")
    dims: Annotated[Seq[Count], Field(min_length=1, max_length=8)] | None = Field(
        None, description="torus: nodes per dimension")
    link_bandwidth_gbytes_per_s: Positive | None = Field(None, description="torus: each link, each way")
    link_bandwidth_gbits_per_s: Positive | None = Field(None, description="torus: each link, each way")
    nodes_per_router: Count | None = Field(None, description="dragonfly")
    routers_per_group: Count | None = Field(None, description="dragonfly")
    global_links_per_router: Count | None = Field(None, description="dragonfly: links to other groups")
    global_link_bandwidth_gbytes_per_s: Positive | None = Field(None, description="dragonfly: each global link")
    global_link_bandwidth_gbits_per_s: Positive | None = Field(None, description="dragonfly: each global link")

    @model_validator(mode="before")
    @classmethod
    def _per_level(cls, data):
        """A tier-wide oversubscription says nothing of where it applies: refused, with the form that does."""
        if isinstance(data, dict) and "oversubscription" in data:
            raise fail("oversubscription is given per switch level: topology: fat-tree, levels: "
                       "[{fanout: NODES_PER_LEAF, oversubscription: X}, ...]")
        return data


_USES = {
    "fat-tree": ("levels",),
    "rail-optimized": ("levels",),
    "torus": ("dims", "link_bandwidth"),
    "dragonfly": ("nodes_per_router", "routers_per_group", "global_links_per_router", "global_link_bandwidth"),
}
_RATES = ("link_bandwidth", "global_link_bandwidth")


def _base(key: str) -> str:
    for rate in _RATES:
        if key.startswith(rate + "_"):
            return rate
    return key


def _rate(rec: FabricFields, name: str, path: Path, field: str) -> float:
    gbytes, gbits = getattr(rec, f"{name}_gbytes_per_s"), getattr(rec, f"{name}_gbits_per_s")
    if gbytes is not None and gbits is not None:
        raise SpecError(f"give {name} in GB/s or in Gbit/s, not both", path=path, field=field)
    if gbytes is None and gbits is None:
        raise SpecError(f"missing required field ({name}_gbytes_per_s or {name}_gbits_per_s)", path=path,
                        field=f"{field}.{name}_gbytes_per_s")
    return gbytes * units.GBYTE_PER_S if gbytes is not None else gbits * units.GBIT_PER_S


def _required(rec: FabricFields, key: str, path: Path, field: str):
    value = getattr(rec, key)
    if value is None:
        raise SpecError("missing required field", path=path, field=f"{field}.{key}")
    return value


def read_fabric(rec: FabricFields, path: Path, field: str, *, between_nodes: bool) -> tuple[str, Fabric]:
    """(topology, fabric) of one link tier's record (module doc); `between_nodes` for the inter-node
    tier, the only one that may have shared links."""
    kind = rec.topology
    if kind in FABRICS and not between_nodes:
        raise SpecError(f"a {kind} joins nodes: describe it on inter_node (this tier is one node's or one "
                        "device's own link)", path=path, field=f"{field}.topology")
    uses = _USES.get(kind, ())
    for key in FabricFields.model_fields:
        if key != "topology" and getattr(rec, key) is not None and _base(key) not in uses:
            users = [k for k, v in _USES.items() if _base(key) in v]
            raise SpecError(f"is used by topology {' or '.join(users)} only, not by {kind}", path=path,
                            field=f"{field}.{key}")
    if kind in ("fat-tree", "rail-optimized"):
        levels = tuple(TreeLevel(lv.fanout, float(lv.oversubscription)) for lv in rec.levels or ())
        return kind, Fabric(kind, levels=levels)
    if kind == "torus":
        return kind, Fabric(kind, dims=tuple(_required(rec, "dims", path, field)),
                            link_bandwidth=_rate(rec, "link_bandwidth", path, field))
    if kind == "dragonfly":
        return kind, Fabric(kind, nodes_per_router=_required(rec, "nodes_per_router", path, field),
                            routers_per_group=_required(rec, "routers_per_group", path, field),
                            global_links=_required(rec, "global_links_per_router", path, field),
                            global_bandwidth=_rate(rec, "global_link_bandwidth", path, field))
    return kind, Fabric(kind if kind in NON_BLOCKING else "switch")
