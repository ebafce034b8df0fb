"""FP8 training as NVIDIA Transformer Engine runs it (`--dtype fp8`): FP8 GEMMs, BF16 elsewhere.

Micikevicius et al., "FP8 Formats for Deep Learning" (arXiv:2209.05433, 2022) and Transformer
Engine's `fp8_autocast` with the DelayedScaling recipe (Megatron-LM `--fp8-format hybrid`):

* the GEMMs of the transformer layers' linear projections (a linear layer's, an attention's
  Q/K/V and output projections) take FP8 operands (E4M3 forward, E5M2 gradients) and run at the
  device's FP8 tensor-core peak, with its FP8 efficiency curve where the profile states one (a
  published measurement of that device), else its BF16 curve scaled by `fp8_efficiency_ratio`
  (the published FP8 / BF16 best-shape fractions of that device: Bekman's MAMF table), else the
  BF16 curve unscaled (the record's notes say which);
* the attention core (QKᵀ, softmax, PV), normalisations, activations, the embedding and the
  output projection feeding the loss stay in BF16 (Megatron-LM runs the output layer outside TE);
* every FP8 GEMM needs its operands cast: forward, the input cast to FP8 with its transpose for
  the weight gradient and its amax taken in the same kernel (TE's fused cast-transpose: read 2
  bytes, write 1 + 1 per element); backward, the output gradient cast and transposed likewise;
  the weights cast once per iteration (TE caches them over micro-batches: `is_first_microbatch`),
  charged as 1/m of a cast per micro-batch; after each forward the amax history and scale of the
  layer's three tensors are updated (one memory-bound kernel over 3 x `AMAX_HISTORY` fp32 values,
  read and written). All priced as memory-bound kernels by the roofline (or measured curves);
* master weights, gradients and optimizer state as in BF16 mixed precision (TE keeps BF16 weights,
  the optimizer fp32 master copies and moments), activations kept in BF16; collectives move BF16.

Devices without FP8 tensor cores (no `fp8` in the profile's `peak_tflops`: A100, V100, ...) are
refused with one line. The record's model FLOPs utilisation of an FP8 run is against the BF16 peak
(the precision of everything but the projection GEMMs); NVIDIA's published FP8 MFU uses the FP8 peak.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from dlsim.cost.layers import PassCost, layer_cost
from dlsim.cost.pricing import KernelTimes, gemm_seconds
from dlsim.cost.roofline import roofline_time
from dlsim.errors import SpecError
from dlsim.results import Estimate, Source
from dlsim.spec.cluster import Device
from dlsim.spec.model import Model

FP8 = "fp8"
COMPUTE_DTYPE = "bf16"
"""Everything but the FP8 GEMMs (and the memory, optimizer and communication accounting)."""
AMAX_HISTORY = 1024
"""Transformer Engine DelayedScaling default `amax_history_len` (transformer_engine/common/recipe)."""
CAST_BYTES = 2 + 1 + 1
"""Per element of a cast-transpose: read BF16, write the FP8 tensor and its FP8 transpose."""


def check_fp8(device: Device, cluster_name: str) -> str:
    """The note on the FP8 GEMM efficiency; refuses a device without FP8 tensor cores."""
    if FP8 not in device.peak_flops:
        have = ", ".join(sorted(device.peak_flops))
        raise SpecError(f"{cluster_name}'s {device.name} has no FP8 tensor cores (peak_tflops lists {have}); "
                        "use --dtype bf16", field="dtype")
    curve = device.efficiency.matrix.get(FP8)
    if curve is not None:
        return f"fp8 GEMMs at the fp8 peak with the profile's fp8 efficiency curve ({curve.source or 'measured'})"
    ratio = device.fp8_efficiency_ratio
    if ratio != 1.0:
        return (f"fp8 GEMMs at the fp8 peak with the bf16 efficiency curve scaled by {ratio:g} (the profile's published "
                "fp8 / bf16 best-shape ratio of this device)")
    return ("fp8 GEMMs at the fp8 peak with the bf16 efficiency curve unscaled (no published fp8 matmul measurement "
            "of this device in its profile)")


def output_head(model: Model) -> frozenset[str]:
    """Linear layers feeding the loss directly (the output projection, kept in BF16)."""
    loss_inputs = {src for layer in model.layers if layer.type == "cross_entropy" for src in layer.inputs}
    return frozenset(layer.name for layer in model.layers if layer.name in loss_inputs and layer.type == "linear")


def _swap(p: PassCost, pass_name: str, device: Device, tables: KernelTimes | None) -> float:
    """Seconds an FP8 pass saves (negative: costs) against BF16 over its projection GEMMs (count 1)."""
    delta = 0.0
    for g in p.gemms:
        if g.count == 1:
            delta += gemm_seconds(g, device, COMPUTE_DTYPE, tables) - gemm_seconds(g, device, FP8, None)
    return delta


def _cast(elements: float, device: Device, name: str, kernels: int = 1) -> float:
    return roofline_time(0.0, elements * CAST_BYTES, device, COMPUTE_DTYPE, matrix=False, kernels=kernels,
                         kernel=name).seconds


def apply_fp8(entries: Sequence, model: Model, device: Device, microbatches: int,
              tables: KernelTimes | None = None, fused: frozenset[str] = frozenset()) -> tuple:
    """`entries` (`dlsim.plan.layertable.LayerEntry`, priced in BF16) with the FP8 projection GEMMs
    and their casts: forward, backward (∇x + ∇w), ∇w and the projection windows re-priced."""
    head = output_head(model)
    out = []
    cache: dict[tuple, tuple] = {}
    for e in entries:
        layer = model.layers[e.index]
        if layer.type not in ("linear", "attention") or layer.name in head or e.forward.seconds <= 0:
            out.append(e)
            continue
        key = (layer.type, tuple(sorted((k, repr(v)) for k, v in layer.attrs.items())), layer.in_shapes,
               e.batch, e.tp_degree, e.tp.role)
        got = cache.get(key)
        if got is None:
            from dlsim.plan.tensorparallel import shard_cost
            cost = shard_cost(layer, layer_cost(layer, e.batch, COMPUTE_DTYPE, fused), e.tp, e.tp_degree, e.batch)
            proj = [g for g in cost.forward.gemms if g.count == 1]
            inputs = sum(g.m * g.k for g in proj)            # activations entering each projection
            outputs = sum(g.m * g.n for g in proj)           # their outputs' gradients, backward
            weights = sum(g.k * g.n for g in proj)
            scale = 2 * 3 * AMAX_HISTORY * 4.0               # amax history and scales, read and written
            fwd_cast = _cast(inputs, device, "fp8_cast.forward", len(proj)) + \
                _cast(weights / microbatches, device, "fp8_cast.weights") + \
                roofline_time(0.0, scale * len(proj), device, COMPUTE_DTYPE, matrix=False, kernels=1,
                              kernel="fp8_scale_update.forward").seconds
            bwd_cast = _cast(outputs, device, "fp8_cast.backward", len(proj))
            fwd = e.forward.seconds - _swap(cost.forward, "forward", device, tables) + fwd_cast
            wgrad = e.backward_weight.seconds - _swap(cost.backward_weight, "backward_weight", device, tables)
            dgrad = e.backward_data.seconds - _swap(cost.backward_data, "backward_data", device, tables) + bwd_cast
            windows = tuple(gemm_seconds(p.gemms[-1], device, FP8, None) if w > 0 and p.gemms and p.gemms[-1].count == 1
                            else w for w, p, n in ((e.windows[0], cost.backward_data, "backward_data"),
                                                   (e.windows[1], cost.backward_weight, "backward_weight")))
            got = cache[key] = (fwd, dgrad + wgrad, wgrad, windows)
        fwd, bwd, wgrad, windows = got
        note = "fp8 GEMMs (Transformer Engine) with casts"
        out.append(replace(e, forward=Estimate(fwd, Source.MODEL, note), backward=Estimate(bwd, Source.MODEL, note),
                           backward_weight=Estimate(wgrad, Source.MODEL, note), windows=windows))
    return tuple(out)
