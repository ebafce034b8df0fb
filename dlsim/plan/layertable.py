"""Per-layer, per-device costs of one micro-batch: the table a task graph is built from.

Each layer is priced once per (shape, batch, tensor-parallel role) through `dlsim.cost.pricing`
(measured kernel tables first, roofline otherwise, with provenance), after dividing its work by the
tensor-parallel degree where the layer is split (`dlsim.plan.tensorparallel`), with the backward autograd runs
(`dlsim.cost.gradflow`: no ∇x of the network's input, no backward for a layer the loss never reaches). Saved activations are
those `dlsim.cost.memory.activation_bytes` charges to each layer, divided by `tp` where the tensor
or the layer is sharded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from dlsim.cost.layers import LayerCost, PassCost, fuse_dropout_add, layer_cost
from dlsim.cost.memory import activation_bytes
from dlsim.cost.gradflow import GradientFlow
from dlsim.cost.pricing import KernelTimes, price_in_step, price_pass
from dlsim.cost.roofline import roofline_time
from dlsim.results import Estimate, Source
from dlsim.spec.cluster import Device
from dlsim.spec.memo import derived
from dlsim.spec.records import made, replaced
from dlsim.spec.model import INPUT, Model
from dlsim.spec.strategy_values import flash_kernel
from dlsim.plan.blocks import recompute_layers
from dlsim.plan.contextparallel import RingAttention
from dlsim.plan.expertparallel import ExpertPlan, expert_plan
from dlsim.plan.oprecompute import mm_positions, op_checkpoint
from dlsim.plan.spatial import HaloExchange
from dlsim.plan.tensorparallel import TPLayer, attention_core, role_template, shard_cost, with_bytes
from dlsim.units import DTYPE_BYTES

ZERO = Estimate(0.0, Source.MODEL, "none")


@dataclass(frozen=True)
class LayerEntry:
    """One layer as one device runs it for one micro-batch of `batch` samples.

    forward / backward (∇x + ∇w, of which `backward_weight` is ∇w) with provenance; `params` held by the device; `saved_bytes` kept
    from the forward until the backward; `out_bytes` of its output on this device; `tp` its
    tensor-parallel role and collectives; `core` / `core_bytes` the attention core that selective
    recomputation re-runs and the bytes that saves; `workspace` bytes of scratch memory; `windows`
    the seconds of the input projection's ∇x and ∇w GEMMs (the last GEMM of each backward pass: a
    linear layer's whole GEMM, an attention's Q/K/V projection), beside which an asynchronous
    tensor-parallel collective runs (`dlsim.plan.templates.backward_steps`); `ring` an attention's
    KV ring under context parallelism (`dlsim.plan.contextparallel.add_rings`); `tp_overlap` its
    GEMMs chunked beside their sequence-parallel collectives (`dlsim.plan.tpoverlap.add_tp_overlap`).
    """

    index: int
    name: str
    type: str
    batch: int
    tp_degree: int
    forward: Estimate
    backward: Estimate
    params: int
    saved_bytes: float
    out_bytes: float
    flops: float
    tp: TPLayer
    core: Estimate = ZERO
    core_bytes: float = 0.0
    workspace: float = 0.0
    backward_weight: Estimate = ZERO
    windows: tuple[float, float] = (0.0, 0.0)
    experts: ExpertPlan | None = None
    """A mixture of experts under expert parallelism: its all-to-alls, router and shared-expert
    seconds, parameters (`dlsim.plan.expertparallel`)."""
    ring: RingAttention | None = None
    halo: "HaloExchange | None" = None
    """A spatially split convolution's or pooling's halo exchanges (`dlsim.plan.spatial.add_halos`)."""
    tp_overlap: tuple = ()
    op_core: Estimate = ZERO
    op_kept: float = 0.0
    """Under torchtitan's selective_op checkpointing, the seconds of this layer's forward recomputed
    before its block's backward and the bytes of its outputs the policy keeps (`dlsim.plan.oprecompute`)."""

    @property
    def backward_data(self) -> Estimate:
        """The input-gradient part of `backward` (∇x)."""
        return Estimate(self.backward.seconds - self.backward_weight.seconds, self.backward.source, self.backward.note)


