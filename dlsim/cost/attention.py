"""Attention's cost per pass: multi-head (and grouped-query) attention unfused or as flash
attention, multi-head latent attention (DeepSeek), scaled-dot-product attention as PyTorch runs it.
Conventions as in `dlsim.cost.layers`.
"""

from __future__ import annotations

import math
from dataclasses import replace

from dlsim.cost.eager import rmsnorm_chain, rope_chain
from dlsim.cost.layercost import (MASK_BYTES, NO_PASS, FlashKernel, Gemm, LayerCost, PassCost, UnfusedCore, elementwise,
                                  without_gemms)
from dlsim.cost.workdepth import clog2
from dlsim.spec.model import Layer
from dlsim.spec.strategy_values import flash_kernel


def flash_passes(kernel: str | None, causal: bool, steps: int, keys: int, cp: int, q_width: float,
                 k_width: float, v_width: float, head_dim: int) -> tuple[FlashKernel | None, FlashKernel | None]:
    """The (forward, backward) `FlashKernel`s of a flash attention core (None without `kernel`):
    per call `steps` queries of width `q_width` (elements per query, all heads of this device) against
    `keys` keys of widths `k_width`, `v_width`, heads `head_dim` wide. Forward reads Q, K, V and writes
    the output; backward reads Q, K, V, the output and its gradient and writes ∇Q, ∇K, ∇V (Dao 2023,
    Algorithms 1 and 2)."""
    if kernel is None:
        return None, None
    q, kv = steps * q_width, keys * (k_width + v_width)
    length = keys // cp
    return (FlashKernel(kernel, "forward", causal, length, 2 * q + kv, cp, head_dim),
            FlashKernel(kernel, "backward", causal, length, 3 * q + kv + q + kv, cp, head_dim))


def attention_cost(layer: Layer, n: int, b: int, fused: frozenset[str] = frozenset()) -> LayerCost:
    """Multi-head self-attention, R = N·L rows, h heads of width d_h = D/h, KV width D_kv = kv_heads·d_h:
    Q/K/V projections GEMM (R, D + 2·D_kv, D); scores QKᵀ batched GEMM (L, L, d_h)×N·h; softmax over
    N·h·L² scores (5 FLOP/element); context AV (L, d_h, L)×N·h; output projection (R, D, D).
    ∇x: projections' transposes plus four batched GEMMs (∇P = ∇O·Vᵀ, ∇V = Pᵀ·∇O, ∇Q = ∇S·K, ∇K = ∇Sᵀ·Q);
    ∇w: (D + 2·D_kv, D, R) and (D, D, R). Causal masking is counted as full products, as PyTorch's
    counter does. The memory-bound kernels between the GEMMs are `_attention_parts`. Under context
    parallelism (attribute `context_parallel` = cp, set by `dlsim.plan.contextparallel`) L is the
    rank's share of the sequence and the scores span its L queries and all cp·L keys.

    Kept for the backward pass (Korthikanti et al. 2022, §4.1, per layer 11·sbh + 5·a·s²·b bytes in
    16-bit with the layer norm's output counted at its producer): the input x, Q, K, V and the
    context (each L×D per sample), the softmax output (2 bytes per score in 16-bit), and with
    attention dropout its 1-byte mask and its output (the probabilities PV reads). With
    `flash_attention` (Dao et al. 2022) no score is kept: Q, K, V, the output and one fp32
    log-sum-exp per row and head; its backward recomputes QKᵀ (one more batched GEMM), and each
    pass's core is priced as one flash kernel (`FlashKernel`, `dlsim.cost.flash`); `cudnn_attention`
    is the same algorithm as cuDNN runs it.
    """
    a, (steps, d) = layer.attrs, layer.in_shapes[0]
    heads = a["heads"]
    dh = d // heads
    kv = dh * (a["kv_heads"] or heads)
    rows, bh = n * steps, n * heads
    keys = steps * a.get("context_parallel", 1)  # context parallelism: local queries, all keys
    scores = bh * steps * keys
    w_bytes = layer.params * b
    qkv = d + 2 * kv
    kernel = flash_kernel(fused)
    flash = kernel is not None
    core_fwd = (Gemm(steps, keys, dh, bh), Gemm(steps, dh, keys, bh))
    core_bwd = (Gemm(steps, keys, dh, bh),) * (5 if flash else 4)
    fwd_g = (Gemm(rows, qkv, d),) + core_fwd + (Gemm(rows, d, d),)
    bx_g = (Gemm(rows, d, d),) + core_bwd + (Gemm(rows, d, qkv),)
    bw_g = (Gemm(d, d, rows), Gemm(qkv, d, rows))
    bias = rows * (qkv + d) if a["bias"] else 0
    act = rows * (d + qkv + d) * b  # x, Q/K/V, context
    depth = clog2(d) + clog2(dh) + 2 * clog2(steps) + clog2(steps) + clog2(d)
    def gemm_pass(gemms: tuple[Gemm, ...], extra: float, reads: float, writes: float) -> PassCost:
        flops = sum(g.flops for g in gemms) + extra
        return PassCost(flops, flops / 2, depth, reads, writes, gemms, "gemm", kernels=len(gemms) + 2)
    score_traffic = 0 if flash else scores * b
    fwd = gemm_pass(fwd_g, 5 * scores + bias, rows * d * b + w_bytes + act + 2 * score_traffic, act + 2 * score_traffic)
    bwd_x = gemm_pass(bx_g, 4 * scores, act + w_bytes + 3 * score_traffic, act + 2 * score_traffic)
    fwd_parts, bwd_parts = attention_parts(scores, rows * d, b, bool(a["dropout"]), bool(a.get("causal")), fused)
    if a.get("rotary"):  # rotary embeddings on Q and K (Su et al. 2021): x·cos + rotate(x)·sin, 3 FLOP/element
        rope = ("rope", "forward", rope_pass(rows * (d + kv), b, fused))
        fwd_parts, bwd_parts = (rope,) + fwd_parts, bwd_parts + (rope,)
    ff, fb = flash_passes(kernel, bool(a.get("causal")), steps, keys, a.get("context_parallel", 1), n * d,
                          n * kv, n * kv, dh)
    core = None if flash else UnfusedCore(keys, dh)
    fwd = replace(fwd, parts=fwd_parts, flash=ff, unfused=core)
    bwd_x = replace(bwd_x, parts=bwd_parts, flash=fb, unfused=core)
    bwd_w = gemm_pass(bw_g, bias, 2 * act, w_bytes)
    if flash:
        kept_scores = bh * steps * 4  # fp32 log-sum-exp per row and head
    else:
        kept_scores = scores * b + (scores * (b + MASK_BYTES) if a["dropout"] else 0)
    return LayerCost(fwd, bwd_x, bwd_w, saves_input=True, extra_saved_bytes=act - rows * d * b + kept_scores,
                     internal_backward=without_gemms(bwd_x, (Gemm(rows, d, qkv),), act - rows * d * b))


