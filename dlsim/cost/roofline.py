"""Roofline time model (Williams, Waterman & Patterson, CACM 2009) with a size-dependent efficiency.

    t = max(W / (P · e(W)), Q / (B · e_mem)) + k · t_launch

W FLOPs at peak P (matrix units for GEMM-class work, vector units otherwise), Q bytes at memory
bandwidth B, k kernel launches of overhead t_launch each. Small kernels do not fill the device; the
attained fraction of peak grows with the work of the kernel and saturates at e_max:

    e(W) = e_max · W / (W + W_half)

(a saturating curve of the kind Paleo's "platform percent of peak" and Habitat's wave scaling
approximate; e_max and W_half are device parameters, replaced by measured tables after calibration).
"""

from __future__ import annotations

from dlsim.results import Estimate, Source
from dlsim.spec.cluster import Device


def compute_efficiency(flops: float, device: Device) -> float:
    """e(W): fraction of peak a kernel of `flops` FLOPs attains."""
    if flops <= 0:
        return device.compute_efficiency
    return device.compute_efficiency * flops / (flops + device.half_efficiency_flops)


def peak(device: Device, dtype: str, matrix: bool) -> float:
    """Peak FLOP/s for `dtype` on matrix units (tensor cores) or vector units; falls back to fp32."""
    table = device.peak_flops if matrix else device.vector_flops
    if dtype in table:
        return table[dtype]
    if "fp32" in table:
        return table["fp32"]
    return max(table.values())


def roofline_time(flops: float, nbytes: float, device: Device, dtype: str, *, matrix: bool,
                  kernels: int = 1) -> Estimate:
    """Roofline time of `kernels` kernels doing `flops` FLOPs and moving `nbytes` bytes in total."""
    compute = flops / (peak(device, dtype, matrix) * compute_efficiency(flops / max(kernels, 1), device)) if flops else 0.0
    memory = nbytes / (device.memory_bandwidth * device.memory_efficiency) if nbytes else 0.0
    bound = "compute" if compute >= memory else "memory"
    return Estimate(max(compute, memory) + kernels * device.launch_overhead, Source.MODEL, f"roofline ({bound}-bound)")