def _price_classes(model: Model) -> list[int]:
    """Per layer, a class shared by the layers priced alike at the same batch, tensor-parallel degree,
    role and fusion: same type, attributes, shapes, and the same gradient flow (never reached by the
    backward; which inputs need no gradient). The repeated blocks of a transformer fall into a dozen
    classes; computed once per model (`dlsim.spec.memo`)."""
    def make() -> list[int]:
        flow = GradientFlow.of(model)
        ids: dict[tuple, int] = {}
        out = []
        for layer in model.layers:
            attrs = tuple(sorted((k, repr(v)) for k, v in layer.attrs.items()))
            key = (layer.type, attrs, layer.in_shapes, layer.out_shape, layer.name in flow.unreached,
                   tuple(src in flow.free for src in layer.inputs))
            out.append(ids.setdefault(key, len(ids)))
        return out
    return derived(model, "price classes", make)


def build_layer_table(model: Model, device: Device, dtype: str, *, batch: int | Sequence[int], tp: int | Sequence[int],
                      tables: KernelTimes | None = None, ep: int = 1, ep_overlap: bool = False,
                      overrides: Mapping[str, tuple[Estimate, Estimate, float]] | None = None,
                      sequence_parallel: bool = False, fused: frozenset[str] = frozenset(),
                      forced: Sequence[str] | None = None, loss: str = "single_pass") -> tuple[LayerEntry, ...]:
    """The per-device cost of every layer of `model`.

    `sequence_parallel` splits the layers between tensor-parallel regions along the sequence;
    `fused` names the fused kernels of the software stack (`dlsim.spec.strategy.FUSIONS`), `loss` its
    cross-entropy kernels (`dlsim.cost.loss`). The
    gradient accumulation is added afterwards (`with_grad_accumulation`), once the stages are cut.

    `ep` spreads the experts of mixture-of-experts layers over that many ranks
    (`dlsim.plan.expertparallel`): each is priced as its busiest rank runs it, its shared experts
    beside the all-to-alls with `ep_overlap`.

    `batch` and `tp` are one value for all layers or one per layer (per-layer-group strategies);
    `forced` per layer the split ("channel", "filter", "" for none) of a channel or filter group.
    `overrides` maps a layer name to (forward, backward, workspace bytes) measured elsewhere (the
    μ-cuDNN micro-batch planner's per-layer convolution times).
    """
    n = len(model.layers)
    batches = [batch] * n if isinstance(batch, int) else list(batch)
    degrees = [tp] * n if isinstance(tp, int) else list(tp)
    roles: dict[str, TPLayer] = {}
    # classify runs of layers with the same (batch, tp); a sharded tensor entering a run keeps its state
    sharded_out: set[str] = set()
    start = 0
    while start < n:
        end = start
        while end < n and (batches[end], degrees[end]) == (batches[start], degrees[start]):
            end += 1
        run, inputs = model.layers[start:end], frozenset(sharded_out)
        splits = tuple(forced[start:end]) if forced else None
        force = {layer.name: split for layer, split in zip(run, splits)} if splits else None
        # the roles of a run depend on the batch only through their collectives' bytes: one template
        # per (degree, run), its bytes filled in per (batch, dtype)
        template = derived(model, ("tp role template", degrees[start], start, end, inputs, sequence_parallel, splits),
                           lambda: role_template(model, degrees[start], run, inputs, sequence_parallel, force))
        got = derived(model, ("tp roles", degrees[start], batches[start], dtype, start, end, inputs, sequence_parallel,
                              splits),
                      lambda: with_bytes(template, model, batches[start], dtype))
        roles.update(got)
        sharded_out |= {name for name, r in got.items() if r.out_sharded}
        start = end
    fused_pairs = _dropout_add_pairs(model) if "bias_dropout_add" in fused else {}
    blocks, mms = recompute_layers(model), mm_positions(model)
    b_el = DTYPE_BYTES[dtype]
    fused_names = set(fused_pairs) | set(fused_pairs.values())
    flow = GradientFlow.of(model)
    classes = _price_classes(model)
    costs: dict[str, LayerCost] = {}
    priced: dict[tuple, tuple] = {}
    plan_cache: dict[tuple, ExpertPlan | None] = {}
    plans: dict[str, ExpertPlan | None] = {}
    entries_raw = []
    for i, layer in enumerate(model.layers):
        b, t, role = batches[i], degrees[i], roles[layer.name]
        fusion = layer.name in fused_names
        in_block, mm = blocks[layer.name] is not None, mms.get(layer.name)
        key = (classes[i], b, t, role.role, fusion, in_block, mm and (mm[0] % 2, mm[1]))
        if key not in priced:
            full = layer_cost(layer, b, dtype, fused, ep=ep, loss=loss)
            if fusion:  # a dropout and the residual add consuming it (Megatron-LM's bias_dropout_add)
                full = _fused_dropout_add(model, layer, full, fused_pairs, b, dtype)
            cost = shard_cost(layer, full, role, t, b)
            timing = price_in_step(layer, b, dtype, device, tables, cost, flow)[0]
            core, core_bytes = ZERO, 0.0
            if layer.type == "attention" and flash_kernel(fused) is None:
                core_pass, core_bytes = attention_core(layer, cost, b, dtype, t if role.compute_sharded else 1)
                core = price_pass(core_pass, layer.type, "forward", device, dtype, tables)
            windows = (_projection_window(cost.backward_data, device, dtype, tables),
                       _projection_window(cost.backward_weight, device, dtype, tables))
            op = op_checkpoint(layer, cost, mm, flash_kernel(fused) is not None, timing.forward,
                               layer.out_elements * b * b_el / (t if role.out_sharded else 1), dtype, device,
                               tables) if in_block else (ZERO, 0.0)
            priced[key] = (cost, timing, core, core_bytes, windows, timing.backward_data + timing.backward_weight, op)
        cost, timing, core, core_bytes, windows, bwd, op = priced[key]
        costs[layer.name] = cost
        if ep > 1 and layer.type == "moe":
            if key not in plan_cache:
                plan_cache[key] = expert_plan(layer, cost, b, dtype, ep, t if role.params_sharded else 1, device, tables,
                                              ep_overlap)
            plans[layer.name] = plan_cache[key]
        entries_raw.append((layer, b, t, role, cost, timing, core, core_bytes, windows, bwd, op))
    saved = _saved_bytes(model, costs, batches, dtype)
    out = []
    for i, (layer, b, t, role, cost, timing, core, core_bytes, windows, bwd, op) in enumerate(entries_raw):
        own, extra = saved[layer.name]
        shard = t if role.out_sharded else 1
        fwd, wgrad = timing.forward, timing.backward_weight
        workspace = 0.0
        if overrides and layer.name in overrides:
            fwd, bwd, workspace = overrides[layer.name]
            wgrad, windows = ZERO, (0.0, 0.0)
        params = layer.params // t if role.params_sharded else layer.params
        plan = plans.get(layer.name)
        if plan is not None:
            params = plan.params
        out.append(made(LayerEntry, index=i, name=layer.name, type=layer.type, batch=b, tp_degree=t, forward=fwd,
                              backward=bwd, params=params, saved_bytes=own / shard + extra,
                              out_bytes=layer.out_elements * b * b_el / shard, flops=cost.flops, tp=role, core=core,
                              core_bytes=core_bytes, workspace=workspace, backward_weight=wgrad, windows=windows,
                              experts=plan, op_core=op[0], op_kept=op[1]))
    return tuple(out)


