"""The optimizer step's and element-wise kernels' time on one device: one definition shared by the
simulator (`dlsim.api.simulate`) and the strategy search's analytic evaluator (`dlsim.plan.evaluate`).

The step reads and writes the fp32 optimizer state (`dlsim.cost.memory.optimizer_step_traffic`)
plus, in 16-bit training, the unscale / norm / master-copy traffic around it
(`mixed_precision_step_traffic`), priced by the roofline as memory-bound fp32 kernels, one kernel
per 32 parameter tensors of a stage (multi-tensor apply).
"""

from __future__ import annotations

from typing import Callable, Sequence

from dlsim.cost.memory import mixed_precision_step_traffic, optimizer_step_kernels, optimizer_step_traffic
from dlsim.cost.roofline import roofline_time
from dlsim.results import Estimate
from dlsim.spec.cluster import Device


def step_kernels(entries: Sequence, pp: int, optimizer: str = "adam", impl: str = "fused") -> int:
    """Kernels of one stage's optimizer step: fused, one per 32 parameter tensors (at least one);
    unfused, as `optimizer_step_kernels` counts them."""
    tensors = sum(1 for e in entries if e.params) // pp
    return optimizer_step_kernels(max(1, tensors // 32), tensors, optimizer, impl)


def optimizer_timer(device: Device, dtype: str, optimizer: str, kernels: int,
                    impl: str = "fused") -> Callable[[float], Estimate]:
    """`time(params)`: the optimizer step over `params` parameters (see the module docstring), run
    as `impl` (`dlsim.cost.memory.OPTIMIZER_IMPLS`)."""

    def optimizer_time(params: float) -> Estimate:
        nbytes, flops = optimizer_step_traffic(int(params), optimizer, impl)
        extra_bytes, extra_flops = mixed_precision_step_traffic(int(params), dtype)
        return roofline_time(flops + extra_flops, nbytes + extra_bytes, device, "fp32", matrix=False, kernels=kernels)

    return optimizer_time


def elementwise_timer(device: Device, dtype: str) -> Callable[[float, float], Estimate]:
    """`time(flops, bytes)` of a memory-bound element-wise kernel (compression, decompression)."""

    def elementwise_time(flops: float, nbytes: float) -> Estimate:
        return roofline_time(flops, nbytes, device, dtype, matrix=False)

    return elementwise_time
