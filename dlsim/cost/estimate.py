"""One device, one training iteration: per-layer times, optimizer step, memory, provenance.

iteration = Σ_layers (forward + ∇x + ∇w) + optimizer step, executed one kernel after another
(no overlap on a single device). Tables that distinguish cold and warm caches are mixed by the share
of the step's working set the last-level cache cannot hold
(`dlsim.cost.lookup.CacheAwareKernelTimes.for_working_set`, noted). A layer
whose inputs all need no gradient (the model's input, or what was computed from it without
parameters: `dlsim.cost.gradflow`) computes no ∇x; autograd skips it; a layer no path carries to the loss runs no
backward at all. The optimizer step comes from the measured tables when they
have it (`KernelTimes.optimizer_step`; a captured network's step as its eager loop runs it:
`dlsim.cost.hostops.in_loop_optimizer_step`), from the roofline otherwise.
"""

from __future__ import annotations

from dataclasses import replace

from dlsim.cost.gradflow import GradientFlow
from dlsim.cost.allocation import AllocatorCost, step_charges, step_requested_bytes
from dlsim.cost.hostops import HostOpCost, in_loop_optimizer_step
from dlsim.cost.layers import layer_cost
from dlsim.cost.memory import (OPTIMIZERS, activation_bytes, mixed_precision_step_traffic, optimizer_step_traffic, state_bytes_per_param,
                               training_working_set)
from dlsim.cost.pricing import KernelTimes, price_in_step
from dlsim.cost.roofline import roofline_time
from dlsim.results import Estimate, EstimateResult, MemoryBreakdown, Source
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model


def estimate_iteration(model: Model, cluster: Cluster, batch: int, *, dtype: str | None = None,
                       optimizer: str = "adam", tables: KernelTimes | None = None,
                       notes: tuple[str, ...] = (), allocator: AllocatorCost | None = None,
                       host: HostOpCost | None = None) -> EstimateResult:
    """Predict one training iteration of `model` with `batch` samples on one device of `cluster`; with a
    ``default`` `allocator`, each pass also pays the fresh pages of what it allocates
    (`dlsim.cost.allocation`); with `host`, each captured layer pays the measured host
    time of the ATen operators it dispatches (`dlsim.cost.hostops`)."""
    dtype = dtype or model.dtype
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}")
    device = cluster.device
    costs = {layer.name: layer_cost(layer, batch, dtype) for layer in model.layers}
    kept = activation_bytes(model, costs, batch, dtype)
    select = getattr(tables, "for_working_set", None)  # cold/warm mix (dlsim.cost.lookup.CacheAwareKernelTimes)
    if select is not None:
        tables, regime = select(training_working_set(model, costs, batch, dtype, optimizer, kept))
        notes = (*notes, regime)
    timings = []
    flow = GradientFlow.of(model)
    charges = step_charges(model, batch, dtype, allocator, flow.free) if allocator is not None else {}
    for layer in model.layers:
        timing, fused = price_in_step(layer, batch, dtype, device, tables, costs[layer.name], flow)
        timing = replace(timing, activation_bytes=kept[layer.name])
        host_charges = host.charges(layer, fused) if host is not None else {}
        if layer.name in flow.unreached:
            host_charges = {p: s for p, s in host_charges.items() if p == "forward"}
        for pass_name, seconds in charges.get(layer.name, {}).items():
            timing = replace(timing, **{pass_name: getattr(timing, pass_name) + Estimate(
                seconds, Source.INTERPOLATED, "fresh pages (measured rate x (mapped + re-fault share x heap) bytes)")})
        for pass_name, seconds in host_charges.items():
            timing = replace(timing, **{pass_name: getattr(timing, pass_name) + Estimate(
                seconds, Source.INTERPOLATED, "host time of the ATen operators dispatched (measured rate x operators)")})
        timings.append(timing)
    step_bytes, step_flops = optimizer_step_traffic(model.params, optimizer)
    tensors = sum(1 for layer in model.layers if layer.params)
    per = state_bytes_per_param(dtype, optimizer)
    step = None
    if tables is not None and host is not None:
        footprint = step_requested_bytes(model, batch, dtype, flow.free) + model.params * per.total
        step = in_loop_optimizer_step(tables, optimizer, model.params, tensors, footprint, host)
    if step is None and tables is not None:
        step = tables.optimizer_step(optimizer, model.params, tensors)
    if step is None:
        step = roofline_time(step_flops, step_bytes, device, "fp32", matrix=False, kernels=max(1, tensors // 32))
    extra_bytes, extra_flops = mixed_precision_step_traffic(model.params, dtype)
    if extra_bytes:
        step = step + roofline_time(extra_flops, extra_bytes, device, "fp32", matrix=False, kernels=max(1, tensors // 32))
    memory = MemoryBreakdown(weights=model.params * per.weights, gradients=model.params * per.gradients,
                             optimizer=model.params * per.optimizer, activations=sum(kept.values()))
    return EstimateResult(model.name, cluster.name, device.name, batch, dtype, optimizer, tuple(timings), step, memory,
                          device.memory_bytes - device.memory_reserved, sum(t.flops for t in timings), model.params, notes,
                          fresh_pages_s=sum(sum(passes.values()) for passes in charges.values()))
