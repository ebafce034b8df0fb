"""Roofline time model (Williams, Waterman & Patterson, CACM 2009) with size-dependent efficiencies.

    t = max(W / (P · e_c(w)), Q / (B · e_m(q))) + k · t_launch

W FLOPs at peak P (matrix units for GEMM-class work, vector units otherwise), Q bytes at memory
bandwidth B, k kernel launches of overhead t_launch each; w = W/k and q = Q/k are one kernel's
work and traffic. Small kernels do not fill the device, so the attained fractions of peak grow
with the kernel's size:

* from the device's efficiency curves (`dlsim.spec.efficiency`) when its profile states them:
  published microbenchmarks of that device (achievable matmul FLOPS by GEMM size, stream
  bandwidth by transfer size) or `dlsim calibrate compute`, interpolated in log(size);
* FP8 GEMMs without an FP8 curve: the BF16 curve times `Device.fp8_efficiency_ratio` (a published
  FP8 best-shape fraction over the BF16 one of the same device);
* otherwise from one saturating curve e_c(w) = e_max · w / (w + w_half) for GEMM-class work (the
  shape of Paleo's "platform percent of peak" and Habitat's wave scaling) and a flat memory
  efficiency e_m; element-wise work without a vector curve runs at e_max, its size dependence
  being the memory side's and the launch overhead's.

Matrix work is then scaled by the device's sustained fraction s (`Device.sustained_matrix_fraction`):
the efficiency curves come from short benchmarks (tens of iterations, the best or the mean of a
burst), while a training step keeps the tensor cores busy for seconds at the board's power limit,
where the clock settles lower (Horace He, "Strangely, Matrix Multiplications on GPUs Run Faster
When Given 'Predictable' Data", 2024: H100 matmuls are power-limited). With s the sustained over the
burst throughput of the same GEMM on that device:

    e_c,sustained(w) = s · e_c(w)

applied once to every matrix-unit kernel (GEMMs, FP8 GEMMs through the BF16 curve, flash-attention
kernels: `dlsim.cost.flash`), never to memory-bound or vector work (stated assumption: every GEMM of
the step runs at the clock a continuous GEMM load sustains).
"""

from __future__ import annotations

from dlsim.results import Estimate, Source
from dlsim.spec.cluster import Device


def sustained(device: Device, matrix: bool = True) -> float:
    """s: the share of its burst matrix throughput `device` keeps under continuous load (1 off the matrix units)."""
    return device.sustained_matrix_fraction if matrix else 1.0


def compute_efficiency(flops: float, device: Device, dtype: str | None = None, matrix: bool = True) -> float:
    """e_c(w): fraction of peak a kernel of `flops` FLOPs attains, sustained (module docstring)."""
    return sustained(device, matrix) * _burst_efficiency(flops, device, dtype, matrix)


def _burst_efficiency(flops: float, device: Device, dtype: str | None, matrix: bool) -> float:
    """e_c(w) as the short benchmarks measured it."""
    curve = device.efficiency.matrix.get(dtype or "") if matrix else device.efficiency.vector
    if matrix and curve is None and dtype == "fp8":  # the bf16 curve scaled by the device's fp8/bf16 ratio
        return device.fp8_efficiency_ratio * _burst_efficiency(flops, device, "bf16", matrix)
    if matrix and curve is None and device.efficiency.matrix and dtype in ("fp16", "bf16"):
        curve = device.efficiency.matrix.get("bf16" if dtype == "fp16" else "fp16")
    if curve is not None:
        return curve.at(max(flops, 1.0))[0]
    if flops <= 0 or not matrix:
        # element-wise work: its size dependence is the memory side's and the launch overhead's
        return device.compute_efficiency
    return device.compute_efficiency * flops / (flops + device.half_efficiency_flops)


def memory_efficiency(nbytes: float, device: Device, kernel: str | None = None) -> float:
    """e_m(q): fraction of the memory bandwidth a kernel moving `nbytes` bytes attains; a kernel
    measured on its own (`DeviceEfficiency.kernels`, "<op>.<pass>") attains its measured fraction."""
    measured = device.efficiency.kernels.get(kernel) if kernel else None
    if measured is not None:
        return measured[0]
    curve = device.efficiency.memory
    if curve is not None:
        return curve.at(max(nbytes, 1.0))[0]
    return device.memory_efficiency


def peak(device: Device, dtype: str, matrix: bool) -> float:
    """Peak FLOP/s for `dtype` on matrix units (tensor cores) or vector units; falls back to fp32."""
    table = device.peak_flops if matrix else device.vector_flops
    if dtype in table:
        return table[dtype]
    if "fp32" in table:
        return table["fp32"]
    return max(table.values())


def _label(device: Device, matrix: bool) -> str:
    eff = device.efficiency
    tables = []
    if (eff.matrix if matrix else eff.vector):
        tables.append("matrix" if matrix else "vector")
    if eff.memory is not None:
        tables.append("memory")
    return f"roofline, {'/'.join(tables)} efficiency tables" if tables else "roofline"


def roofline_time(flops: float, nbytes: float, device: Device, dtype: str, *, matrix: bool,
                  kernels: int = 1, kernel: str | None = None) -> Estimate:
    """Roofline time of `kernels` kernels doing `flops` FLOPs and moving `nbytes` bytes in total;
    `kernel` ("<op>.<pass>") names a memory-bound kernel whose own efficiency the profile may state."""
    k = max(kernels, 1)
    compute = flops / (peak(device, dtype, matrix) * compute_efficiency(flops / k, device, dtype, matrix)) \
        if flops else 0.0
    memory = nbytes / (device.memory_bandwidth * memory_efficiency(nbytes / k, device, kernel)) if nbytes else 0.0
    bound = "compute" if compute >= memory else "memory"
    return Estimate(max(compute, memory) + kernels * device.launch_overhead, Source.MODEL,
                    f"{_label(device, matrix)} ({bound}-bound)")
