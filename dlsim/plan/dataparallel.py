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
from typing import Any, Sequence

from dlsim.units import DTYPE_BYTES


@dataclass(frozen=True)
class Bucket:
    """Layers `layers` (model indices, forward order) with `nbytes` of gradients, reduced over the
    `group` kind ("dp"; "edp" for routed experts' gradients, `dlsim.plan.expertparallel`)."""

    layers: tuple[int, ...]
    nbytes: float
    group: str = "dp"
    param_nbytes: float = -1.0
    """Bytes of the bucket's parameters in the training dtype (what ZeRO-3 gathers); -1: `nbytes`
    (gradients reduced in the training dtype)."""

    @property
    def gather_nbytes(self) -> float:
        return self.nbytes if self.param_nbytes < 0 else self.param_nbytes

    @property
    def ready_after(self) -> int:
        """The layer whose backward completes the bucket (the earliest in forward order)."""
        return min(self.layers)


def make_buckets(layer_bytes: Sequence[tuple[int, float]], bucket_size: float,
                 first_bucket_size: float, group: str = "dp", param_scale: float = 1.0) -> list[Bucket]:
    """Buckets over (layer index, gradient bytes) in forward order, returned in reduction
    (backward) order, reduced over `group`. Layers without gradients are skipped. `param_scale` is
    a parameter's bytes over its gradient's (gradients reduced in another dtype than the weights)."""
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
            buckets.append(_bucket(current, size, group, param_scale))
            current, size = [], 0.0
    if current:
        buckets.append(_bucket(current, size, group, param_scale))
    return list(reversed(buckets))


def _bucket(layers: list[int], nbytes: float, group: str, param_scale: float) -> Bucket:
    return Bucket(tuple(layers), nbytes, group, -1.0 if param_scale == 1.0 else nbytes * param_scale)


FP32_BUFFERS = ("main_grad_fp32", "cast_add_fp32", "fused_fp32")
"""Gradient accumulations into an fp32 buffer (`dlsim.spec.strategy.GRAD_ACCUMULATIONS`)."""


def reduce_element_bytes(s: Any, dtype: str) -> int:
    """Bytes of one element of the gradient buffer, which micro-batches accumulate into, the device
    keeps and the data-parallel reduction moves: `s.grad_reduce_dtype` when set, else fp32 for an
    fp32 accumulation (`FP32_BUFFERS`; Megatron-LM reduces its fp32 main_grad buffer), else the
    training `dtype`."""
    if s.grad_reduce_dtype:
        return DTYPE_BYTES[s.grad_reduce_dtype]
    return 4 if s.grad_accumulation in FP32_BUFFERS else DTYPE_BYTES[dtype]


def buffer_element_bytes(s: Any, dtype: str) -> int:
    """Bytes of one element of the gradient buffer itself: fp32 for an fp32 accumulation
    (`FP32_BUFFERS`) even where the data-parallel reduction casts it to `s.grad_reduce_dtype` on the
    wire (DeepSpeed's engine.py allreduce_bucket), else what `reduce_element_bytes` says. A collective
    that runs on the buffer directly moves these bytes: the tied embedding's all-reduce between the
    first and last stage (DeepSpeed pipe/engine.py _exec_reduce_tied_grads all-reduces
    ``weight._hp_grad``, the fp32 gradient, at microsoft/DeepSpeed@8164ea9; Megatron-LM
    _allreduce_word_embedding_grads all-reduces ``main_grad``, NVIDIA/Megatron-LM@e269e20
    megatron/training.py)."""
    return 4 if s.grad_accumulation in FP32_BUFFERS else reduce_element_bytes(s, dtype)


def overlap_bounds(compute: float, comm: float) -> tuple[float, float]:
    """With overlap, an iteration lies between max(compute, comm) and compute + comm."""
    return max(compute, comm), compute + comm