def mla_cost(layer: Layer, n: int, b: int, fused: frozenset[str] = frozenset()) -> LayerCost:
    """Multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", §2.1.2-2.1.3; DeepSeek-V3 §2.1.1),
    R = N·L rows, H heads, score width d_qk = nope + rope, value width d_v, latent widths c_q, c_kv:
    Q down (R, c_q, D) and RMSNorm, Q up (R, H·d_qk, c_q) (one (R, H·d_qk, D) without Q compression);
    KV down (R, c_kv + rope, D) and RMSNorm of the c_kv part, KV up (R, H·(nope + d_v), c_kv); rotary
    embeddings on the R·H·rope query and the R·rope shared key elements (3 FLOP/element); scores
    QKᵀ (L, L, d_qk)×N·H, softmax, context (L, d_v, L)×N·H, output (R, D, H·d_v). Training runs the
    projections unabsorbed (the report's §2.1.2 absorption is an inference optimisation). ∇x and ∇w
    as `_attention` (four core GEMMs backward, five with `flash_attention`, which keeps no scores).
    Kept: x, the two latents, Q, K, V, the context and the softmax output (or one fp32 log-sum-exp
    per row and head with flash attention)."""
    a, (steps, d) = layer.attrs, layer.in_shapes[0]
    h, cq, ckv = a["heads"], a["q_lora"], a["kv_lora"]
    rope, dqk, dv = a["qk_rope_dim"], a["qk_nope_dim"] + a["qk_rope_dim"], a["v_head_dim"]
    rows, bh = n * steps, n * h
    scores = bh * steps * steps
    kernel = flash_kernel(fused)
    flash = kernel is not None
    proj = ([(cq, d), (h * dqk, cq)] if cq else [(h * dqk, d)]) + [(ckv + rope, d), (h * (a["qk_nope_dim"] + dv), ckv)]
    fwd_g = tuple(Gemm(rows, o, i) for o, i in proj) + (Gemm(steps, steps, dqk, bh), Gemm(steps, dv, steps, bh),
                                                          Gemm(rows, d, h * dv))
    bx_g = (Gemm(rows, h * dv, d),) + (Gemm(steps, steps, dqk, bh),) * (5 if flash else 4) + \
        tuple(Gemm(rows, i, o) for o, i in reversed(proj))
    bw_g = (Gemm(d, h * dv, rows),) + tuple(Gemm(o, i, rows) for o, i in reversed(proj))
    norms = rows * (cq + ckv)
    rope_el = rows * (h + 1) * rope
    w_bytes = layer.params * b
    act = rows * (d + cq + ckv + rope + h * (dqk + dqk + dv) + h * dv) * b  # x, latents, Q, K, V, context
    score_traffic = 0 if flash else scores * b
    fwd_parts, bwd_parts = attention_parts(scores, rows * h * dv, b, False, bool(a["causal"]), fused)
    if "rmsnorm" in fused:
        norm_f, norm_b = elementwise(norms, b, 4, reads=2), elementwise(norms, b, 8, reads=4)
    else:  # the eager chain over the two latents' rows
        norm_f, norm_b, _ = rmsnorm_chain(norms, 2 * rows, b, 4 * norms, 8 * norms)
    extra_f = [("rmsnorm", "forward", norm_f), ("rope", "forward", rope_pass(rope_el, b, fused))]
    extra_b = [("rope", "forward", rope_pass(rope_el, b, fused)), ("rmsnorm", "backward_data", norm_b)]
    fwd_parts, bwd_parts = tuple(extra_f) + fwd_parts, bwd_parts + tuple(extra_b)
    depth = clog2(d) + clog2(dqk) + 3 * clog2(steps) + clog2(h * dv)
    def gemm_pass(gemms: tuple[Gemm, ...], parts, reads: float, writes: float) -> PassCost:
        flops = sum(g.flops for g in gemms) + sum(p[2].flops for p in parts)
        return PassCost(flops, flops / 2, depth, reads, writes, gemms, "gemm", kernels=len(gemms) + len(parts),
                        parts=tuple(parts))
    fwd = gemm_pass(fwd_g, fwd_parts, rows * d * b + w_bytes + act + 2 * score_traffic, act + 2 * score_traffic)
    bwd_x = gemm_pass(bx_g, bwd_parts, act + w_bytes + 3 * score_traffic, act + 2 * score_traffic)
    ff, fb = flash_passes(kernel, bool(a["causal"]), steps, steps, 1, n * h * dqk, n * h * dqk, n * h * dv, dqk)
    fwd, bwd_x = replace(fwd, flash=ff), replace(bwd_x, flash=fb)
    bwd_w = gemm_pass(bw_g, (), 2 * act, w_bytes)
    kept_scores = bh * steps * 4 if flash else scores * b
    reads_x = tuple(Gemm(rows, i, o) for o, i in (proj[0], proj[-2]))  # ∇x of the Q and KV down-projections
    return LayerCost(fwd, bwd_x, bwd_w, saves_input=True, extra_saved_bytes=act - rows * d * b + kept_scores,
                     internal_backward=without_gemms(bwd_x, reads_x, act - rows * d * b))


