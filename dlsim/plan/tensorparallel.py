"""Megatron-style tensor (intra-layer model) parallelism over any layer DAG.

Shoeybi et al. 2019 (Megatron-LM) §3 and Narayanan et al. SC'21 §2.3 (reference/algorithms.md §5.1):
a linear layer whose input is replicated is split column-wise (output features sharded, no forward
communication, its input gradient all-reduced in the backward pass: the `f` operator); a linear
layer whose input is sharded is split row-wise (partial sums all-reduced in the forward pass: the
`g` operator). Multi-head attention splits its heads (column-parallel Q/K/V, row-parallel output
projection: one all-reduce forward, one backward). Embeddings are vocabulary-parallel (one
forward all-reduce); the loss over a sharded vocabulary is the parallel cross-entropy (three
all-reduces of one value per row: max logit, sum of exponentials, target logit). Element-wise and
per-channel operators keep the sharding; operators that need whole features (layer norm, softmax,
recurrent layers, ...) gather a sharded input first. Convolutions follow the linear rule over
channels.

Per transformer layer this gives 2 forward + 2 backward all-reduces of b·s·h elements (SC'21 §3.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dlsim.cost.layers import MASK_BYTES, Gemm, LayerCost, PassCost
from dlsim.spec.model import INPUT, Layer, Model
from dlsim.spec.records import replaced
from dlsim.units import DTYPE_BYTES

_KEEPS_SHARDING = {"relu", "gelu", "tanh", "sigmoid", "dropout", "maxpool", "avgpool", "lrn", "batchnorm",
                   "global_avgpool", "global_maxpool", "flatten", "swiglu", "geglu"}
"""Element-wise or per-channel operators; a gated unit's gate and value halves are split alike (Megatron-LM
shards the fused gate/up projection so that every rank holds matching halves)."""
_SPLITTABLE = {"linear", "conv2d"}
LOSS_REDUCTIONS = 3
"""Megatron parallel cross-entropy: all-reduces of max logit, sum of exp, target logit (one fp32 per row)."""


@dataclass(frozen=True)
class Collective:
    """A collective inside a layer sequence: `op` over `nbytes` (the full, unsharded tensor), over
    the layer's model-parallel group unless `group` names another ("tp" or "dp"). It blocks the
    compute stream, unless the strategy runs tensor-parallel backward communication
    asynchronously (`Strategy.tp_async_backward`) and `overlap` names the backward kernels it can
    run beside: "dgrad" (the layer's input-gradient kernels) or "wgrad" (its weight-gradient
    kernels), as Megatron-LM's column-parallel linear layers do (Narayanan et al. SC'21 §4.2;
    Korthikanti et al. 2022 §4.2.2). A halo exchange (op "halo", `dlsim.plan.spatial`) lists its
    point-to-point `messages` (sender and receiver index in the group, bytes)."""

    op: str
    nbytes: float
    why: str
    group: str | None = None
    overlap: str = ""
    messages: tuple[tuple[int, int, float], ...] = ()


@dataclass(frozen=True)
class TPLayer:
    """How one layer runs under tensor parallelism of degree `tp`.

    role: replicated | column | row | sharded | attention | vocab | parallel_ce. `compute_sharded`
    and `params_sharded` say whether its work and parameters are divided by `tp`; `out_sharded`
    whether this device holds 1/tp of its output (split along the features, or along the
    sequence when `seq_out`). Collectives: `before` (gather sharded inputs), `after_fwd` (after the
    forward), `before_bwd` (before the backward: sequence parallelism's gathers of the output
    gradient and of the saved input), `after_bwd` (after the backward, on the input gradient).
    """

    role: str
    compute_sharded: bool
    params_sharded: bool
    out_sharded: bool
    before: tuple[Collective, ...] = ()
    after_fwd: tuple[Collective, ...] = ()
    after_bwd: tuple[Collective, ...] = ()
    before_bwd: tuple[Collective, ...] = ()
    seq_out: bool = False


def _rows(layer: Layer, batch: int) -> int:
    shape = layer.in_shapes[0] if layer.in_shapes else layer.out_shape
    return batch * math.prod(shape[:-1]) if layer.type in ("linear", "attention", "moe", "mla") else -1


def classify(model: Model, tp: int, batch: int, dtype: str, layers: tuple[Layer, ...] | None = None,
             sharded_inputs: frozenset[str] = frozenset(), sequence_parallel: bool = False,
             forced: dict[str, str] | None = None) -> dict[str, TPLayer]:
    """Role and collectives of every layer (of `layers`, default all) for tensor parallel degree `tp`.

    `sharded_inputs` names tensors produced outside `layers` that arrive feature-sharded. With
    `sequence_parallel` the layers between tensor-parallel regions run on 1/tp of the sequence
    (`_classify_sequence_parallel`). `forced` maps a layer to the split of its convolution or fully
    connected layer ("filter" or "channel", `_forced_split`) instead of the alternation.
    The roles are `role_template`'s (which do not depend on the batch or the dtype) with their
    collectives' bytes filled in (`with_bytes`).
    """
    return with_bytes(role_template(model, tp, layers, sharded_inputs, sequence_parallel, forced), model, batch, dtype)


def role_template(model: Model, tp: int, layers: tuple[Layer, ...] | None = None,
                  sharded_inputs: frozenset[str] = frozenset(), sequence_parallel: bool = False,
                  forced: dict[str, str] | None = None) -> dict[str, TPLayer]:
    """`classify`'s roles with each collective's `nbytes` naming what it moves instead of its bytes:
    a tensor's name (its output, the whole tensor) or ("rows", layer) (the parallel cross-entropy's
    fp32 value per row). The roles depend on the batch only through those bytes, so a search's
    layer tables of one degree and different micro-batch sizes share one template (`with_bytes`)."""
    out_bytes = {layer.name: layer.name for layer in model.layers}
    if model.input_kind == "tensor":
        out_bytes[INPUT] = INPUT
    sharded: dict[str, bool] = {name: True for name in sharded_inputs}
    seq: dict[str, bool] = {}
    result: dict[str, TPLayer] = {}
    alike: dict[TPLayer, TPLayer] = {}  # roles without collectives, one record each (shared by the layers)
    for layer in layers if layers is not None else model.layers:
        ins = [sharded.get(src, False) for src in layer.inputs]
        gradient_needed = [src != INPUT for src in layer.inputs]
        if tp == 1:
            role = TPLayer("replicated", False, False, False)
        else:
            role = None
            if sequence_parallel:
                role = _classify_sequence_parallel(layer, ins, [seq.get(src, False) for src in layer.inputs],
                                                   gradient_needed, out_bytes)
            if role is None and forced and forced.get(layer.name) and layer.type in _SPLITTABLE:
                role = _forced_split(layer, forced[layer.name], ins, gradient_needed, out_bytes)
            if role is None:
                role = _classify_one(layer, ins, gradient_needed, out_bytes, tp)
        sharded[layer.name] = role.out_sharded and not role.seq_out
        seq[layer.name] = role.seq_out
        if not (role.before or role.after_fwd or role.after_bwd or role.before_bwd):
            role = alike.setdefault(role, role)
        result[layer.name] = role
    return result


def with_bytes(template: dict[str, TPLayer], model: Model, batch: int, dtype: str) -> dict[str, TPLayer]:
    """The roles of `template` (`role_template`) at micro-batch `batch` in `dtype`: each collective
    moves its tensor's output elements x batch x the dtype's bytes, or 4 bytes per row of a parallel
    cross-entropy; roles without collectives are the template's own (frozen) records. The others are
    copies (`dlsim.spec.records.replaced`: a table has hundreds of them)."""
    b = DTYPE_BYTES[dtype]
    out_bytes: dict[object, float] = {layer.name: layer.out_elements * batch * b for layer in model.layers}
    if model.input_kind == "tensor":
        out_bytes[INPUT] = math.prod(model.input_shape) * batch * b
    by_name = {layer.name: layer for layer in model.layers}

    def size(what: object) -> float:
        if isinstance(what, tuple):  # ("rows", layer): the parallel cross-entropy's rows, one fp32 each
            rows = batch * math.prod(by_name[what[1]].in_shapes[0][:-1])
            return rows * 4
        return out_bytes[what]

    def filled(cs: tuple[Collective, ...]) -> tuple[Collective, ...]:
        return tuple([replaced(c, nbytes=size(c.nbytes)) for c in cs]) if cs else cs

    result: dict[str, TPLayer] = {}
    for name, role in template.items():
        if role.before or role.after_fwd or role.after_bwd or role.before_bwd:
            role = replaced(role, before=filled(role.before), after_fwd=filled(role.after_fwd),
                            after_bwd=filled(role.after_bwd), before_bwd=filled(role.before_bwd))
        result[name] = role
    return result


_PER_TOKEN = _KEEPS_SHARDING | {"layernorm", "rmsnorm", "add", "concat"}


def _classify_sequence_parallel(layer: Layer, ins: list[bool], seq_ins: list[bool], grad_needed: list[bool],
                                out_bytes: dict) -> TPLayer | None:
    """Roles under sequence parallelism (Korthikanti et al. 2022, §4.2.2), None where the plain
    tensor-parallel rules apply. Layer norms, dropouts, residual adds and activations between the
    tensor-parallel regions run on 1/tp of the sequence; Megatron's `g` (all-reduce of a
    row-parallel output) becomes a reduce-scatter forward and an all-gather of the output gradient
    backward; its `f` (identity forward, all-reduce of the input gradient backward) becomes an
    all-gather of the sequence-sharded input forward and a reduce-scatter of the input gradient
    backward. The gathered input is not kept: the backward gathers it again for the weight
    gradient. Same volume as tensor parallelism's all-reduces (an all-reduce = a reduce-scatter
    plus an all-gather), activations 1/tp."""
    kind, out = layer.type, out_bytes[layer.name]
    name = layer.name
    scatter_out = (Collective("reduce_scatter", out, f"SP g: reduce-scatter output of {name}"),)
    gather_grad = (Collective("allgather", out, f"SP g: gather output gradient of {name}"),)
    if kind in _SPLITTABLE and not (kind == "conv2d" and layer.attrs["groups"] != 1) and ins[0]:
        return TPLayer("row", True, True, True, after_fwd=scatter_out, before_bwd=gather_grad, seq_out=True)
    if kind == "embedding":
        return TPLayer("vocab", False, True, True, after_fwd=scatter_out, before_bwd=gather_grad, seq_out=True)
    if not any(seq_ins) or not all(s or not n for s, n in zip(seq_ins, grad_needed)):
        return None
    src = layer.inputs[0]
    gather_in = (Collective("allgather", out_bytes[src], f"SP f: gather input of {name}"),)
    regather = (Collective("allgather", out_bytes[src], f"SP f: gather input of {name} again for its weight gradient",
                           overlap="dgrad"),)
    scatter_grad = (Collective("reduce_scatter", out_bytes[src], f"SP f: reduce-scatter input gradient of {name}",
                               overlap="wgrad"),)
    if kind in _SPLITTABLE and not (kind == "conv2d" and layer.attrs["groups"] != 1):
        return TPLayer("column", True, True, True, before=gather_in, before_bwd=regather, after_bwd=scatter_grad)
    if kind in ("attention", "moe", "mla"):  # a mixture of experts splits each expert like an MLP
        return TPLayer("attention", True, True, True, before=gather_in, after_fwd=scatter_out,
                       before_bwd=gather_grad + regather, after_bwd=scatter_grad, seq_out=True)
    if kind in _PER_TOKEN and all(seq_ins):
        return TPLayer("sequence", True, False, True, seq_out=True)
    return None


def _forced_split(layer: Layer, split: str, ins: list[bool], grad_needed: list[bool],
                  out_bytes: dict) -> TPLayer:
    """Dryden et al. SC'19's per-layer choice for a convolution or fully connected layer over the
    group's ranks. filter: the output channels split (its input needed whole: gathered if it arrives
    split; the input gradient's partial sums all-reduced); channel: the input channels split (a
    whole input is sliced for free, its gradient slices all-gathered; the output's partial sums
    all-reduced)."""
    src = layer.inputs[0]
    name = layer.name
    if split == "filter":
        gathers = tuple(Collective("allgather", out_bytes[s], f"gather {s} for {name}")
                        for s, sharded in zip(layer.inputs, ins) if sharded)
        in_grad = tuple(Collective("allreduce", out_bytes[s], f"filter split: input gradient of {name}")
                        for s, need in zip(layer.inputs, grad_needed) if need)
        return TPLayer("column", True, True, True, before=gathers, after_bwd=in_grad)
    out = (Collective("allreduce", out_bytes[name], f"channel split: output of {name}"),)
    grad = (Collective("allgather", out_bytes[src], f"channel split: gather input gradient of {name}"),) \
        if not ins[0] and grad_needed[0] else ()
    return TPLayer("row", True, True, False, after_fwd=out, after_bwd=grad)


def _classify_one(layer: Layer, ins: list[bool], grad_needed: list[bool], out_bytes: dict,
                  tp: int) -> TPLayer:
    out = out_bytes[layer.name]
    gathers = tuple(Collective("allgather", out_bytes[src], f"gather {src} for {layer.name}")
                    for src, s in zip(layer.inputs, ins) if s)
    in_grad = tuple(Collective("allreduce", out_bytes[src], f"f: input gradient of {layer.name}", overlap="wgrad")
                    for src, need in zip(layer.inputs, grad_needed) if need)
    kind = layer.type
    if kind in _SPLITTABLE and not (kind == "conv2d" and layer.attrs["groups"] != 1):
        if not ins[0]:
            return TPLayer("column", True, True, True, after_bwd=in_grad)
        return TPLayer("row", True, True, False,
                       after_fwd=(Collective("allreduce", out, f"g: output of {layer.name}"),))
    if kind in ("attention", "moe", "mla"):  # MLA: heads split, its down projections too (approximation)
        return TPLayer("attention", True, True, False, before=gathers,
                       after_fwd=(Collective("allreduce", out, f"g: output of {layer.name}"),),
                       after_bwd=in_grad)
    if kind == "embedding":
        return TPLayer("vocab", False, True, False,
                       after_fwd=(Collective("allreduce", out, f"vocab-parallel {layer.name}"),))
    if kind == "cross_entropy" and ins[0]:
        reductions = tuple(Collective("allreduce", ("rows", layer.name), f"parallel cross-entropy {layer.name}")  # type: ignore[arg-type]
                           for _ in range(LOSS_REDUCTIONS))
        return TPLayer("parallel_ce", True, False, False, after_fwd=reductions)
    if kind in _KEEPS_SHARDING or (kind == "conv2d" and layer.attrs["groups"] % tp == 0):
        if all(ins):
            return TPLayer("sharded", True, layer.params > 0, True)
        return TPLayer("replicated", False, False, False, before=gathers)
    if kind in ("add", "concat") and all(ins):
        return TPLayer("sharded", True, False, True)
    return TPLayer("replicated", False, False, False, before=gathers)


def _shard_gemm(g: Gemm, tp: int, rows: int) -> Gemm:
    """Split a GEMM `tp` ways: batched GEMMs over heads by count, others along their largest
    dimension that is not the token rows (the output features of a column-parallel layer, the
    reduction of a row-parallel one): FLOPs divide by `tp` either way."""
    if g.count > 1 and g.count % tp == 0:
        return replace(g, count=g.count // tp)
    dims = [g.m, g.n, g.k]
    candidates = [i for i in range(3) if dims[i] != rows] or [0, 1, 2]
    i = max(candidates, key=lambda j: (dims[j], -j))
    dims[i] = max(1, -(-dims[i] // tp))
    return Gemm(dims[0], dims[1], dims[2], g.count)


def _shard_pass(p: PassCost, tp: int, rows: int) -> PassCost:
    return replace(p, flops=p.flops / tp, work=p.work / tp, bytes_read=p.bytes_read / tp,
                   bytes_written=p.bytes_written / tp, gemms=tuple(_shard_gemm(g, tp, rows) for g in p.gemms),
                   parts=tuple((op, name, _shard_pass(part, tp, rows)) for op, name, part in p.parts),
                   flash=p.flash and replace(p.flash, io_elements=p.flash.io_elements / tp))


def shard_cost(layer: Layer, cost: LayerCost, role: TPLayer, tp: int, batch: int) -> LayerCost:
    """The per-device cost of `layer` under `role`: work, bytes and saved state divided by `tp`."""
    if not role.compute_sharded or tp == 1:
        return cost
    rows = _rows(layer, batch)
    conv = cost.conv
    if conv is not None:
        conv = dict(conv)
        if role.role == "row":
            conv["c_in"] = max(1, conv["c_in"] // tp)
        else:
            conv["c_out"] = max(1, conv["c_out"] // tp)
            if role.role == "sharded":
                conv["c_in"] = max(1, conv["c_in"] // tp)
                conv["groups"] = max(1, conv["groups"] // tp)
    return replace(cost, forward=_shard_pass(cost.forward, tp, rows),
                   backward_data=_shard_pass(cost.backward_data, tp, rows),
                   backward_weight=_shard_pass(cost.backward_weight, tp, rows),
                   internal_backward=_shard_pass(cost.internal_backward, tp, rows),
                   input_backward=tuple(_shard_pass(part, tp, rows) for part in cost.input_backward),
                   extra_saved_bytes=cost.extra_saved_bytes / tp, conv=conv)


def attention_core(layer: Layer, cost: LayerCost, batch: int, dtype: str, tp: int) -> tuple[PassCost, float]:
    """The part of an attention forward that selective recomputation re-runs, and the bytes it frees.

    Korthikanti et al. 2022 ("Reducing activation recomputation in large transformer models", §4.2):
    keep the projections' inputs, drop the L×L attention probabilities and their dropout mask, and
    recompute QKᵀ, softmax, dropout and the product with V: the core's batched GEMMs and every
    memory-bound kernel between them (`PassCost.parts`: scaling, mask, softmax, dropout, layout
    copies), each priced as its own kernel. The freed bytes are those
    `dlsim.cost.layers` charges the attention for them: the softmax output, and with attention
    dropout its output and one-byte mask (5·a·s²·b bytes per layer in 16-bit, the paper's Eq. 2
    term). `cost` is the per-device (sharded) cost.
    """
    steps = layer.in_shapes[0][0]
    scores = batch * layer.attrs["heads"] * steps * steps * layer.attrs.get("context_parallel", 1) / tp
    core = tuple(g for g in cost.forward.gemms if g.count > 1)
    proj_flops = sum(g.flops for g in cost.forward.gemms if g.count == 1)
    flops = cost.forward.flops - proj_flops
    share = flops / cost.forward.flops if cost.forward.flops else 0.0
    b = DTYPE_BYTES[dtype]
    freed = scores * (b + (b + MASK_BYTES if layer.attrs["dropout"] else 0))
    return PassCost(flops, flops / 2, cost.forward.depth, cost.forward.bytes_read * share,
                    cost.forward.bytes_written * share, core, "gemm", kernels=len(core) + 1,
                    parts=tuple(p for p in cost.forward.parts if p[0] != "rope"), flash=cost.forward.flash,
                    unfused=cost.forward.unfused), freed
