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
from dataclasses import replace
from typing import Callable

from dlsim.cost.attention import attention_cost, mla_cost, sdpa_cost
from dlsim.cost.eager import glu_chain, rmsnorm_chain
from dlsim.cost.loss import loss_chain
from dlsim.cost.layercost import ACTIVATION_FLOPS, GLU_FLOPS, INDEX_BYTES, MASK_BYTES, NO_PASS, Gemm, LayerCost, PassCost, elementwise, without_gemms
from dlsim.cost.moe import MOE_ROUTED_GEMMS, ROUTER_BYTES, moe_cost
from dlsim.cost.workdepth import clog2, conv_direct_depth
from dlsim.spec.model import Layer
from dlsim.spec.ops import conv_geometry, recurrent_gates, transposed_geometry
from dlsim.units import DTYPE_BYTES

__all__ = ["Gemm", "INDEX_BYTES", "LayerCost", "MASK_BYTES", "MOE_ROUTED_GEMMS", "NO_PASS", "PassCost", "ROUTER_BYTES",
           "fuse_dropout_add", "layer_cost"]


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


def _rmsnorm(layer: Layer, n: int, b: int, fused: bool = True) -> LayerCost:
    """RMS norm over the last dimension (Zhang & Sennrich 2019): mean of squares, rsqrt, normalise and
    scale ≈ 4 FLOP/element forward, ≈ 8 backward. Fused (one kernel each way, the ``rmsnorm`` fusion):
    read and write counted as for layer norm (x read twice forward; x and ∇y twice backward); depth
    ⌈log2 D⌉; keeps x and one fp32 scale per row. Unfused: the eager chain of
    `dlsim.cost.eager.rmsnorm_chain`."""
    elems, d = n * layer.in_elements, layer.in_shapes[0][-1]
    rows = elems // d or 1
    if not fused:
        fwd, bwd, kept = rmsnorm_chain(elems, rows, b, 4 * elems, 8 * elems)
        return LayerCost(fwd, bwd, NO_PASS, extra_saved_bytes=kept)
    depth = clog2(d)
    fwd = PassCost(4 * elems, 4 * elems, depth, 2 * elems * b, elems * b)
    bwd = PassCost(8 * elems, 8 * elems, depth, 4 * elems * b, elems * b)
    return LayerCost(fwd, bwd, NO_PASS, saves_input=True, extra_saved_bytes=4 * rows)


def _glu(layer: Layer, n: int, b: int, fused: bool = True) -> LayerCost:
    """Gated linear unit over the two halves a, b of the last dimension (Shazeer 2020, "GLU variants
    improve transformer"). Fused (one kernel each way, the ``glu`` fusion): reads 2F, writes F; the
    backward reads a, b and ∇y and writes ∇a, ∇b; keeps its input (both halves). Unfused: the eager
    chain of `dlsim.cost.eager.glu_chain` (activation, then product)."""
    out = n * layer.out_elements
    f, bw = GLU_FLOPS[layer.type]
    if not fused:
        fwd, bwd, kept = glu_chain(out, b, f * out, bw * out)
        return LayerCost(fwd, bwd, NO_PASS, extra_saved_bytes=kept)
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


def _activation(layer: Layer, n: int, b: int) -> LayerCost:
    """Activation σ(x) (S002 Table 4, Appendix A.2): W = O(NCHW), D = O(1) for y and ∇x; no parameters."""
    elems = n * layer.in_elements
    f, bw = ACTIVATION_FLOPS[layer.type]
    out_saved = layer.type in ("relu", "sigmoid", "tanh")
    return LayerCost(elementwise(elems, b, f), elementwise(elems, b, bw, reads=2), NO_PASS,
                     saves_input=not out_saved, saves_output=out_saved)


def _softmax(layer: Layer, n: int, b: int) -> LayerCost:
    """Softmax over the last dimension d: max, subtract, exp, sum, divide ≈ 5 FLOP/element, depth
    2⌈log2 d⌉ (two reductions); backward y⊙(∇y − Σ y⊙∇y) ≈ 4 FLOP/element."""
    elems, d = n * layer.in_elements, layer.in_shapes[0][-1]
    return LayerCost(elementwise(elems, b, 5, depth=2 * clog2(d)), elementwise(elems, b, 4, reads=2, depth=clog2(d)),
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
    return LayerCost(elementwise(elems, b, k - 1, reads=k), NO_PASS, NO_PASS)


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
                     internal_backward=without_gemms(bwd_x, input_grad, state_bytes))


def _cross_entropy(layer: Layer, n: int, dtype: str, loss: str) -> LayerCost:
    """Softmax cross-entropy over V classes (S002 §2.1, ℓ_ce): log-softmax and pick ≈ 5 FLOP/element,
    depth 2⌈log2 V⌉; backward softmax − one-hot ≈ 4 FLOP/element; the kernels as the stack's `loss`
    implementation runs them (`dlsim.cost.loss`)."""
    elems, v = n * layer.in_elements, layer.in_shapes[0][-1]
    fwd, bwd, kept = loss_chain(loss, elems, elems // v, dtype)
    if kept is None:
        return LayerCost(fwd, bwd, NO_PASS, saves_input=True)
    return LayerCost(fwd, bwd, NO_PASS, extra_saved_bytes=kept)


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
    per_input = (without_gemms(bwd, (grad_b,), a_bytes), without_gemms(bwd, (grad_a,), b_bytes))
    return LayerCost(fwd, bwd, NO_PASS, saves_input=True, input_backward=per_input)


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
    "attention": attention_cost,
    "relu6": _activation, "silu": _activation, "conv_transpose2d": _conv_transpose2d, "groupnorm": _groupnorm,
    "matmul": _matmul, "sdpa": sdpa_cost, "generic": _generic,
}


def layer_cost(layer: Layer, batch: int, dtype: str = "fp32", fused: frozenset[str] = frozenset(),
               ep: int = 1, loss: str = "single_pass") -> LayerCost:
    """Cost of `layer` for `batch` samples with elements of `dtype`, with the fused kernels `fused`
    (`FUSIONS`; fusions across layers, such as bias_dropout_add, are `fuse_dropout_add`); a
    mixture of experts as its busiest rank runs it under expert parallelism of degree `ep`; a
    cross-entropy as the stack's `loss` kernel computes it (`LOSS_KERNELS`)."""
    if batch < 1:
        raise ValueError(f"batch must be positive, got {batch}")
    if layer.type == "attention":
        return attention_cost(layer, batch, DTYPE_BYTES[dtype], fused)
    if layer.type == "moe":
        return moe_cost(layer, batch, DTYPE_BYTES[dtype], ep)
    if layer.type == "mla":
        return mla_cost(layer, batch, DTYPE_BYTES[dtype], fused)
    if layer.type == "rmsnorm":
        return _rmsnorm(layer, batch, DTYPE_BYTES[dtype], "rmsnorm" in fused)
    if layer.type in ("swiglu", "geglu"):
        return _glu(layer, batch, DTYPE_BYTES[dtype], "glu" in fused)
    if layer.type == "cross_entropy":
        return _cross_entropy(layer, batch, dtype, loss)
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

