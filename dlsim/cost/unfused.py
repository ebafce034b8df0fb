"""An unfused attention core's batched GEMMs at the rate a measured standard-attention chain implies.

An unfused attention (`dlsim.cost.attention`) runs QKᵀ and PV, and their four gradients, as batched
GEMMs over the N·h heads with the L×L scores in device memory between them: GEMMs whose reduction
is one head (K = d, 64 to 128) and whose output is as large as their inputs or larger, so their main
loops are short and their output writes follow them. The device's GEMM curve (`dlsim.cost.roofline`,
square GEMMs by size) does not describe that shape. Where the profile holds a measured
standard-attention chain (`standard_attention`: PyTorch's baddbmm, softmax and bmm with the layout
copies around them, forward and backward, as the flash-attention benchmarks time it, FLOPs counted
as they count them: W = 4·B·H·L²·d forward, 2.5·W backward), the GEMMs' rate is what the chain's
measured time leaves once its memory-bound kernels are taken out as dlsim prices them. For the
benchmark's own configuration (16,384 tokens = B·L, 2048 channels = H·d) at length L and head
dimension d:

    t_chain = W_p / (P · e_measured(p, L, d))       W_fwd = W, W_bwd = 2.5·W (a pair timed together: 3.5·W)
    t_gemms = t_chain − Σ t_part − n · t_launch      the softmax and copies of `attention_parts`, priced as
                                                    dlsim prices them (`roofline_time`), n GEMM launches
    e_core  = s · G_p / (P · t_gemms)               G_fwd = W (two GEMMs), G_bwd = 2·W (four), s the
                                                    device's sustained fraction (short benchmarks)

and each batched GEMM of an unfused core of length L and head dimension d then takes
t = flops / (P · e_core) + t_launch, whatever the chain around it (fused softmax, dropout, masks are
priced as their own kernels). The causal chain (the mask added as its own kernel) is not used: it
checks the decomposition (tests/test_unfused_attention.py). Without a measurement, for another
dtype, or where the measured time does not exceed the parts (no rate left to infer), the GEMMs stay
on the roofline. Stated assumptions: the chain's own layout copies are those `attention_parts`
counts for an unfused, unstrided core; the rate at a head dimension between two measured ones is
interpolated, and held outside them (`dlsim.spec.efficiency.AttentionMeasurements`).
"""

from __future__ import annotations

from dlsim.cost.attention import attention_parts
from dlsim.cost.flash import MEASURED_DTYPES
from dlsim.cost.roofline import peak, roofline_time, sustained
from dlsim.spec.cluster import Device
from dlsim.units import DTYPE_BYTES

KERNEL = "standard_attention"
BENCH_TOKENS = 16384
"""Batch × sequence length of the flash-attention benchmarks (FlashAttention-2's and -3's)."""
BENCH_CHANNELS = 2048
"""Heads × head dimension of those benchmarks."""
CORE_GEMMS = {"forward": 2, "backward": 4}
"""Batched GEMMs of an unfused core per pass: QKᵀ and PV; ∇P, ∇V, ∇Q and ∇K."""
COUNTED = {"forward": 1.0, "backward": 2.5}
"""FLOPs the benchmarks count per pass, in forward products W."""


def core_gemm_efficiency(device: Device, dtype: str, pass_name: str, length: int, head_dim: int) -> float | None:
    """e_core of the module docstring for `pass_name` ("forward" or "backward"), sustained; None
    where the device holds no measured chain for `dtype` or the measurement leaves no GEMM time."""
    m = device.efficiency.attention.get(KERNEL)
    if m is None or dtype not in MEASURED_DTYPES:
        return None
    p = peak(device, dtype, True)
    d = m.measured_head_dim(head_dim)  # outside the measured head dimensions the nearest one's rate is held
    batch, heads = BENCH_TOKENS / length, BENCH_CHANNELS / d
    w = 4 * batch * heads * length * length * d
    passes = ("forward", "backward") if m.timed_together else (pass_name,)
    chain = sum(COUNTED[q] * w / (p * m.at(q, False, length, d)) for q in passes)
    fwd_parts, bwd_parts = attention_parts(round(batch * heads * length * length), BENCH_TOKENS * BENCH_CHANNELS,
                                           DTYPE_BYTES[dtype], False, False, frozenset({"scale_mask_softmax"}))
    parts = {"forward": fwd_parts, "backward": bwd_parts}
    for q in passes:
        chain -= CORE_GEMMS[q] * device.launch_overhead
        for op, name, part in parts[q]:
            chain -= roofline_time(part.flops, part.bytes, device, dtype, matrix=False, kernels=part.kernels,
                                   kernel=f"{op}.{name}").seconds
    if chain <= 0:
        return None
    gemm_flops = sum(CORE_GEMMS[q] / 2 * w for q in passes)
    return sustained(device) * gemm_flops / (p * chain)
