"""Data-parallel gradient buckets (PyTorch DDP's rule) and when each becomes ready.

PyTorch DDP (torch/nn/parallel/distributed.py, torch/csrc/distributed/c10d/reducer.cpp;
reference/algorithms.md §5.3): parameters are assigned to buckets in `model.parameters()` order
with size limits [first_bucket_size (1 MiB), bucket_size (25 MiB)], a bucket closing once it
reaches its limit; the bucket list is then reversed so that buckets are reduced in backward order.
Each bucket launches one all-reduce when all its gradients are ready; the all-reduces run one after
another on one communication stream (wait-free backpropagation, Zhang et al. ATC'17 Poseidon).
The granularity here is a layer (all parameters of a layer become ready together, when its
backward pass ends).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Bucket:
    """Layers `layers` (model indices, forward order) with `nbytes` of gradients, reduced over the
    `group` kind ("dp"; "edp" for routed experts' gradients, `dlsim.plan.expertparallel`)."""

    layers: tuple[int, ...]
    nbytes: float
    group: str = "dp"

    @property
    def ready_after(self) -> int:
        """The layer whose backward completes the bucket (the earliest in forward order)."""
        return min(self.layers)


def make_buckets(layer_bytes: Sequence[tuple[int, float]], bucket_size: float,
                 first_bucket_size: float, group: str = "dp") -> list[Bucket]:
    """Buckets over (layer index, gradient bytes) in forward order, returned in reduction
    (backward) order, reduced over `group`. Layers without gradients are skipped."""
    buckets: list[Bucket] = []
    current: list[int] = []
    size = 0.0
    for index, nbytes in layer_bytes:
        if nbytes <= 0:
            continue
        current.append(index)
        size += nbytes
        limit = first_bucket_size if not buckets else bucket_size
        if size >= limit:
            buckets.append(Bucket(tuple(current), size, group))
            current, size = [], 0.0
    if current:
        buckets.append(Bucket(tuple(current), size, group))
    return list(reversed(buckets))


def overlap_bounds(compute: float, comm: float) -> tuple[float, float]:
    """With overlap, an iteration lies between max(compute, comm) and compute + comm."""
    return max(compute, comm), compute + comm
