"""How a task graph asks for communication costs: rank layout, link tiers, and a pricer protocol.

Ranks are laid out as Megatron-LM does by default (order tp, cp, dp, pp: tensor-parallel ranks
adjacent, then context-parallel ranks, then data-parallel replicas, pipeline stages outermost):
rank = tp_rank + tp·(cp_rank + cp·(dp_rank + dp·pp_rank)). A group of ranks crosses the inter-node
tier when its members live on more than one node (node = rank // devices_per_node). The context-
parallel ranks of a ring are identical (load-balanced), so positions (dp, tp, stage) name the
ring's rank 0; the gradient group spans dp × cp ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol, Sequence

from dlsim.results import Estimate, Source

INTRA, INTER = "intra", "inter"

SPARSE_ALLREDUCE = "sparse_allreduce"
"""A collective op carrying its density and value size (`sparse_op`): SparCML's sparse allreduce
(`dlsim.cost.collectives.sparse`) of a vector whose dense size is the call's bytes."""


def sparse_op(density: float, value_bytes: float) -> str:
    """The op of a sparse allreduce of `density` nonzeros per rank, `value_bytes` per value."""
    return f"{SPARSE_ALLREDUCE}:density={density!r}:value={value_bytes!r}"


@lru_cache(maxsize=256)
def op_label(op: str) -> str:
    """How an op reads in task names and traces (a sparse allreduce with its density); a graph names
    a few ops many thousand times: each read once."""
    sparse = parse_sparse_op(op)
    return op if sparse is None else f"sparse_allreduce (density {sparse['density']:g})"


def parse_sparse_op(op: str) -> dict[str, float] | None:
    """(density, value_bytes) of a `sparse_op`, None for any other op."""
    if not op.startswith(SPARSE_ALLREDUCE + ":"):
        return None
    fields = dict(part.split("=", 1) for part in op.split(":")[1:])
    return {"density": float(fields["density"]), "value_bytes": float(fields["value"])}


@dataclass(frozen=True)
class Layout:
    """Where the ranks of a dp × tp × pp strategy sit on nodes of `devices_per_node` devices."""

    dp: int
    tp: int
    pp: int
    devices_per_node: int
    cp: int = 1

    def rank(self, dp_rank: int, tp_rank: int, stage: int, cp_rank: int = 0) -> int:
        return tp_rank + self.tp * (cp_rank + self.cp * (dp_rank + self.dp * stage))

    def node(self, rank: int) -> int:
        return rank // self.devices_per_node

    def tier(self, ranks: Sequence[int]) -> str:
        """intra when all `ranks` share a node, inter otherwise (the node, rank // devices_per_node, grows
        with the rank: all share one where the least and the greatest do)."""
        n = self.devices_per_node
        return INTRA if min(ranks) // n == max(ranks) // n else INTER

    def ranks_per_node(self, ranks: Sequence[int]) -> int:
        """Largest number of group members on one node (`node`)."""
        n = self.devices_per_node
        count: dict[int, int] = {}
        for r in ranks:
            k = r // n
            count[k] = count.get(k, 0) + 1
        return max(count.values())

    def tp_group(self, dp_rank: int, stage: int) -> list[int]:
        return [self.rank(dp_rank, t, stage) for t in range(self.tp)]

    def dp_group(self, tp_rank: int, stage: int) -> list[int]:
        """The ranks gradients are reduced over: dp replicas × cp ranks (Megatron-LM's dp-cp group)."""
        return [self.rank(d, tp_rank, stage, c) for d in range(self.dp) for c in range(self.cp)]

    def shard_group(self, dp_rank: int, tp_rank: int, stage: int) -> list[int]:
        """Hybrid sharding: the members of a position's dp x cp group on its own node (the ZeRO / FSDP
        shard group; PyTorch FSDP HYBRID_SHARD shards within a node and replicates across)."""
        node = self.node(self.rank(dp_rank, tp_rank, stage))
        return [r for r in self.dp_group(tp_rank, stage) if self.node(r) == node]

    def replica_group(self, dp_rank: int, tp_rank: int, stage: int) -> list[int]:
        """Hybrid sharding: the members of the dp x cp group holding the same shard as the position,
        one per node (same place in their node's shard group)."""
        group = self.dp_group(tp_rank, stage)
        me = self.rank(dp_rank, tp_rank, stage)
        nodes: dict[int, list[int]] = {}
        for r in group:
            nodes.setdefault(self.node(r), []).append(r)
        index = nodes[self.node(me)].index(me)
        return [members[index] for members in nodes.values() if len(members) > index]

    def cp_group(self, dp_rank: int, tp_rank: int, stage: int) -> list[int]:
        """The context-parallel ring of a position, in ring order."""
        return [self.rank(dp_rank, tp_rank, stage, c) for c in range(self.cp)]


@dataclass(frozen=True)
class Transfer:
    """One point-to-point message of an expanded collective, between group members (indices into
    the group's rank list): its duration (arrival plus reduction), how long it holds the sender's
    and the receiver's port, the transfers it waits for, whether it uses the intra-node tier, and
    `wire`: the seconds of it that move its bytes at the tier's rate alone (payload × G, at most
    `hold`), the part a shared network stretches."""

    src: int
    dst: int
    nbytes: float
    duration: float
    deps: tuple[int, ...]
    hold: float
    recv_hold: float
    intra: bool = False
    wire: float = 0.0


class CommPricer(Protocol):
    """Prices collectives and point-to-point transfers between real ranks."""

    def collective(self, op: str, nbytes: float, ranks: Sequence[int]) -> Estimate:
        """Closed-form time of collective `op` (allreduce, reduce_scatter, allgather, broadcast,
        alltoall) of `nbytes` (the full buffer) over `ranks`."""

    def p2p(self, nbytes: float, src: int, dst: int) -> Estimate:
        """Time of one message of `nbytes` from rank `src` to rank `dst`."""

    def expand(self, op: str, nbytes: float, ranks: Sequence[int]) -> list[Transfer] | None:
        """The collective as point-to-point transfers, or None when it has no executable form."""

    def tier(self, ranks: Sequence[int]) -> str:
        """The link tier (intra or inter) a group of ranks communicates over."""


class FreeComm:
    """Communication that costs nothing (closed-form checks: "uniform stages, free communication")."""

    def __init__(self, layout: Layout | None = None):
        self.layout = layout

    def collective(self, op: str, nbytes: float, ranks: Sequence[int]) -> Estimate:
        return Estimate(0.0, Source.MODEL, "free communication")

    def p2p(self, nbytes: float, src: int, dst: int) -> Estimate:
        return Estimate(0.0, Source.MODEL, "free communication")

    def expand(self, op: str, nbytes: float, ranks: Sequence[int]) -> list[Transfer] | None:
        return None

    def tier(self, ranks: Sequence[int]) -> str:
        return self.layout.tier(ranks) if self.layout else INTRA
