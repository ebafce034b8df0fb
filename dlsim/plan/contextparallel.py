"""Context parallelism: every sequence split over `cp` ranks, attention run as ring attention.

Liu et al., "Ring Attention with Blockwise Transformers" (2023), as Megatron-LM / Transformer
Engine run it (`--context-parallel-size`, TE's `AttnFuncWithCPAndKVP2P`): each of the cp ranks of
a context-parallel group holds L/cp tokens of every sequence, so every layer but the attention
core works on L/cp tokens (activations and their memory divided by cp). The attention core of the
local queries needs the keys and values of the whole sequence: they travel around the cp ring in
cp steps; at step j a rank computes its queries against the KV block it holds and, at the same
time, sends that block to the next rank and receives the next one (point-to-point, overlapped).

Causal load balancing (Megatron-LM `get_batch_on_this_cp_rank`): the sequence is cut into 2·cp
chunks and rank r holds chunks r and 2·cp − 1 − r, so every rank does the same causal work and
every ring step costs the same: 1/cp of the rank's core (its local queries against all L keys,
counted as full products as `dlsim.cost.layers` does for causal masks). Time of one attention
core, with c = the rank's core time / cp and τ = one KV block's transfer:

    forward   c + (cp − 1)·max(c, τ)         τ: K and V of the rank's L/cp tokens
    backward  c' + (cp − 1)·max(c', τ')      τ': the same K, V block and its gradient dK, dV

(the backward of TE's KV-P2P attention passes the KV block and the accumulated dKV around the
ring). With the device's overlap slowdown σ the max becomes `dlsim.cost.overlap.overlap_cost`.
Gradients are reduced over dp × cp (`Strategy.dp_cp`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

from dlsim.cost.layers import LayerCost, PassCost
from dlsim.errors import SpecError
from dlsim.spec.model import Model
from dlsim.units import DTYPE_BYTES

CP_ATTR = "context_parallel"
"""Attention attribute set by `split_sequence`: the keys span cp times the local sequence."""


@dataclass(frozen=True)
class RingAttention:
    """The ring of one attention layer on one device for one micro-batch: `cp` steps of
    `forward_core` / cp and `backward_core` / cp seconds; `kv_bytes` is one KV block (K and V of
    the rank's tokens, this device's heads), sent cp − 1 times forward; the backward sends the
    block and its gradient (2·kv_bytes) cp − 1 times."""

    cp: int
    forward_core: float
    backward_core: float
    kv_bytes: float


def split_sequence(model: Model, cp: int) -> Model:
    """The model as one context-parallel rank runs it: the sequence dimension (the first of every
    shape of a token model) divided by cp, attention layers marked to attend over cp times their
    local length. Megatron-LM needs the sequence divisible by 2·cp (load-balanced chunks)."""
    if cp == 1:
        return model
    if model.input_kind != "tokens":
        raise SpecError(f"context parallelism splits a token sequence; model {model.name!r} takes "
                        f"{model.input_kind} input", field="cp")
    length = model.input_shape[0]
    if length % (2 * cp):
        raise SpecError(f"sequence length {length} is not divisible by 2 x cp = {2 * cp} (load-balanced "
                        f"chunks, remainder {length % (2 * cp)})", field="cp")

    def local(shape: tuple[int, ...], where: str) -> tuple[int, ...]:
        if not shape:  # a scalar (the loss)
            return shape
        if shape[0] != length:
            raise SpecError(f"layer {where!r} has shape {list(shape)} without the sequence ({length}) first; "
                            "context parallelism needs it in every layer", field="cp")
        return (length // cp,) + tuple(shape[1:])

    layers = []
    for layer in model.layers:
        attrs = layer.attrs
        if layer.type == "attention":
            attrs = MappingProxyType({**attrs, CP_ATTR: cp})
        layers.append(replace(layer, attrs=attrs, in_shapes=tuple(local(s, layer.name) for s in layer.in_shapes),
                              out_shape=local(layer.out_shape, layer.name)))
    return replace(model, input_shape=local(model.input_shape, "input"), layers=tuple(layers))


def core_passes(cost: LayerCost) -> tuple[PassCost, PassCost]:
    """(forward, backward) of an attention's core on one device: its batched GEMMs (QKᵀ, PV and
    their gradients) and the memory-bound kernels between them, without the projections and the
    rotary embedding (the part of the work the KV ring splits into steps)."""
    out = []
    for p in (cost.forward, cost.backward_data):
        core = tuple(g for g in p.gemms if g.count > 1)
        flops = sum(g.flops for g in p.gemms if g.count > 1) + max(
            p.flops - sum(g.flops for g in p.gemms), 0.0)
        share = flops / p.flops if p.flops else 0.0
        parts = tuple(x for x in p.parts if x[0] != "rope")
        out.append(PassCost(flops, flops / 2, p.depth, p.bytes_read * share, p.bytes_written * share, core,
                            "gemm", kernels=len(core) + len(parts), parts=parts, flash=p.flash, unfused=p.unfused))
    return out[0], out[1]


def kv_block_bytes(layer_attrs, local_tokens: int, width: int, batch: int, dtype: str, tp: int) -> float:
    """Bytes of one KV block: K and V of `local_tokens` tokens for `batch` samples, kv_heads of
    width d_h split over `tp` ranks (`width` = the model width D)."""
    heads = layer_attrs["heads"]
    kv = (width // heads) * (layer_attrs.get("kv_heads") or heads)
    return 2.0 * batch * local_tokens * kv * DTYPE_BYTES[dtype] / tp


def ring_time(core: float, transfer: float, cp: int, slowdown: float = 0.0) -> float:
    """Closed form of one ring pass (see the module docstring): `core` seconds of the rank's whole
    core in cp equal steps, each but the last beside one `transfer`."""
    from dlsim.cost.overlap import overlap_cost
    step = core / cp
    extra, exposed = overlap_cost(step, transfer, slowdown)
    return step + (cp - 1) * (step + extra + exposed)


def add_rings(entries, model: Model, device, dtype: str, cp: int, tables=None,
              fused: frozenset[str] = frozenset()) -> tuple:
    """`entries` (`dlsim.plan.layertable.LayerEntry`, of the `split_sequence` model) with the
    `ring` of every attention layer set: its core priced forward and backward as the layer table
    prices passes (measured tables first, roofline otherwise) and its KV block's bytes."""
    from dlsim.cost.layers import layer_cost
    from dlsim.cost.pricing import price_pass
    from dlsim.plan.tensorparallel import shard_cost
    if cp == 1:
        return tuple(entries)
    out = []
    cache: dict[tuple, RingAttention] = {}
    for e in entries:
        layer = model.layers[e.index]
        if layer.type != "attention" or e.forward.seconds <= 0:
            out.append(e)
            continue
        tp = e.tp_degree if e.tp.compute_sharded else 1
        key = (tuple(sorted((k, repr(v)) for k, v in layer.attrs.items())), layer.in_shapes, e.batch, tp)
        ring = cache.get(key)
        if ring is None:
            cost = shard_cost(layer, layer_cost(layer, e.batch, dtype, fused), e.tp, e.tp_degree, e.batch)
            fwd, bwd = core_passes(cost)
            tokens, width = layer.in_shapes[0][0], layer.in_shapes[0][-1]
            ring = cache[key] = RingAttention(
                cp, min(price_pass(fwd, "attention", "forward", device, dtype, tables).seconds, e.forward.seconds),
                min(price_pass(bwd, "attention", "backward_data", device, dtype, tables).seconds,
                    e.backward_data.seconds),
                kv_block_bytes(layer.attrs, tokens, width, e.batch, dtype, tp))
        out.append(replace(e, ring=ring))
    return tuple(out)
