"""Turning operator costs into seconds: measured kernel tables first, the roofline otherwise.

A `KernelTimes` (implemented over measured tables in `dlsim.cost.lookup`) answers GEMM,
convolution and memory-bound kernel queries with an `Estimate` that says whether the number was
measured, interpolated or extrapolated, or None when it cannot answer; then the roofline prices it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from dlsim.cost.flash import core_flops, flash_seconds
from dlsim.cost.gradflow import GradientFlow, backward_data_run
from dlsim.cost.layers import Gemm, LayerCost, PassCost, layer_cost
from dlsim.cost.roofline import peak, roofline_time
from dlsim.cost.unfused import core_gemm_efficiency
from dlsim.results import Estimate, LayerTiming, Source
from dlsim.spec.cluster import Device
from dlsim.spec.model import Layer
from dlsim.spec.ops import table_op
from dlsim.units import DTYPE_BYTES

PASSES = ("forward", "backward_data", "backward_weight")
WHOLE_KERNEL_OPS = ("sdpa", "lstm", "gru", "rnn", "conv_transpose2d")
"""Layer types PyTorch runs as one fused operator whose time is not the sum of its products: scaled
dot-product attention (a flash kernel on CPU, or the math path under dropout, which draws a random
mask over every score) and the recurrent layers (``aten::lstm`` and friends: oneDNN's RNN primitive
on CPU, one call for all steps and layers, whose backward computes ∇x and ∇w together), and the
transposed convolution (oneDNN's deconvolution primitive, not the convolution-gradient GEMMs the
FLOP count describes; no row of the convolution tables holds it). A calibration
times the operator itself, forward and whole backward (`dlsim.calibrate.compute_ops.memory_op`, rows
of the memory table); `whole_kernel_times` prices the layer from those rows when both were measured
for exactly its shapes, the ∇w pass then being inside the ∇x row; otherwise the GEMMs price it."""
GENERIC_LIKE = ("relu", "forward")
"""The measured curve a memory-bound pass of a `generic` operator (an imported operator dlsim has no
model for) is priced by: an element-wise kernel's time over the bytes it moves. A generic pass with
FLOPs (matrix-class work PyTorch's counter counts) goes to the roofline at the matrix peak."""


class KernelTimes(Protocol):
    """Measured kernel times. Each method returns None when it has no data for the query."""

    def gemm(self, gemm: Gemm, dtype: str) -> Estimate | None: ...

    def conv(self, pass_name: str, geometry: dict, dtype: str) -> Estimate | None: ...

    def memory_bound(self, op_type: str, pass_name: str, cost: PassCost, dtype: str) -> Estimate | None: ...

    def optimizer_step(self, optimizer: str, params: int, tensors: int, dtype: str = "fp32") -> Estimate | None: ...


def price_pass(cost: PassCost, op_type: str, pass_name: str, device: Device, dtype: str,
               tables: KernelTimes | None = None, geometry: dict | None = None) -> Estimate:
    """Seconds for one pass of one layer, with its provenance. A flash attention core (`cost.flash`)
    is one kernel priced by `dlsim.cost.flash`; the rest of the pass (projections, memory-bound
    kernels) as any pass."""
    if cost.flash is not None:
        return _flash_pass(cost, op_type, pass_name, device, dtype, tables)
    if cost.kernels == 0 and cost.flops == 0 and cost.bytes == 0:
        return Estimate(0.0, Source.MEASURED if tables is not None else Source.MODEL, "no kernel")
    if tables is not None:
        found = None
        if cost.kind == "conv" and geometry is not None:
            found = tables.conv(pass_name, geometry, dtype)
        if found is None and cost.gemms:
            parts = [tables.gemm(g, dtype) for g in cost.gemms]
            if all(p is not None for p in parts):
                found = sum(parts[1:], parts[0])  # type: ignore[arg-type]
                rest = cost.flops - cost.matmul_flops
                if cost.parts:  # the memory-bound kernels between GEMMs, measured or by the roofline
                    inner = [tables.memory_bound(op, name, part, dtype) or
                             roofline_time(part.flops, part.bytes, device, dtype, matrix=False, kernels=part.kernels,
                                           kernel=f"{op}.{name}") for op, name, part in cost.parts]
                    found = sum(inner, found)  # type: ignore[arg-type]
                    found = Estimate(found.seconds, found.source, f"{len(parts)} GEMMs + {len(inner)} memory-bound "
                                                                  f"kernels, least exact: {found.note}")
                    rest = 0.0  # the parts are the element-wise work; bias adds run inside addmm's GEMM
                if rest > 0:  # element-wise remainder (biases, gates; attention's without measured curves)
                    found = found + roofline_time(rest, 0.0, device, dtype, matrix=False, kernels=0)
        if found is None and not cost.gemms and not cost.chain:
            found = tables.memory_bound(op_type, pass_name, cost, dtype)
        if found is None and op_type == "generic" and cost.kind == "memory":  # GENERIC_LIKE: see the module doc
            found = tables.memory_bound(*GENERIC_LIKE, cost, dtype)
        if found is not None:
            return found
    if cost.gemms:
        return _roofline_gemm_pass(cost, device, dtype, pass_name)
    return roofline_time(cost.flops, cost.bytes, device, dtype, matrix=cost.kind == "generic", kernels=cost.kernels,
                         kernel=f"{op_type}.{pass_name}")


def _flash_pass(cost: PassCost, op_type: str, pass_name: str, device: Device, dtype: str,
                tables: KernelTimes | None) -> Estimate:
    """A pass holding a flash core: the core by `flash_seconds`, its single GEMMs (projections) and
    memory-bound parts as `price_pass` prices them (the core's element-wise work is inside the kernel)."""
    core = flash_seconds(cost, device, dtype)
    gemms = tuple(g for g in cost.gemms if g.count == 1)
    if gemms:
        rest = replace(cost, gemms=gemms, flops=cost.flops - core_flops(cost), work=cost.work - core_flops(cost) / 2,
                       kernels=len(gemms) + sum(p.kernels for _, _, p in cost.parts), flash=None)
        return price_pass(rest, op_type, pass_name, device, dtype, tables) + core
    for op, name, part in cost.parts:
        core = core + ((tables.memory_bound(op, name, part, dtype) if tables is not None else None) or
                       roofline_time(part.flops, part.bytes, device, dtype, matrix=False, kernels=part.kernels,
                                     kernel=f"{op}.{name}"))
    return core


def gemm_seconds(g: Gemm, device: Device, dtype: str, tables: KernelTimes | None = None) -> float:
    """Seconds of one GEMM kernel on its own: the measured tables, else the roofline (`price_pass`)."""
    return price_pass(PassCost(flops=g.flops, work=g.flops / 2, gemms=(g,), kind="gemm"), "linear", "forward",
                      device, dtype, tables).seconds


def gemm_bytes(g: Gemm, element_bytes: int) -> float:
    """Bytes a GEMM kernel moves at least: reads A (m×k) and B (k×n), writes C (m×n), per batch entry."""
    return float((g.m * g.k + g.k * g.n + g.m * g.n) * g.count * element_bytes)


def _roofline_gemm_pass(cost: PassCost, device: Device, dtype: str, pass_name: str) -> Estimate:
    """A GEMM-class pass as the kernels it runs, each timed on its own and added up: every GEMM by
    the roofline of its FLOPs and its operands' bytes (a convolution's by its share of the pass's
    bytes: its im2col operand is never materialised), then the memory-bound kernels between the
    GEMMs (`PassCost.parts`: softmax, masking, dropout, layout copies) by their own traffic. A pass
    without parts prices its element-wise remainder (bias adds, gates) at the vector peak."""
    estimate = Estimate(0.0, Source.MODEL, "roofline")
    element = DTYPE_BYTES[dtype]
    gemm_flops = cost.matmul_flops
    core = cost.unfused and core_gemm_efficiency(device, dtype, "forward" if pass_name == "forward" else "backward",
                                                 cost.unfused.length, cost.unfused.head_dim)
    for g in cost.gemms:
        if core and g.count > 1:  # an unfused attention core's batched GEMM (`dlsim.cost.unfused`)
            estimate = estimate + Estimate(g.flops / (peak(device, dtype, True) * core) + device.launch_overhead,
                                           Source.MODEL, "attention core GEMM at the measured standard-attention rate")
            continue
        if cost.kind == "conv":
            nbytes = cost.bytes * (g.flops / gemm_flops if gemm_flops else 0.0)
        else:
            nbytes = gemm_bytes(g, element)
        estimate = estimate + roofline_time(g.flops, nbytes, device, dtype, matrix=True)
    if cost.parts:
        for op, name, part in cost.parts:
            estimate = estimate + roofline_time(part.flops, part.bytes, device, dtype, matrix=False,
                                                kernels=part.kernels, kernel=f"{op}.{name}")
        return estimate
    extra_kernels = max(cost.kernels - len(cost.gemms), 0)
    rest = cost.flops - gemm_flops
    if rest > 0 or extra_kernels:
        estimate = estimate + roofline_time(rest, 0.0, device, dtype, matrix=False, kernels=extra_kernels)
    return estimate


def whole_kernel_times(layer: Layer, cost: LayerCost, dtype: str,
                       tables: KernelTimes | None) -> list[Estimate] | None:
    """[forward, ∇x, ∇w] of a `WHOLE_KERNEL_OPS` layer from the rows timing its fused operator (forward,
    and the whole backward as the ∇x row; ∇w 0, inside it), or None unless both rows are exact
    measurements of the layer's own shapes (no interpolation between attention or RNN shapes)."""
    if tables is None or layer.type not in WHOLE_KERNEL_OPS:
        return None
    fwd = tables.memory_bound(layer.type, "forward", cost.forward, dtype)
    bwd = tables.memory_bound(layer.type, "backward_data", cost.backward_data, dtype)
    if fwd is None or bwd is None or fwd.source != Source.MEASURED or bwd.source != Source.MEASURED:
        return None
    return [fwd, bwd, Estimate(0.0, Source.MEASURED, f"inside the fused {layer.type} backward (the ∇x row)")]


def price_layer(layer: Layer, batch: int, dtype: str, device: Device, tables: KernelTimes | None = None,
                cost: LayerCost | None = None, backward_data: PassCost | None = None) -> LayerTiming:
    """Forward, ∇x and ∇w time of one layer for `batch` samples on `device`; `backward_data` is the part of
    the ∇x pass that runs (`dlsim.cost.gradflow.backward_data_run`; default all of it), except for a layer
    timed as one fused operator, whose backward runs whole."""
    return _price(layer, batch, dtype, device, tables, cost or layer_cost(layer, batch, dtype), backward_data)[0]


def _price(layer: Layer, batch: int, dtype: str, device: Device, tables: KernelTimes | None, cost: LayerCost,
           backward_data: PassCost | None) -> tuple[LayerTiming, bool]:
    """`price_layer`, and whether the layer was timed as one fused operator."""
    priced = cost if backward_data is None else replace(cost, backward_data=backward_data)
    whole = whole_kernel_times(layer, cost, dtype, tables)
    op = table_op(layer.type, layer.attrs)
    times = whole or [price_pass(getattr(priced, p), op, p, device, dtype, tables, cost.conv) for p in PASSES]
    return LayerTiming(layer.name, layer.type, times[0], times[1], times[2], cost.flops, layer.params, 0.0,
                       layer.out_shape), whole is not None


def price_in_step(layer: Layer, batch: int, dtype: str, device: Device, tables: KernelTimes | None, cost: LayerCost,
                  flow: GradientFlow) -> tuple[LayerTiming, bool]:
    """`price_layer` with the backward autograd runs in a training step (`dlsim.cost.gradflow`): none for a
    layer the loss never reaches, and of the ∇x pass only what the inputs needing a gradient and the
    layer's weights need; also whether the layer was timed as one fused operator."""
    runs = backward_data_run(layer, cost, flow.free)
    timing, fused = _price(layer, batch, dtype, device, tables, cost, runs)
    if layer.name in flow.unreached:
        note = "no path to the loss: never reached by the backward"
        return replace(timing, backward_data=Estimate(0.0, timing.backward_data.source, note),
                       backward_weight=Estimate(0.0, timing.backward_weight.source, note)), fused
    if not fused and runs is not cost.backward_data and runs.kernels == 0:
        timing = replace(timing, backward_data=Estimate(0.0, timing.backward_data.source, "input needs no gradient"))
    return timing, fused