def rope_pass(elements: int, b: int, fused: frozenset[str]) -> PassCost:
    """Rotary embeddings over `elements` of Q and K, one pass (forward and backward alike): one
    element-wise kernel reading and writing each element once with the ``rope`` fusion, else the
    eager chain of `dlsim.cost.eager.rope_chain`."""
    return elementwise(elements, b, 3) if "rope" in fused else rope_chain(elements, b)


def attention_parts(scores: int, rows_by_width: int, b: int, dropout: bool, causal: bool,
                     fused: frozenset[str] = frozenset()) -> tuple[tuple[tuple[str, str, PassCost], ...],
                                                                   tuple[tuple[str, str, PassCost], ...]]:
    """The memory-bound kernels an attention runs between its GEMMs, forward and backward, each as
    (op whose measured curve prices it, pass, cost). Unfused (PyTorch's math path:
    ``softmax(QKᵀ · d_h^-1/2 [masked]) [dropout] · V``), over the S = N·h·L² scores: the scaling
    (one read, one write; priced like relu forward), the causal mask's fill (same), softmax,
    dropout; over the N·L·D activations four layout copies (Q, Kᵀ and V made contiguous for the
    batched GEMMs, the context moved back), each a read and a write. The backward runs the
    gradient of each. `scale_mask_softmax` makes scaling, mask and softmax one kernel each way;
    `strided_attention` leaves only the context's copy; a flash kernel (`flash_attention`,
    `cudnn_attention`) keeps only the context's copy (the core is one kernel, `FlashKernel`). The FLOPs of scaling, softmax
    and dropout are already in the pass's element-wise remainder, so the parts replace it when
    priced."""
    unary = elementwise(scores, b, 1)
    copy = elementwise(rows_by_width, b, 0)
    flash = flash_kernel(fused) is not None
    copies = 1 if flash or "strided_attention" in fused else 4
    fwd: list[tuple[str, str, PassCost]] = []
    bwd: list[tuple[str, str, PassCost]] = []
    if not flash:
        if "scale_mask_softmax" in fused:
            fwd.append(("softmax", "forward", elementwise(scores, b, 6 + causal)))
            bwd.append(("softmax", "backward_data", elementwise(scores, b, 5, reads=2)))
        else:
            for _ in range(1 + causal):
                fwd.append(("relu", "forward", unary))
                bwd.append(("relu", "forward", unary))
            fwd.append(("softmax", "forward", elementwise(scores, b, 5)))
            bwd.append(("softmax", "backward_data", elementwise(scores, b, 4, reads=2)))
        if dropout:
            fwd.append(("dropout", "forward", PassCost(2 * scores, 2 * scores, 1, scores * b,
                                                       scores * (b + MASK_BYTES))))
            bwd.append(("dropout", "backward_data", PassCost(scores, scores, 1, scores * (b + MASK_BYTES), scores * b)))
    fwd += [("relu", "forward", copy)] * copies
    bwd += [("relu", "forward", copy)] * copies
    return tuple(fwd), tuple(bwd)