def grad_accumulation_times(entries: Sequence[LayerEntry], device: Device,
                            grad_accumulation: float) -> list[Estimate | None]:
    """Per entry, the gradient accumulation of `grad_accumulation` bytes per parameter
    (`dlsim.cost.memory.grad_accumulation_bytes`): one memory-bound fp32 kernel (roofline) per
    layer with parameters, None for a layer without."""
    out: list[Estimate | None] = []
    by_size: dict[int, Estimate] = {}  # repeated blocks: the same sizes again and again
    for e in entries:
        if e.params > 0 and grad_accumulation > 0:
            add = by_size.get(e.params)
            if add is None:
                add = by_size[e.params] = roofline_time(0.0, e.params * grad_accumulation, device, "fp32",
                                                        matrix=False, kernels=1, kernel="grad_accumulation")
            out.append(add)
        else:
            out.append(None)
    return out


def with_grad_accumulation(entries: tuple[LayerEntry, ...], device: Device,
                           grad_accumulation: float) -> tuple[LayerEntry, ...]:
    """`entries` with each layer's gradient accumulation (`grad_accumulation_times`) added to its
    weight-gradient pass. The same entries when it is 0."""
    if grad_accumulation <= 0:
        return entries
    out = []
    sums: dict[tuple, tuple[Estimate, Estimate]] = {}
    for e, add in zip(entries, grad_accumulation_times(entries, device, grad_accumulation)):
        if add is not None:
            key = (e.backward, e.backward_weight, add)
            got = sums.get(key)
            if got is None:
                got = sums[key] = (e.backward + add, e.backward_weight + add)
            e = replaced(e, backward=got[0], backward_weight=got[1])
        out.append(e)
    return tuple(out)


