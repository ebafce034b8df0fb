"""A chunk's gradient buckets, as the simulator's iteration and the analytic evaluator both cut them:
DDP's size rule (`dlsim.plan.dataparallel.make_buckets`) over the gradients in the dtype the reduction
moves (`grad_reduce_dtype`), the routed experts' gradients apart (`dlsim.plan.expertparallel`); under
ZeRO-3 with `fsdp_units` block, FSDP2's units of one transformer block each (`dlsim.plan.fsdp`)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from dlsim.plan.dataparallel import Bucket, make_buckets, reduce_element_bytes
from dlsim.plan.expertparallel import expert_buckets
from dlsim.plan.fsdp import block_buckets, fsdp_block_units
from dlsim.units import DTYPE_BYTES


def gradient_buckets(entries: Sequence[Any], s: Any, dtype: str, synced: Callable[[Any], bool]) -> list[Bucket]:
    """The buckets of `entries` whose parameters `synced` says are reduced, in reduction order; each
    knows its gradient bytes (`nbytes`) and its parameters' bytes in `dtype` (`gather_nbytes`)."""
    grad = reduce_element_bytes(s, dtype)
    scale = DTYPE_BYTES[dtype] / grad
    if fsdp_block_units(s):
        buckets = block_buckets([(e.index, e.name, e.params * grad) for e in entries if synced(e)], scale)
    else:
        buckets = make_buckets([(e.index, e.params * grad) for e in entries if synced(e)], s.bucket_size,
                               s.first_bucket_size, param_scale=scale)
    return expert_buckets(entries, buckets, s, grad, scale)