def sdpa_cost(layer: Layer, n: int, b: int) -> LayerCost:
    """Scaled dot-product attention softmax(Q·Kᵀ/√d)·V without projections, Q (..., L, d), K (..., S, d),
    V (..., S, d_v), batched over the leading dimensions and the samples: forward QKᵀ (L, S, d) and
    P·V (L, d_v, S); ≈ 5 FLOP per score for scaling and softmax. Backward the five products of PyTorch's
    FLOP counter (torch.utils.flop_counter.sdpa_backward_flop_count, torch 2.13): the scores recomputed
    Q·Kᵀ (L, S, d) as the fused kernels do (Dao et al. 2022, Algorithm 4), ∇P = ∇O·Vᵀ (L, S, d_v),
    ∇V = Pᵀ·∇O (S, d_v, L), ∇Q = ∇S·K (L, d, S), ∇K = ∇Sᵀ·Q (S, d, L); ≈ 4 FLOP per score. Causal masking
    is counted as full products, as the counter does. Without dropout PyTorch runs a fused kernel (flash
    attention on CPU and GPU) that keeps no score: Q, K, V, the output and one fp32 log-sum-exp per row.
    With dropout its CPU dispatch falls back to the unfused math path (the CPU flash kernel has none),
    whose backward reads the kept probabilities and their dropout mask instead of recomputing Q·Kᵀ:
    four products (the counter counts the math path's four batched matmuls)."""
    q, k, v = layer.in_shapes
    steps, d, s, dv = q[-2], q[-1], k[-2], v[-1]
    count = n * math.prod(layer.out_shape[:-2])
    scores = count * steps * s
    io = n * (math.prod(q) + math.prod(k) + math.prod(v)) * b
    out = n * layer.out_elements * b
    fwd_g = (Gemm(steps, s, d, count), Gemm(steps, dv, s, count))
    math_path = bool(layer.attrs["dropout"])
    bwd_g = (Gemm(steps, s, d, count),) * (not math_path) + (
        Gemm(steps, s, dv, count), Gemm(s, dv, steps, count), Gemm(steps, d, s, count), Gemm(s, d, steps, count))
    depth = clog2(d) + 2 * clog2(s) + clog2(s)
    fwd = PassCost(sum(g.flops for g in fwd_g) + 5 * scores, sum(g.flops for g in fwd_g) / 2 + 5 * scores, depth,
                   io, out + count * steps * 4, fwd_g, "gemm", kernels=1)
    bwd = PassCost(sum(g.flops for g in bwd_g) + 4 * scores, sum(g.flops for g in bwd_g) / 2 + 4 * scores, depth,
                   io + 2 * out, io, bwd_g, "gemm", kernels=1)
    kept = scores * (b + MASK_BYTES) if math_path else count * steps * 4
    return LayerCost(fwd, bwd, NO_PASS, saves_input=True, saves_output=True, extra_saved_bytes=kept)