def _projection_window(cost: PassCost, device: Device, dtype: str, tables: KernelTimes | None) -> float:
    """Seconds of a backward pass's last GEMM (its input projection's), 0 without GEMMs."""
    if not cost.gemms or cost.kind != "gemm":
        return 0.0
    g = cost.gemms[-1]
    return price_pass(PassCost(flops=g.flops, work=g.flops / 2, gemms=(g,), kind="gemm"), "linear", "backward",
                      device, dtype, tables).seconds


def _dropout_add_pairs(model: Model) -> dict[str, str]:
    """Dropout layers whose only consumer is a residual add of two tensors: dropout name → add name
    (once per model: `dlsim.spec.memo`)."""
    return derived(model, "dropout+add pairs", lambda: _find_dropout_add_pairs(model))


def _find_dropout_add_pairs(model: Model) -> dict[str, str]:
    consumers: dict[str, list[str]] = {}
    for layer in model.layers:
        for src in layer.inputs:
            consumers.setdefault(src, []).append(layer.name)
    kinds = {layer.name: layer for layer in model.layers}
    pairs = {}
    for layer in model.layers:
        users = consumers.get(layer.name, [])
        if layer.type == "dropout" and len(users) == 1:
            add = kinds[users[0]]
            if add.type == "add" and len(add.inputs) == 2 and add.name not in pairs.values():
                pairs[layer.name] = add.name
    return pairs


def _fused_dropout_add(model: Model, layer, cost: LayerCost, pairs: dict[str, str], batch: int,
                       dtype: str) -> LayerCost:
    """The dropout of a fused pair carries the add's work and reads the residual; the add is free."""
    if layer.name in pairs:
        add = model.layer(pairs[layer.name])
        residual = next(src for src in add.inputs if src != layer.name)
        add_cost = layer_cost(add, batch, dtype)
        elements = add.out_elements if residual != INPUT else math.prod(model.input_shape)
        return fuse_dropout_add(cost, add_cost, elements * batch * DTYPE_BYTES[dtype])[0]
    dropout = next(d for d, a in pairs.items() if a == layer.name)
    return fuse_dropout_add(layer_cost(model.layer(dropout), batch, dtype), cost, 0.0)[1]


