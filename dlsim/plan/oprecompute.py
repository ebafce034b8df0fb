"""torchtitan's activation-checkpointing policies (strategy key `recompute`): ``selective_layer`` and
``selective_op``, read at pytorch/torchtitan@157a12c torchtitan/parallelisms/parallelize_llama.py
``checkpoint_wrapper`` (the same policies at 7310abe).

* selective_layer (``selective_ac_option`` an integer n, config default "2": torchtitan/config_manager.py):
  a module counter increments per TransformerBlock and every block with ``count % n == 0`` is
  wrapped in full activation checkpointing; the others keep all their activations. dlsim runs
  torchtitan's default n = 2: the second, fourth, ... block of the model (`alternate_layers`)
  recomputed as under full recomputation (`dlsim.plan.recompute.full_recompute_memory`, one block a
  group), the others not at all.
* selective_op (``selective_ac_option = 'op'``): every block is checkpointed with a selective policy
  (torch.utils.checkpoint ``_pt2_selective_checkpoint_context_fn_gen``) that saves the outputs of
  ``aten.mm`` except every second one, of the flash and memory-efficient SDPA kernels and of
  ``reduce_scatter_tensor``; every other operator is recomputed before the block's backward. The mm
  counter restarts for each block and each mode (forward, recomputation), so the same mms are saved
  in both. In a Llama block the mms run wq, wk, wv, wo, w1, w3, w2 (torchtitan/models/llama/model.py
  Attention.forward, FeedForward.forward ``w2(silu(w1(x)) * w3(x))``): wq, wv, w1 and w2 are saved, wk,
  wo and w3 recomputed; with the SDPA output (and its fp32 log-sum-exp) kept, the recomputation
  runs the two norms, the wk, wo and w3 GEMMs, rotary embeddings, the context's layout copy, the
  gated unit and the residual adds (`op_checkpoint`). What stays from each block's forward: its
  input and the saved outputs (`op_recompute_memory`).

dlsim's blocks name their mms in the same order: an attention layer runs four (Q, K, V, output
projections), a linear layer one, two when a gated linear unit consumes it (the gate and up
projections, w1 and w3, one GEMM of twice the width here).
"""

from __future__ import annotations

from dlsim.cost.layercost import Gemm, LayerCost
from dlsim.cost.pricing import KernelTimes, gemm_seconds, price_pass
from dlsim.plan.blocks import recompute_layers
from dlsim.results import Estimate, Source
from dlsim.spec.cluster import Device
from dlsim.spec.memo import derived
from dlsim.spec.model import Layer, Model
from dlsim.units import DTYPE_BYTES

ZERO = Estimate(0.0, Source.MODEL, "nothing recomputed")
EVERY = 2
"""torchtitan's selective layer frequency: its ``--activation_checkpoint.selective_ac_option`` default
"2" (torchtitan@157a12c torchtitan/config_manager.py, "2 = checkpoint every other layer")."""


def alternate_layers(model: Model) -> dict[str, str | None]:
    """`dlsim.plan.blocks.recompute_layers` with only every `EVERY`-th repeated-block instance kept
    (torchtitan's count % n == 0, counting from 1); the others None: their layers keep their
    activations (once per model)."""
    def make() -> dict[str, str | None]:
        instance = recompute_layers(model)
        order: list[str] = []
        for name in instance:
            inst = instance[name]
            if inst is not None and inst not in order:
                order.append(inst)
        chosen = {inst for i, inst in enumerate(order, start=1) if i % EVERY == 0}
        return {name: (inst if inst in chosen else None) for name, inst in instance.items()}
    return derived(model, "alternate_layers", make)


def mm_positions(model: Model) -> dict[str, tuple[int, int]]:
    """Per layer inside a repeated block that runs mms, (the count of its first mm in the block,
    1-based; how many it runs): an attention four (Q, K, V and output projections), a linear layer
    one, two when a gated linear unit consumes it (once per model)."""
    def make() -> dict[str, tuple[int, int]]:
        instance = recompute_layers(model)
        glu_inputs = {src for layer in model.layers if layer.type in ("swiglu", "geglu") for src in layer.inputs}
        out: dict[str, tuple[int, int]] = {}
        count, current = 0, None
        for layer in model.layers:
            inst = instance[layer.name]
            if inst is None:
                continue
            if inst != current:
                count, current = 0, inst
            mms = 4 if layer.type == "attention" else (2 if layer.name in glu_inputs else 1) if layer.type == "linear" else 0
            if mms:
                out[layer.name] = (count + 1, mms)
                count += mms
        return out
    return derived(model, "mm_positions", make)


def _saved(count: int) -> bool:
    """torchtitan's policy: an mm's output is saved unless it is the second, fourth, ... of its block."""
    return count % 2 == 1


def op_checkpoint(layer: Layer, cost: LayerCost, mms: tuple[int, int] | None, flash: bool, forward: Estimate,
                  out_bytes: float, dtype: str, device: Device, tables: KernelTimes | None) -> tuple[Estimate, float]:
    """(the seconds selective_op recomputes of this layer's forward, the bytes it keeps) for a layer
    inside a block, `cost` its per-device cost, `forward` its priced forward pass, `out_bytes` its
    output on this device, `mms` its first mm's count in the block and how many it runs
    (`mm_positions`; None: it runs none)."""
    b = DTYPE_BYTES[dtype]
    first_mm, count = mms if mms is not None else (None, 0)
    if layer.type == "attention" and first_mm is not None:
        gemms = cost.forward.gemms
        qkv, out_proj = gemms[0], gemms[-1]
        a = layer.attrs
        heads, kv_heads = a["heads"], a["kv_heads"] or a["heads"]
        q_w = qkv.n * heads // (heads + 2 * kv_heads)
        kv_w = (qkv.n - q_w) // 2
        projections = [(first_mm, Gemm(qkv.m, q_w, qkv.k)), (first_mm + 1, Gemm(qkv.m, kv_w, qkv.k)),
                       (first_mm + 2, Gemm(qkv.m, kv_w, qkv.k)), (first_mm + 3, out_proj)]
        seconds = sum(gemm_seconds(g, device, dtype, tables) for k, g in projections if not _saved(k))
        kept = sum(g.m * g.n * b for k, g in projections[:3] if _saved(k))
        if flash:  # the SDPA kernel's output and its fp32 log-sum-exp per row and head are saved
            local_heads = q_w // max(qkv.k // heads, 1)
            kept += qkv.m * q_w * b + qkv.m * local_heads * 4
        else:  # no SDPA kernel: the core's batched GEMMs are recomputed with the rest
            seconds += sum(gemm_seconds(g, device, dtype, tables) for g in gemms if g.count > 1)
        seconds += sum(price_pass(p, op, name, device, dtype, tables).seconds for op, name, p in cost.forward.parts)
        return Estimate(seconds, forward.source, "selective_op: the recomputed projections and element-wise kernels"), kept
    if layer.type == "linear" and first_mm is not None:
        if count == 2:  # w1 and w3 as one GEMM: one half saved, the other recomputed
            (g,) = cost.forward.gemms
            half = Gemm(g.m, g.n // 2, g.k, g.count)
            return Estimate(gemm_seconds(half, device, dtype, tables), forward.source,
                            "selective_op: the recomputed half of the gate and up projections"), out_bytes / 2
        if _saved(first_mm):
            return ZERO, out_bytes
        return forward, 0.0
    return forward, 0.0
