"""A flash-attention kernel's time: the attention core as one tiled kernel that keeps the scores on chip.

FlashAttention (Dao et al. 2022; FlashAttention-2, Dao 2023, Algorithms 1 and 2) and cuDNN's fused
attention compute softmax(QKᵀ)·V block by block in on-chip memory: no L×L score reaches device
memory, and under a causal mask the blocks above the diagonal are skipped (FlashAttention-2 §3.1.1,
"causal masking": about half the blocks). With W the core's full products of one pass (forward
QKᵀ and PV, 4·N·h·L_q·L_k·d; backward five products, 2.5 times that, the FLOP count of the
flash-attention benchmarks, `dlsim.cost.attention`):

    work = W / 2 with a causal mask, W without

With a measured kernel (`DeviceEfficiency.attention`, fractions e(L) of the 16-bit matrix peak P by
sequence length L, with the causal work counted as W / 2 as those benchmarks count it; short
benchmarks, so e(L) is taken times the device's sustained fraction, `dlsim.cost.roofline.sustained`):

    t = work / (P · e(L)) + t_launch

Under context parallelism with load-balanced causal chunks (`dlsim.plan.contextparallel`) each of
the cp ring steps holds 1/cp of the rank's causal work: the first step is the causal kernel on the
rank's own chunks, the other cp − 1 run without a mask:

    t = (work / cp) / (P · e_causal(L)) + (cp − 1) · (work / cp) / (P · e(L)) + cp · t_launch

A causal backward without its own curve runs at e_bwd(L) · e_fwd,causal(L) / e_fwd(L) (the
forward's share of skipped-block overhead at the same length; a modelling assumption, stated).
Measured at several head dimensions, e is interpolated in log(head dimension) at the model's
(`dlsim.spec.efficiency.AttentionMeasurements`).
Where forward and backward were only timed together (rate R, the backward counted as 2.5 forwards,
as FlashAttention-2's benchmark counts it), both passes run at R: W / R + 2.5 W / R is the measured
3.5 W / R of the pair, exact for a forward and its backward, while a recomputed forward alone is
priced at the pair's rate (`AttentionEfficiency.timed_together`).
Without a measured kernel (another device or dtype): the roofline of the work at the GEMM curve's
efficiency and the bytes of Q, K, V, the output and their gradients only (`FlashKernel.io_elements`).
Not modelled: attention dropout inside the kernel (its random numbers), the head count's effect on
the kernel's occupancy (the measurements run 2048 channels of heads at 16k tokens).
"""

from __future__ import annotations

from dlsim.cost.layercost import FlashKernel, PassCost
from dlsim.cost.roofline import peak, roofline_time, sustained
from dlsim.results import Estimate, Source
from dlsim.spec.cluster import Device
from dlsim.units import DTYPE_BYTES

MEASURED_DTYPES = ("bf16", "fp16")
"""The dtypes the flash-attention measurements are of (the 16-bit kernels)."""


def core_flops(cost: PassCost) -> float:
    """The full products of a flash pass's core: its batched GEMMs (the projections are single GEMMs)."""
    return float(sum(g.flops for g in cost.gemms if g.count > 1))


def flash_work(flops: float, fk: FlashKernel) -> float:
    """The FLOPs a flash kernel runs of `flops` full products: half under a causal mask."""
    return flops / 2 if fk.causal else flops


def kernel_efficiency(fk: FlashKernel, device: Device, causal: bool) -> float | None:
    """e(L) of `fk`'s kernel and pass on `device`, with or without the causal mask, sustained (the
    measurements are short benchmarks: `dlsim.cost.roofline.sustained`); None: not measured."""
    e = _measured_efficiency(fk, device, causal)
    return None if e is None else sustained(device) * e


def _measured_efficiency(fk: FlashKernel, device: Device, causal: bool) -> float | None:
    m = device.efficiency.attention.get(fk.kernel)
    if m is None:
        return None
    return m.at(fk.pass_name, causal, max(fk.length, 1), fk.head_dim)


def flash_seconds(cost: PassCost, device: Device, dtype: str) -> Estimate:
    """Seconds of the flash kernel(s) of `cost` (a pass with `cost.flash`), per the module docstring."""
    fk = cost.flash
    assert fk is not None
    work = flash_work(core_flops(cost), fk)
    cp = max(fk.cp, 1)
    measured = dtype in MEASURED_DTYPES and fk.kernel in device.efficiency.attention
    if measured:
        p = peak(device, dtype, True)
        plain = kernel_efficiency(fk, device, False)
        first = kernel_efficiency(fk, device, True) if fk.causal else plain
        assert plain is not None and first is not None
        seconds = (work / cp) / (p * first) + (cp - 1) * (work / cp) / (p * plain) + cp * device.launch_overhead
        together = " (forward and backward timed together)" if device.efficiency.attention[fk.kernel].timed_together \
            else ""
        return Estimate(seconds, Source.MODEL, f"{fk.kernel} {fk.pass_name} measured by sequence length{together}")
    nbytes = fk.io_elements * DTYPE_BYTES[dtype]
    e = roofline_time(work, nbytes, device, dtype, matrix=True, kernels=cp)
    return Estimate(e.seconds, e.source, f"{fk.kernel} {fk.pass_name}, {e.note}")


def attention_note(device: Device, device_label: str, kernel: str | None) -> str:
    """Where an attention core's time comes from on `device`: the measured kernel `kernel` (a flash
    kernel) or, unmeasured, the roofline of its work (then said, with what the profile does measure);
    for an unfused core (`kernel` None) the measured standard-attention chain (`dlsim.cost.unfused`),
    or the roofline of its batched GEMMs and memory-bound kernels."""
    measured = device.efficiency.attention
    if kernel is not None:
        if kernel in measured:
            return f"attention: {kernel} measured on this device ({measured[kernel].source})"
        others = ", ".join(k for k in measured if k != "standard_attention") or "none"
        return (f"attention: {kernel} has no measurement in {device_label}'s profile, so it is priced as the roofline "
                f"of its work at the GEMM curve, likely faster than the kernel runs (measured flash kernels here: "
                f"{others})")
    if "standard_attention" in measured:
        return ("attention: unfused; its batched GEMMs at the rate the profile's measured standard-attention chain "
                f"implies (dlsim.cost.unfused; {measured['standard_attention'].source})")
    return ("attention: unfused; its batched GEMMs and memory-bound kernels by the roofline (no measured "
            f"standard-attention chain in {device_label}'s profile)")