def _saved_bytes(model: Model, costs: dict[str, LayerCost], batches: list[int], dtype: str) -> dict[str, tuple[float, float]]:
    """(kept output bytes, extra saved bytes) per layer, each at the layer's own batch."""
    plain: dict[int, LayerCost] = {}  # layers priced alike share their cost: strip each once
    for c in costs.values():
        if id(c) not in plain:
            plain[id(c)] = replace(c, extra_saved_bytes=0.0)
    no_extra = {name: plain[id(c)] for name, c in costs.items()}
    by_batch = {b: activation_bytes(model, no_extra, b, dtype) for b in sorted(set(batches))}
    result = {}
    for i, layer in enumerate(model.layers):
        own = by_batch[batches[i]][layer.name]
        result[layer.name] = (own, costs[layer.name].extra_saved_bytes)
    return result


def boundary_bytes(model: Model, entries: Sequence[LayerEntry], ranges: Sequence[tuple[int, int]]) -> list[float]:
    """Bytes that cross each chunk boundary i → i+1 per micro-batch: the outputs of layers in chunks
    ≤ i used by layers in chunks > i (the model input is present everywhere), `crossing_bytes` at
    each `cut_positions`."""
    return [crossing_bytes(model, entries, a) for a in cut_positions(model, entries, ranges)]


def cut_positions(model: Model, entries: Sequence[LayerEntry], ranges: Sequence[tuple[int, int]]) -> list[int]:
    """The first layer of each chunk after the first; chunks must be consecutive runs of layers
    covering the model (KeyError otherwise, as a lookup of a layer outside them)."""
    if len(entries) != len(model.layers) or (ranges and (ranges[0][0] != 0 or ranges[-1][1] != len(entries) or any(
            b != a for (_, b), (a, _) in zip(ranges, ranges[1:])))):
        raise KeyError(f"chunks {list(ranges)} do not cover the {len(model.layers)} layers in order")
    return [a for a, _ in ranges[1:]]


def crossing_bytes(model: Model, entries: Sequence[LayerEntry], at: int) -> float:
    """Bytes per micro-batch of the outputs of layers before position `at` that a layer at or after
    `at` reads (what a pipeline cut before layer `at` sends on), summed in layer order; which layers
    cross each position the model knows once (`_crossing`)."""
    total = 0.0
    for i in _crossing(model)[at]:
        total += entries[i].out_bytes
    return total


def _crossing(model: Model) -> list[tuple[int, ...]]:
    """Per position `at` (0..n), the positions i < at of the layers whose last consumer is at or
    after `at`, ascending (`dlsim.spec.memo`: once per model)."""
    def make() -> list[tuple[int, ...]]:
        _, last_use = _last_consumers(model)
        out: list[list[int]] = [[] for _ in range(len(model.layers) + 1)]
        for i, last in enumerate(last_use):
            for at in range(i + 1, last + 1):
                out[at].append(i)
        return [tuple(x) for x in out]
    return derived(model, "crossing layers", make)


def _last_consumers(model: Model) -> tuple[dict[str, int], list[int]]:
    """Per layer name its position in the model, and per position the position of the last layer
    that reads its output (−1: none), once per model (`dlsim.spec.memo`)."""
    def make() -> tuple[dict[str, int], list[int]]:
        position = {layer.name: i for i, layer in enumerate(model.layers)}
        last = [-1] * len(model.layers)
        for i, layer in enumerate(model.layers):
            for src in layer.inputs:
                j = position.get(src, -1) if src != INPUT else -1
                if j >= 0:
                    last[j] = max(last[j], i)
        return position, last
    return derived(model, "last consumers", make)


def round_up(x: float, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple)
