"""Per-operator cost of one training step: forward y, backward-data ∇x and backward-weights ∇w.

For each pass: FLOPs (a multiply-accumulate = 2), work W and depth D in the survey's sense
(Ben-Nun & Hoefler 2018, Table 4; `dlsim.cost.workdepth`), bytes read and written by an
unfused kernel, and the GEMM calls the pass maps onto (so measured GEMM tables can price it).
Also what the layer keeps alive for the backward pass (activation memory).

Element-wise FLOP counts per element are conventions (documented per operator); these operators
are memory-bound on every device dlsim models, so their time comes from the bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

from dlsim.cost.moe_routing import routing
from dlsim.cost.workdepth import clog2, conv_direct_depth
from dlsim.spec.model import Layer
from dlsim.spec.ops import broadcast, conv_geometry, recurrent_gates, transposed_geometry
from dlsim.units import DTYPE_BYTES

MASK_BYTES = 1   # a dropout keep-mask element (bool)
INDEX_BYTES = 8  # an int64 token id


@dataclass(frozen=True)
class Gemm:
    """C[m×n] = A[m×k]·B[k×n], `count` independent times (a batched GEMM)."""

    m: int
    n: int
    k: int
    count: int = 1

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class PassCost:
    """Cost of one pass of one layer for a whole (micro-)batch.

    `kind` is "gemm" (priced by its GEMMs), "conv" (a convolution; `gemms` is its im2col form)
    or "memory" (element-wise / reduction work, bandwidth-bound). `kernels` is the number of
    kernel launches the pass needs. `parts` lists the memory-bound kernels a "gemm" pass runs
    between its GEMMs, as (op type priced like, pass of that op, its cost): measured tables price
    each from that op's curve (an unfused attention's scaling, softmax, dropout and layout copies).
    """

    flops: float = 0.0
    work: float = 0.0
    depth: int = 0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    gemms: tuple[Gemm, ...] = ()
    kind: str = "memory"
    kernels: int = 1
    parts: tuple[tuple[str, str, "PassCost"], ...] = ()

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written

    @property
    def matmul_flops(self) -> float:
        return float(sum(g.flops for g in self.gemms))


NO_PASS = PassCost(kernels=0)


@dataclass(frozen=True)
class LayerCost:
    """Forward, ∇x and ∇w costs of a layer, and what it keeps for the backward pass."""

    forward: PassCost
    backward_data: PassCost
    backward_weight: PassCost
    saves_input: bool = False
    saves_output: bool = False
    extra_saved_bytes: float = 0.0
    conv: dict | None = field(default=None)
    internal_backward: PassCost = NO_PASS
    """The part of the ∇x pass that still runs when no input needs a gradient: in a composite layer the
    gradients its own weights need (through time and between stacked layers of a recurrent layer, into
    an attention's Q, K and V), all but the products giving the input's gradient."""
    input_backward: tuple[PassCost, ...] = ()
    """For a layer of several activation inputs whose ∇x is one product per input (∇A and ∇B of a
    matrix product), each input's part of the ∇x pass, in input order."""

    @property
    def matmul_flops(self) -> float:
        """Forward FLOPs of matrix-multiply-class work (conv, linear, attention products), as
        PyTorch's FlopCounterMode counts them."""
        return self.forward.matmul_flops

    @property
    def flops(self) -> float:
        return self.forward.flops + self.backward_data.flops + self.backward_weight.flops


def _without_gemms(cost: PassCost, drop: tuple[Gemm, ...], bytes_written: float) -> PassCost:
    """`cost` less the GEMMs `drop` (one occurrence each, with their FLOPs and launches), writing
    `bytes_written` instead."""
    gemms = list(cost.gemms)
    for g in drop:
        gemms.remove(g)
    flops = sum(g.flops for g in drop)
    return replace(cost, flops=cost.flops - flops, work=cost.work - flops / 2, gemms=tuple(gemms),
                   kernels=cost.kernels - len(drop), bytes_written=bytes_written)


def _elementwise(elements: float, b: int, flops_per: float, reads: int = 1, writes: int = 1,
                 depth: int = 1) -> PassCost:
    return PassCost(flops=flops_per * elements, work=flops_per * elements, depth=depth,
                    bytes_read=reads * elements * b, bytes_written=writes * elements * b)


def _conv2d(layer: Layer, n: int, b: int) -> LayerCost:
    """Convolution as im2col GEMMs (S002 Appendix B.2): forward (M, N, K) = (C_out/g, N·H'·W', C_in/g·K_y·K_x),
    ∇x (C_in/g·K_y·K_x, N·H'·W', C_out/g) then col2im, ∇w (C_out/g, C_in/g·K_y·K_x, N·H'·W'); g groups.
    Work per pass = N·C_out·H'·W'·(C_in/g)·K_y·K_x MACs for all three (the exact count; Table 4 writes
    ∇x with H·W, the same for stride 1); depth per Table 4/6: ⌈log2 C_in⌉ + ⌈log2 K_y⌉ + ⌈log2 K_x⌉.
    """
    a, (cin, h, w) = layer.attrs, layer.in_shapes[0]
    g = conv_geometry(dict(a), layer.in_shapes[0])
    groups, cout = a["groups"], a["out_channels"]
    cin_g, cout_g = cin // groups, cout // groups
    kk = g["kh"] * g["kw"]
    pixels = n * g["ho"] * g["wo"]
    macs = pixels * cout * cin_g * kk
    x_bytes, y_bytes, w_bytes = n * cin * h * w * b, pixels * cout * b, layer.params * b
    bias = pixels * cout if a["bias"] else 0
    depth = conv_direct_depth(cin_g, g["kh"], g["kw"])
    geometry = {"n": n, "c_in": cin, "h": h, "w": w, "c_out": cout, "k_h": g["kh"], "k_w": g["kw"],
                "stride": (g["sh"], g["sw"]), "padding": (g["ph"], g["pw"]), "dilation": (g["dh"], g["dw"]),
                "groups": groups, "h_out": g["ho"], "w_out": g["wo"]}
    if a.get("memory_format") == "channels_last":
        geometry["channels_last"] = True
    fwd = PassCost(2 * macs + bias, macs, depth, x_bytes + w_bytes, y_bytes,
                   (Gemm(cout_g, pixels, cin_g * kk, groups),), "conv")
    bwd_x = PassCost(2 * macs, macs, depth, y_bytes + w_bytes, x_bytes,
                     (Gemm(cin_g * kk, pixels, cout_g, groups),), "conv")
    bwd_w = PassCost(2 * macs + bias, macs, depth, y_bytes + x_bytes, w_bytes,
                     (Gemm(cout_g, cin_g * kk, pixels, groups),), "conv")
    return LayerCost(fwd, bwd_x, bwd_w, saves_input=True, conv=geometry)


def _linear(layer: Layer, n: int, b: int) -> LayerCost:
    """Fully connected layer over the last dimension (S002 Table 4, Appendix A.3) with R = N·(leading dims)
    rows: forward GEMM (R, C_out, C_in), ∇x (R, C_in, C_out), ∇w (C_out, C_in, R); depths ⌈log2 C_in⌉,
    ⌈log2 C_out⌉, ⌈log2 R⌉."""
    fin, fout = layer.in_shapes[0][-1], layer.attrs["out_features"]
    rows = n * math.prod(layer.in_shapes[0][:-1])
    macs = rows * fin * fout
    bias = rows * fout if layer.attrs["bias"] else 0
    x_bytes, y_bytes, w_bytes = rows * fin * b, rows * fout * b, fin * fout * b
    fwd = PassCost(2 * macs + bias, macs, clog2(fin), x_bytes + w_bytes, y_bytes, (Gemm(rows, fout, fin),), "gemm")
    bwd_x = PassCost(2 * macs, macs, clog2(fout), y_bytes + w_bytes, x_bytes, (Gemm(rows, fin, fout),), "gemm")
    bwd_w = PassCost(2 * macs + bias, macs, clog2(rows), y_bytes + x_bytes, w_bytes, (Gemm(fout, fin, rows),), "gemm")
    return LayerCost(fwd, bwd_x, bwd_w, saves_input=True)


def _pool(layer: Layer, n: int, b: int) -> LayerCost:
    """Max/average pooling (S002 Table 4): forward one comparison/add per window element of every output,
    depth ⌈log2 K_y⌉ + ⌈log2 K_x⌉; ∇x touches every input element once, depth 1."""
    g = conv_geometry(dict(layer.attrs), layer.in_shapes[0])
    ins, outs = n * layer.in_elements, n * layer.out_elements
    work = outs * g["kh"] * g["kw"]
    fwd = PassCost(work, work, clog2(g["kh"]) + clog2(g["kw"]), ins * b, outs * b)
    bwd = PassCost(ins, ins, 1, outs * b + (ins * b if layer.type == "maxpool" else 0), ins * b)
    return LayerCost(fwd, bwd, NO_PASS, saves_input=layer.type == "maxpool", saves_output=layer.type == "maxpool")


def _global_pool(layer: Layer, n: int, b: int) -> LayerCost:
    """Global pooling: a reduction over H·W per channel, depth ⌈log2 HW⌉; ∇x broadcasts back."""
    c, h, w = layer.in_shapes[0]
    ins = n * c * h * w
    fwd = PassCost(ins, ins, clog2(h * w), ins * b, n * c * b)
    bwd = PassCost(ins, ins, 1, n * c * b, ins * b)
    return LayerCost(fwd, bwd, NO_PASS, saves_input=layer.type == "global_maxpool")


def _norm(layer: Layer, n: int, b: int) -> LayerCost:
    """Batch norm (S002 Appendix A.6) over N·H·W per channel, layer norm over the last dimension.

    Forward: mean, variance, normalise, scale and shift ≈ 8 FLOP/element, reads x twice (statistics,
    then normalisation), writes y; depth ⌈log2(reduced elements)⌉ (Table 4: O(log N) for batch norm).
    Backward: ∇x, ∇γ and ∇β in one fused kernel (as cuDNN and PyTorch do) ≈ 12 FLOP/element, reading
    x and ∇y twice; ∇w is accounted inside ∇x.
    """
    shape = layer.in_shapes[0]
    elems = n * layer.in_elements
    reduced = n * math.prod(shape[1:]) if layer.type == "batchnorm" else shape[-1]
    depth = clog2(reduced)
    fwd = PassCost(8 * elems, 8 * elems, depth, 2 * elems * b, elems * b)
    bwd = PassCost(12 * elems, 12 * elems, depth, 4 * elems * b, elems * b)
    return LayerCost(fwd, bwd, NO_PASS, saves_input=True, extra_saved_bytes=2 * 4 * (elems // reduced or 1))


def _rmsnorm(layer: Layer, n: int, b: int) -> LayerCost:
    """RMS norm over the last dimension (Zhang & Sennrich 2019): mean of squares, rsqrt, normalise and
    scale ≈ 4 FLOP/element forward, ≈ 8 backward; read and write counted as for layer norm (x read
    twice forward; x and ∇y twice backward); depth ⌈log2 D⌉; keeps x and one fp32 scale per row."""
    elems, d = n * layer.in_elements, layer.in_shapes[0][-1]
    depth = clog2(d)
    fwd = PassCost(4 * elems, 4 * elems, depth, 2 * elems * b, elems * b)
    bwd = PassCost(8 * elems, 8 * elems, depth, 4 * elems * b, elems * b)
    return LayerCost(fwd, bwd, NO_PASS, saves_input=True, extra_saved_bytes=4 * (elems // d or 1))


# FLOP per output element, forward / backward: silu(a)·b = a·σ(a)·b (σ ≈ 4, two products);
# gelu(a)·b with gelu's tanh approximation (14) and one product; backward about 1.5x
_GLU_FLOPS = {"swiglu": (6, 10), "geglu": (15, 22)}


def _glu(layer: Layer, n: int, b: int) -> LayerCost:
    """Gated linear unit over the two halves a, b of the last dimension (Shazeer 2020, "GLU variants
    improve transformer"): reads 2F, writes F; the backward reads a, b and ∇y and writes ∇a, ∇b.
    Keeps its input (both halves)."""
    out = n * layer.out_elements
    f, bw = _GLU_FLOPS[layer.type]
    fwd = PassCost(f * out, f * out, 1, 2 * out * b, out * b)
    bwd = PassCost(bw * out, bw * out, 1, 3 * out * b, 2 * out * b)
    return LayerCost(fwd, bwd, NO_PASS, saves_input=True)


def _lrn(layer: Layer, n: int, b: int) -> LayerCost:
    """Local response normalisation across `size` channels: per element a windowed sum of squares
    (2·size FLOP), then scale and power (≈ 4 FLOP); depth ⌈log2 size⌉. Backward ≈ twice the forward."""
    elems, size = n * layer.in_elements, layer.attrs["size"]
    per = 2 * size + 4
    fwd = PassCost(per * elems, per * elems, clog2(size), elems * b, elems * b)
    bwd = PassCost(2 * per * elems, 2 * per * elems, clog2(size), 3 * elems * b, elems * b)
    return LayerCost(fwd, bwd, NO_PASS, saves_input=True, saves_output=True)


# FLOP per element, forward / backward (conventions: relu a compare; sigmoid exp+add+div;
# tanh ~ exp-based; gelu tanh-approximation).
# relu6 two compares each way; silu x·σ(x) = σ (4) + 1 product, backward σ(x)(1 + x(1 - σ(x))) ≈ 6.
_ACTIVATION_FLOPS = {"relu": (1, 1), "sigmoid": (4, 3), "tanh": (5, 3), "gelu": (14, 20), "relu6": (2, 2),
                     "silu": (5, 6)}


def _activation(layer: Layer, n: int, b: int) -> LayerCost:
    """Activation σ(x) (S002 Table 4, Appendix A.2): W = O(NCHW), D = O(1) for y and ∇x; no parameters."""
    elems = n * layer.in_elements
    f, bw = _ACTIVATION_FLOPS[layer.type]
    out_saved = layer.type in ("relu", "sigmoid", "tanh")
    return LayerCost(_elementwise(elems, b, f), _elementwise(elems, b, bw, reads=2), NO_PASS,
                     saves_input=not out_saved, saves_output=out_saved)


def _softmax(layer: Layer, n: int, b: int) -> LayerCost:
    """Softmax over the last dimension d: max, subtract, exp, sum, divide ≈ 5 FLOP/element, depth
    2⌈log2 d⌉ (two reductions); backward y⊙(∇y − Σ y⊙∇y) ≈ 4 FLOP/element."""
    elems, d = n * layer.in_elements, layer.in_shapes[0][-1]
    return LayerCost(_elementwise(elems, b, 5, depth=2 * clog2(d)), _elementwise(elems, b, 4, reads=2, depth=clog2(d)),
                     NO_PASS, saves_output=True)


def _dropout(layer: Layer, n: int, b: int) -> LayerCost:
    """Dropout: draw a keep-mask and scale (2 FLOP/element), store the 1-byte mask; ∇x applies it."""
    elems = n * layer.in_elements
    fwd = PassCost(2 * elems, 2 * elems, 1, elems * b, elems * (b + MASK_BYTES))
    bwd = PassCost(elems, elems, 1, elems * (b + MASK_BYTES), elems * b)
    return LayerCost(fwd, bwd, NO_PASS, extra_saved_bytes=elems * MASK_BYTES)


def _add(layer: Layer, n: int, b: int) -> LayerCost:
    """Sum of k tensors: (k−1) adds per element, reads k, writes 1; the gradient passes through unchanged."""
    k, elems = len(layer.inputs), n * layer.out_elements
    return LayerCost(_elementwise(elems, b, k - 1, reads=k), NO_PASS, NO_PASS)


def _concat(layer: Layer, n: int, b: int) -> LayerCost:
    """Concatenation copies every input once; its gradient is a set of views (no copy)."""
    elems = n * layer.out_elements
    return LayerCost(PassCost(0, elems, 1, elems * b, elems * b), NO_PASS, NO_PASS)


def _view(layer: Layer, n: int, b: int) -> LayerCost:
    """Flatten and reshape are views: no kernel."""
    return LayerCost(NO_PASS, NO_PASS, NO_PASS)


def _embedding(layer: Layer, n: int, b: int) -> LayerCost:
    """Embedding gather of N·L rows of width d (+ position / token-type rows added: 1 FLOP per element
    each). ∇w scatters N·L rows into a dense vocab×d gradient (zeroed first, as PyTorch does)."""
    a = layer.attrs
    tokens, d = n * layer.in_shapes[0][0], a["dim"]
    extra = (1 if a["positions"] else 0) + (1 if a["token_types"] else 0)
    rows_read = tokens * (1 + extra)
    fwd = PassCost(extra * tokens * d, tokens * d * (1 + extra), 1, rows_read * d * b + tokens * INDEX_BYTES,
                   tokens * d * b, kernels=1 + extra)
    table = (a["vocab"] + a["positions"] + a["token_types"]) * d
    bwd_w = PassCost(rows_read * d, rows_read * d, 1, tokens * d * b + tokens * INDEX_BYTES,
                     table * b + rows_read * d * b, kernels=2 + extra)
    return LayerCost(fwd, NO_PASS, bwd_w, extra_saved_bytes=tokens * INDEX_BYTES)


def _recurrent(layer: Layer, n: int, b: int) -> LayerCost:
    """LSTM / GRU / Elman RNN over L steps (S002 §3.1.2, §4.4): per layer and direction one input GEMM for
    all steps (N·L, g·h, F) and L sequential recurrent GEMMs (N, g·h, h), g gates; ≈ 3·g element-wise
    FLOP per hidden unit per step. Depth is sequential in time: L·(⌈log2 (F+h)⌉ + 2). ∇x and ∇w repeat
    the GEMM volumes (∇w's recurrent part as one GEMM over all steps), but for the gradient of the zero
    initial state, which needs none: L − 1 recurrent ∇h GEMMs (PyTorch's autograd skips the first)."""
    a, (steps, feat) = layer.attrs, layer.in_shapes[0]
    gates, h = recurrent_gates(layer.type), a["hidden"]
    dirs = 2 if a["bidirectional"] else 1
    fwd_g, bx_g, bw_g = [], [], []
    flops_el = 0.0
    f_in = feat
    input_grad = (Gemm(n * steps, feat, gates * h),) * dirs  # the first layer's ∇x, per direction
    for _ in range(a["layers"]):
        for _ in range(dirs):
            fwd_g += [Gemm(n * steps, gates * h, f_in), Gemm(n, gates * h, h, steps)]
            bx_g += [Gemm(n * steps, f_in, gates * h)] + ([Gemm(n, h, gates * h, steps - 1)] if steps > 1 else [])
            bw_g += [Gemm(gates * h, f_in, n * steps), Gemm(gates * h, h, n * steps)]
            flops_el += 3 * gates * h * n * steps
        f_in = h * dirs
    out_elems = n * steps * h * dirs
    in_elems = n * steps * feat
    state_bytes = n * steps * (gates + 2) * h * dirs * a["layers"] * b
    depth = steps * (clog2(feat + h) + 2)
    w_bytes = layer.params * b
    def gemm_pass(gemms: list[Gemm], reads: float, writes: float, elementwise: float) -> PassCost:
        flops = sum(g.flops for g in gemms) + elementwise
        return PassCost(flops, flops / 2, depth, reads, writes, tuple(gemms), "gemm", kernels=len(gemms) + steps)
    fwd = gemm_pass(fwd_g, in_elems * b + w_bytes, out_elems * b + state_bytes, flops_el)
    bwd_x = gemm_pass(bx_g, out_elems * b + state_bytes + w_bytes, in_elems * b, 2 * flops_el)
    bwd_w = gemm_pass(bw_g, state_bytes + in_elems * b, w_bytes, 0)
    return LayerCost(fwd, bwd_x, bwd_w, saves_input=True, saves_output=True, extra_saved_bytes=state_bytes,
                     internal_backward=_without_gemms(bwd_x, input_grad, state_bytes))


def _attention(layer: Layer, n: int, b: int, fused: frozenset[str] = frozenset()) -> LayerCost:
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
    log-sum-exp per row and head; its backward recomputes QKᵀ (one more batched GEMM).
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
    flash = "flash_attention" in fused
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
    fwd_parts, bwd_parts = _attention_parts(scores, rows * d, b, bool(a["dropout"]), bool(a.get("causal")), fused)
    if a.get("rotary"):  # rotary embeddings on Q and K (Su et al. 2021): x·cos + rotate(x)·sin, 3 FLOP/element
        rope = ("rope", "forward", _elementwise(rows * (d + kv), b, 3))
        fwd_parts, bwd_parts = (rope,) + fwd_parts, bwd_parts + (rope,)
    fwd, bwd_x = replace(fwd, parts=fwd_parts), replace(bwd_x, parts=bwd_parts)
    bwd_w = gemm_pass(bw_g, bias, 2 * act, w_bytes)
    if flash:
        kept_scores = bh * steps * 4  # fp32 log-sum-exp per row and head
    else:
        kept_scores = scores * b + (scores * (b + MASK_BYTES) if a["dropout"] else 0)
    return LayerCost(fwd, bwd_x, bwd_w, saves_input=True, extra_saved_bytes=act - rows * d * b + kept_scores,
                     internal_backward=_without_gemms(bwd_x, (Gemm(rows, d, qkv),), act - rows * d * b))


def _mla(layer: Layer, n: int, b: int, fused: frozenset[str] = frozenset()) -> LayerCost:
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
    flash = "flash_attention" in fused
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
    fwd_parts, bwd_parts = _attention_parts(scores, rows * h * dv, b, False, bool(a["causal"]), fused)
    extra_f = [("rmsnorm", "forward", _elementwise(norms, b, 4, reads=2)), ("rope", "forward", _elementwise(rope_el, b, 3))]
    extra_b = [("rope", "forward", _elementwise(rope_el, b, 3)), ("rmsnorm", "backward_data", _elementwise(norms, b, 8, reads=4))]
    fwd_parts, bwd_parts = tuple(extra_f) + fwd_parts, bwd_parts + tuple(extra_b)
    depth = clog2(d) + clog2(dqk) + 3 * clog2(steps) + clog2(h * dv)
    def gemm_pass(gemms: tuple[Gemm, ...], parts, reads: float, writes: float) -> PassCost:
        flops = sum(g.flops for g in gemms) + sum(p[2].flops for p in parts)
        return PassCost(flops, flops / 2, depth, reads, writes, gemms, "gemm", kernels=len(gemms) + len(parts),
                        parts=tuple(parts))
    fwd = gemm_pass(fwd_g, fwd_parts, rows * d * b + w_bytes + act + 2 * score_traffic, act + 2 * score_traffic)
    bwd_x = gemm_pass(bx_g, bwd_parts, act + w_bytes + 3 * score_traffic, act + 2 * score_traffic)
    bwd_w = gemm_pass(bw_g, (), 2 * act, w_bytes)
    kept_scores = bh * steps * 4 if flash else scores * b
    reads_x = tuple(Gemm(rows, i, o) for o, i in (proj[0], proj[-2]))  # ∇x of the Q and KV down-projections
    return LayerCost(fwd, bwd_x, bwd_w, saves_input=True, extra_saved_bytes=act - rows * d * b + kept_scores,
                     internal_backward=_without_gemms(bwd_x, reads_x, act - rows * d * b))


def _attention_parts(scores: int, rows_by_width: int, b: int, dropout: bool, causal: bool,
                     fused: frozenset[str] = frozenset()) -> tuple[tuple[tuple[str, str, PassCost], ...],
                                                                   tuple[tuple[str, str, PassCost], ...]]:
    """The memory-bound kernels an attention runs between its GEMMs, forward and backward, each as
    (op whose measured curve prices it, pass, cost). Unfused (PyTorch's math path:
    ``softmax(QKᵀ · d_h^-1/2 [masked]) [dropout] · V``), over the S = N·h·L² scores: the scaling
    (one read, one write; priced like relu forward), the causal mask's fill (same), softmax,
    dropout; over the N·L·D activations four layout copies (Q, Kᵀ and V made contiguous for the
    batched GEMMs, the context moved back), each a read and a write. The backward runs the
    gradient of each. `scale_mask_softmax` makes scaling, mask and softmax one kernel each way;
    `strided_attention` leaves only the context's copy; `flash_attention` keeps only the
    context's copy (the core is one kernel, priced by its GEMMs). The FLOPs of scaling, softmax
    and dropout are already in the pass's element-wise remainder, so the parts replace it when
    priced."""
    unary = _elementwise(scores, b, 1)
    copy = _elementwise(rows_by_width, b, 0)
    copies = 1 if fused & {"strided_attention", "flash_attention"} else 4
    fwd: list[tuple[str, str, PassCost]] = []
    bwd: list[tuple[str, str, PassCost]] = []
    if "flash_attention" not in fused:
        if "scale_mask_softmax" in fused:
            fwd.append(("softmax", "forward", _elementwise(scores, b, 6 + causal)))
            bwd.append(("softmax", "backward_data", _elementwise(scores, b, 5, reads=2)))
        else:
            for _ in range(1 + causal):
                fwd.append(("relu", "forward", unary))
                bwd.append(("relu", "forward", unary))
            fwd.append(("softmax", "forward", _elementwise(scores, b, 5)))
            bwd.append(("softmax", "backward_data", _elementwise(scores, b, 4, reads=2)))
        if dropout:
            fwd.append(("dropout", "forward", PassCost(2 * scores, 2 * scores, 1, scores * b,
                                                       scores * (b + MASK_BYTES))))
            bwd.append(("dropout", "backward_data", PassCost(scores, scores, 1, scores * (b + MASK_BYTES), scores * b)))
    fwd += [("relu", "forward", copy)] * copies
    bwd += [("relu", "forward", copy)] * copies
    return tuple(fwd), tuple(bwd)


ROUTER_BYTES = 4  # router logits, probabilities and the auxiliary loss's statistics are kept in fp32
MOE_ROUTED_GEMMS = 3
"""A `moe` pass lists its router GEMM, the routed experts' up and down GEMMs, then the shared experts'."""


def _moe(layer: Layer, n: int, b: int, ep: int = 1) -> LayerCost:
    """Mixture-of-experts layer (Shazeer et al. 2017; GShard; Switch Transformer, Fedus et al. 2022;
    DeepSeekMoE, Dai et al. 2024, for shared and fine-grained experts) on the busiest of `ep` expert
    ranks, R = N·L tokens of width D, E experts of width F, top-k, S shared experts of width F_s:

    * router: GEMM (R, E, D), softmax over R·E scores (5 FLOP/element, fp32) and top-k selection
      (one pass over the scores); with `aux_loss` the load-balancing loss (Switch eq. 4:
      α·E·Σ_i f_i·P_i: per score a count and a mean, 2 FLOP/element);
    * permute: the R·k routed copies of the tokens gathered into expert order (a copy);
    * routed experts: on this rank E/ep experts, each a GEMM (t, m·F, D) up (m = 2 gated, 1 otherwise),
      the activation and (t, D, F) down, t = ⌈u·R·k / (E/ep)⌉ rows (`dlsim.cost.moe_routing`:
      u = the busiest rank's load over the mean, capped by the capacity factor) — balanced, the same
      FLOPs as all E experts over the R·k pairs at ep = 1;
    * unpermute: the k outputs of each token scaled by its gates and summed (2 FLOP per element);
    * shared experts: GEMMs (R, m·S·F_s, D) and (R, D, S·F_s) on every token.

    ∇x and ∇w repeat the GEMM volumes (as `_linear`); the router's ∇x includes the softmax's.
    Fine-grained experts (DeepSeekMoE) are many experts of small F with a larger k: the same formulas.
    Kept for the backward pass: the input, the router's probabilities (fp32) and indices, the
    permuted tokens, each expert's up-projection output and activation, the shared experts' likewise.
    """
    a, (steps, d) = layer.attrs, layer.in_shapes[0]
    rows = n * steps
    r = routing(a, rows, ep)
    e, k, f = r.experts, r.top_k, a["ffn_hidden"]
    gated = a["activation"] in ("swiglu", "geglu")
    up = (2 if gated else 1) * f
    local, t = r.local_experts, r.rows_per_expert
    pairs = t * local
    fs = (a["shared_ffn_hidden"] or f) * a["shared_experts"]
    ups = (2 if gated else 1) * fs
    fwd_g = [Gemm(rows, e, d), Gemm(t, up, d, local), Gemm(t, d, f, local)]
    bx_g = [Gemm(rows, d, e), Gemm(t, f, d, local), Gemm(t, d, up, local)]
    bw_g = [Gemm(e, d, rows), Gemm(d, f, t, local), Gemm(up, d, t, local)]
    if fs:
        fwd_g += [Gemm(rows, ups, d), Gemm(rows, d, fs)]
        bx_g += [Gemm(rows, fs, d), Gemm(rows, d, ups)]
        bw_g += [Gemm(d, fs, rows), Gemm(ups, d, rows)]
    scores = rows * e
    act = a["activation"]
    act_f, act_b = _GLU_FLOPS[act] if gated else _ACTIVATION_FLOPS[act]
    act_elems = pairs * f + rows * fs
    bias = (pairs * (up + d) + rows * (ups + d if fs else 0)) if a["bias"] else 0
    fwd_parts = [("softmax", "forward", _elementwise(scores, ROUTER_BYTES, 5 + (2 if a["aux_loss"] else 0),
                                                      depth=2 * clog2(e))),
                 ("relu", "forward", _elementwise(pairs * d, b, 0)),  # permute: gather in expert order
                 (act, "forward", _elementwise(act_elems, b, act_f, reads=2 if gated else 1)),
                 ("add", "forward", _elementwise(pairs * d, b, 2, reads=2))]  # unpermute, gate and sum
    bwd_parts = [("add", "forward", _elementwise(pairs * d, b, 2, reads=2)),
                 (act, "backward_data", _elementwise(act_elems, b, act_b, reads=3 if gated else 2,
                                                     writes=2 if gated else 1)),
                 ("relu", "forward", _elementwise(pairs * d, b, 0)),
                 ("softmax", "backward_data", _elementwise(scores, ROUTER_BYTES, 4 + (2 if a["aux_loss"] else 0), reads=2))]
    elementwise_f = sum(p[2].flops for p in fwd_parts) + bias
    elementwise_b = sum(p[2].flops for p in bwd_parts)
    w_bytes = (d * e + local * (up + f) * d + (ups + fs) * d) * b
    hidden = (pairs * (up + (f if gated else 0)) + rows * (ups + (fs if gated else 0))) * b
    x_bytes, perm = rows * d * b, pairs * d * b
    depth = clog2(d) + 2 * clog2(e) + clog2(f) + 1
    def gemm_pass(gemms: list[Gemm], extra: float, reads: float, writes: float, parts) -> PassCost:
        flops = sum(g.flops for g in gemms) + extra
        return PassCost(flops, flops / 2, depth, reads, writes, tuple(gemms), "gemm",
                        kernels=len(gemms) + len(parts), parts=tuple(parts))
    fwd = gemm_pass(fwd_g, elementwise_f, x_bytes + w_bytes + scores * ROUTER_BYTES + perm + hidden,
                    scores * ROUTER_BYTES + perm + hidden + x_bytes, fwd_parts)
    bwd_x = gemm_pass(bx_g, elementwise_b, x_bytes + w_bytes + hidden + perm + scores * ROUTER_BYTES,
                      x_bytes + hidden + perm, bwd_parts)
    bwd_w = gemm_pass(bw_g, bias, x_bytes + perm + hidden, w_bytes, ())
    saved = scores * ROUTER_BYTES + rows * k * INDEX_BYTES + perm + hidden
    reads_x = (Gemm(rows, d, e), Gemm(t, d, up, local)) + ((Gemm(rows, d, ups),) if fs else ())  # router, up-projections
    return LayerCost(fwd, bwd_x, bwd_w, saves_input=True, extra_saved_bytes=saved,
                     internal_backward=_without_gemms(bwd_x, reads_x, hidden + perm))


def _cross_entropy(layer: Layer, n: int, b: int) -> LayerCost:
    """Softmax cross-entropy over V classes (S002 §2.1, ℓ_ce): log-softmax and pick ≈ 5 FLOP/element,
    depth 2⌈log2 V⌉; backward softmax − one-hot ≈ 4 FLOP/element."""
    elems, v = n * layer.in_elements, layer.in_shapes[0][-1]
    fwd = PassCost(5 * elems, 5 * elems, 2 * clog2(v), elems * b, (elems // v) * 4)
    bwd = PassCost(4 * elems, 4 * elems, 2 * clog2(v), elems * b, elems * b)
    return LayerCost(fwd, bwd, NO_PASS, saves_input=True)


def _conv_transpose2d(layer: Layer, n: int, b: int) -> LayerCost:
    """Transposed convolution as the GEMMs of a convolution's input gradient (Dumoulin & Visin 2016,
    §4): forward (C_out/g·K_y·K_x, N·H·W, C_in/g) then col2im onto the output; ∇x is a direct
    convolution (C_in/g, N·H·W, C_out/g·K_y·K_x); ∇w (C_in/g, C_out/g·K_y·K_x, N·H·W); g groups, H×W the
    input. MACs per pass N·H·W·C_in·(C_out/g)·K_y·K_x, as PyTorch's FLOP counter counts a transposed
    convolution (over the input's pixels)."""
    a, (cin, h, w) = layer.attrs, layer.in_shapes[0]
    g = transposed_geometry(dict(a), layer.in_shapes[0])
    groups, cout = a["groups"], a["out_channels"]
    cin_g, cout_g = cin // groups, cout // groups
    kk = g["kh"] * g["kw"]
    pixels = n * h * w
    macs = pixels * cin * cout_g * kk
    x_bytes, y_bytes, w_bytes = pixels * cin * b, n * cout * g["ho"] * g["wo"] * b, layer.params * b
    bias = n * cout * g["ho"] * g["wo"] if a["bias"] else 0
    depth = conv_direct_depth(cin_g, g["kh"], g["kw"])
    fwd = PassCost(2 * macs + bias, macs, depth, x_bytes + w_bytes, y_bytes, (Gemm(cout_g * kk, pixels, cin_g, groups),),
                   "gemm", kernels=2)
    bwd_x = PassCost(2 * macs, macs, depth, y_bytes + w_bytes, x_bytes, (Gemm(cin_g, pixels, cout_g * kk, groups),),
                     "gemm", kernels=2)
    bwd_w = PassCost(2 * macs + bias, macs, depth, y_bytes + x_bytes, w_bytes, (Gemm(cin_g, cout_g * kk, pixels, groups),),
                     "gemm", kernels=2)
    return LayerCost(fwd, bwd_x, bwd_w, saves_input=True)


def _groupnorm(layer: Layer, n: int, b: int) -> LayerCost:
    """Group normalisation (Wu & He 2018): statistics over the C/G·H·W elements of each group, then
    normalise, scale and shift; FLOPs, traffic and the fused backward as batch and layer norm
    (`_norm`); keeps x and two fp32 statistics per (sample, group)."""
    shape, groups = layer.in_shapes[0], layer.attrs["groups"]
    elems = n * layer.in_elements
    depth = clog2(math.prod(shape) // groups)
    fwd = PassCost(8 * elems, 8 * elems, depth, 2 * elems * b, elems * b)
    bwd = PassCost(12 * elems, 12 * elems, depth, 4 * elems * b, elems * b)
    return LayerCost(fwd, bwd, NO_PASS, saves_input=True, extra_saved_bytes=2 * 4 * n * groups)


def _matmul(layer: Layer, n: int, b: int) -> LayerCost:
    """Product of two activations A (..., m, k) · B (..., k, n) batched over the broadcast leading
    dimensions and the samples: forward GEMM (m, n, k); ∇A = ∇C·Bᵀ (m, k, n) and ∇B = Aᵀ·∇C (k, n, m)
    (both input gradients, no weights; each runs only if its input needs a gradient). Depths ⌈log2 k⌉, ⌈log2 n⌉, ⌈log2 m⌉."""
    x, y = layer.in_shapes
    m, k, cols = x[-2], x[-1], y[-1]
    count = n * math.prod(layer.out_shape[:-2])
    a_bytes, b_bytes, c_bytes = n * math.prod(x) * b, n * math.prod(y) * b, n * layer.out_elements * b
    fwd = PassCost(2 * m * cols * k * count, m * cols * k * count, clog2(k), a_bytes + b_bytes, c_bytes,
                   (Gemm(m, cols, k, count),), "gemm")
    grad_a, grad_b = Gemm(m, k, cols, count), Gemm(k, cols, m, count)
    bwd = PassCost(4 * m * cols * k * count, 2 * m * cols * k * count, max(clog2(cols), clog2(m)),
                   2 * c_bytes + a_bytes + b_bytes, a_bytes + b_bytes, (grad_a, grad_b), "gemm", kernels=2)
    per_input = (_without_gemms(bwd, (grad_b,), a_bytes), _without_gemms(bwd, (grad_a,), b_bytes))
    return LayerCost(fwd, bwd, NO_PASS, saves_input=True, input_backward=per_input)


def _sdpa(layer: Layer, n: int, b: int) -> LayerCost:
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


def _generic(layer: Layer, n: int, b: int) -> LayerCost:
    """An operator without a dlsim model, priced by what was measured on it per sample: its FLOPs (as
    PyTorch's FLOP counter counts them, matrix-class work) and the bytes of every tensor its kernels
    read and write, forward, for the input gradients (∇x) and for the weight gradients (∇w). A pass
    with FLOPs is kind "generic" (priced at the matrix peak by the roofline), one without is
    memory-bound. The counts were taken in the importer's data type; they scale with the batch."""
    a = layer.attrs
    def one(flops: float, nbytes: float) -> PassCost:
        if flops == 0 and nbytes == 0:
            return NO_PASS
        return PassCost(n * flops, n * flops / 2, 1, n * nbytes / 2, n * nbytes / 2,
                        kind="generic" if flops else "memory")
    return LayerCost(one(a["flops"], a["bytes"]), one(a["grad_flops"], a["grad_bytes"]),
                     one(a["wgrad_flops"], a["wgrad_bytes"]), saves_input=True)


_RULES: dict[str, Callable[[Layer, int, int], LayerCost]] = {
    "conv2d": _conv2d, "linear": _linear, "maxpool": _pool, "avgpool": _pool,
    "global_avgpool": _global_pool, "global_maxpool": _global_pool,
    "batchnorm": _norm, "layernorm": _norm, "rmsnorm": _rmsnorm, "lrn": _lrn, "swiglu": _glu, "geglu": _glu,
    "relu": _activation, "gelu": _activation, "tanh": _activation, "sigmoid": _activation,
    "softmax": _softmax, "dropout": _dropout, "add": _add, "concat": _concat,
    "flatten": _view, "reshape": _view, "embedding": _embedding,
    "lstm": _recurrent, "gru": _recurrent, "rnn": _recurrent,
    "attention": _attention, "cross_entropy": _cross_entropy,
    "relu6": _activation, "silu": _activation, "conv_transpose2d": _conv_transpose2d, "groupnorm": _groupnorm,
    "matmul": _matmul, "sdpa": _sdpa, "generic": _generic,
}


def layer_cost(layer: Layer, batch: int, dtype: str = "fp32", fused: frozenset[str] = frozenset(),
               ep: int = 1) -> LayerCost:
    """Cost of `layer` for `batch` samples with elements of `dtype`, with the fused kernels `fused`
    (`FUSIONS`; fusions across layers, such as bias_dropout_add, are `fuse_dropout_add`); a
    mixture of experts as its busiest rank runs it under expert parallelism of degree `ep`."""
    if batch < 1:
        raise ValueError(f"batch must be positive, got {batch}")
    if layer.type == "attention":
        return _attention(layer, batch, DTYPE_BYTES[dtype], fused)
    if layer.type == "moe":
        return _moe(layer, batch, DTYPE_BYTES[dtype], ep)
    if layer.type == "mla":
        return _mla(layer, batch, DTYPE_BYTES[dtype], fused)
    return _RULES[layer.type](layer, batch, DTYPE_BYTES[dtype])


def fuse_dropout_add(dropout: LayerCost, add: LayerCost, residual_bytes: float) -> tuple[LayerCost, LayerCost]:
    """A dropout and the residual add consuming it as one kernel (Megatron-LM's bias_dropout_add):
    the forward reads x and the residual and writes the sum and the 1-byte mask, so the dropout's
    output is neither written nor read back; the add kernel disappears. The backward (the mask
    applied to the incoming gradient) is the dropout's. `residual_bytes` is the add's other input."""
    f = dropout.forward
    fused_fwd = replace(f, flops=f.flops + add.forward.flops, work=f.work + add.forward.work,
                        bytes_read=f.bytes_read + residual_bytes)
    return replace(dropout, forward=fused_fwd), replace(add, forward=NO_PASS)
