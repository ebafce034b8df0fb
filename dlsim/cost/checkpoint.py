"""What a checkpoint writes and how long writing and reading it take.

A checkpoint holds the model states that cannot be recomputed: the weights and the optimizer
state (fp32 master weights and moments), not the gradients. Each rank holds its states as the
strategy shards them (`dlsim.plan.zero.model_state_bytes`, per pipeline stage and tensor-parallel
rank); a state replicated on r ranks is written once, by one of them, and a sharded one by every
holder of a shard:

| ZeRO stage       | weights written by              | optimizer state written by       |
|------------------|---------------------------------|----------------------------------|
| 0 (DDP)          | data-parallel rank 0            | data-parallel rank 0             |
| 1, 2             | data-parallel rank 0            | every rank (its shard)           |
| 3 (FSDP)         | every rank (its shard)          | every rank (its shard)           |
| hybrid sharding  | the ranks of shard group 0      | the ranks of shard group 0       |

(DeepSpeed's ZeRO checkpoints: ``mp_rank_*_model_states.pt`` from data-parallel rank 0, one
``zero_pp_rank_*_optim_states.pt`` per rank; PyTorch Distributed Checkpoint and Megatron-LM's
distributed checkpoints: every rank saves its shards, a replicated tensor deduplicated to one
writer.) With ranks in Megatron-LM order (tensor-parallel ranks fastest, then data-parallel, then
pipeline stages), the writers of a state replicated r times over the dp·cp ranks of a stage are
its first tp·dp·cp / r ranks: a contiguous block, so a node writes min(block, devices per node)
ranks' states.

Write time = max(total bytes / aggregate write bandwidth, the busiest node's bytes / its write
bandwidth) (the storage tier of `dlsim.spec.run.StorageTier`); a restart reads back what every
rank holds (each rank loads its own states), likewise with the read bandwidths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from dlsim.spec.run import StorageTier


@dataclass(frozen=True)
class StageStates:
    """One pipeline stage's model states per rank (bytes) and how many ranks hold them."""

    weights: float
    optimizer: float
    ranks: int


def replication(zero: int, group: int, hybrid_shard: bool, shard: int) -> tuple[int, int]:
    """(ranks holding each weight, ranks holding each optimizer element) among the `group` = dp·cp
    ranks of a tensor-parallel rank and stage, under ZeRO stage `zero` (`hybrid_shard`: sharded
    within groups of `shard` ranks, replicated across them)."""
    replicas = group // shard if hybrid_shard and shard else 1
    weights = replicas if zero >= 3 else group
    optimizer = group if zero == 0 else replicas
    return weights, optimizer


@dataclass(frozen=True)
class CheckpointPlan:
    """Who writes what: bytes in all, per writing rank (the most), per node (the most), the
    writing ranks and nodes, and what every rank reads back on a restart."""

    total_bytes: float
    rank_bytes: float
    node_bytes: float
    writer_ranks: int
    writer_nodes: int
    read_bytes: float
    read_node_bytes: float
    stages: tuple[dict[str, Any], ...]

    def write_time(self, storage: StorageTier) -> float:
        return max(self.total_bytes / storage.write_aggregate, self.node_bytes / storage.write_per_node)

    def read_time(self, storage: StorageTier) -> float:
        return max(self.read_bytes / storage.read_aggregate, self.read_node_bytes / storage.read_per_node)

    def to_dict(self) -> dict[str, Any]:
        return {"total_bytes": self.total_bytes, "rank_bytes_max": self.rank_bytes, "node_bytes_max": self.node_bytes,
                "writer_ranks": self.writer_ranks, "writer_nodes": self.writer_nodes,
                "read_bytes": self.read_bytes, "read_node_bytes_max": self.read_node_bytes,
                "stages": list(self.stages)}


def checkpoint_plan(zero: int, group: int, hybrid_shard: bool, stages: Sequence[StageStates], devices_per_node: int,
                    shard: int = 0) -> CheckpointPlan:
    """The checkpoint of a strategy of ZeRO stage `zero` over `group` = dp·cp ranks (`hybrid_shard`
    in groups of `shard`) whose pipeline stages hold `stages` (module docstring)."""
    rw, ro = replication(zero, group, hybrid_shard, shard or group)
    per_node = max(devices_per_node, 1)
    total = rank_max = node_max = read = read_node = 0.0
    writers = nodes = 0
    rows = []
    for i, st in enumerate(stages):
        kw, ko = st.ranks // rw, st.ranks // ro              # writing ranks of this stage, per state
        total += kw * st.weights + ko * st.optimizer
        both = min(kw, ko)
        rank_max = max(rank_max, st.weights + st.optimizer if both else 0.0,
                       st.weights if kw else 0.0, st.optimizer if ko else 0.0)
        node_max = max(node_max, min(kw, per_node) * st.weights + min(ko, per_node) * st.optimizer)
        writers += max(kw, ko)
        nodes += math.ceil(max(kw, ko) / per_node)
        read += st.ranks * (st.weights + st.optimizer)
        read_node = max(read_node, min(st.ranks, per_node) * (st.weights + st.optimizer))
        rows.append({"stage": i, "ranks": st.ranks, "weights_bytes_per_rank": st.weights,
                     "optimizer_bytes_per_rank": st.optimizer, "weight_writers": kw, "optimizer_writers": ko})
    return CheckpointPlan(total, rank_max, node_max, writers, nodes, read, read_node, tuple(rows))


def snapshot_time(rank_bytes: float, host_bandwidth: float) -> float:
    """Asynchronous checkpointing blocks only while each rank copies its states to host memory
    (PyTorch DCP ``async_save``, Megatron-LM's asynchronous save): its bytes over the host link."""
    return rank_bytes / host_bandwidth
