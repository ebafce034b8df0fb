"""Operator types: their attributes, shape inference and parameter counts.

Shapes are per sample (the batch dimension is left out): images are ``(C, H, W)``,
sequences ``(L, D)``, flat features ``(F,)``, token ids ``(L,)``, a loss ``()``.
Each operator type declares its attributes (with defaults) and two pure functions, so a new
operator is one entry in `OPS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from dlsim.errors import ShapeError

Shape = tuple[int, ...]
REQUIRED = object()


class _Fail(Exception):
    """Raised by shape rules; turned into a ShapeError naming the layer."""


def _pair(value: Any, what: str) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise _Fail(f"{what} must be an integer or a pair, got {value!r}")
        a, b = value
    else:
        a = b = value
    for v in (a, b):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _Fail(f"{what} must be an integer or a pair of integers, got {value!r}")
    return int(a), int(b)


def _positive(value: Any, what: str, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        raise _Fail(f"{what} must be a {'non-negative' if allow_zero else 'positive'} integer, got {value!r}")
    return value


def _expect_rank(shape: Shape, ranks: tuple[int, ...], what: str) -> None:
    if len(shape) not in ranks:
        raise _Fail(f"expects a {' or '.join(str(r) + '-d' for r in ranks)} per-sample input ({what}), got shape {list(shape)}")


def _single(ins: list[Shape]) -> Shape:
    if len(ins) != 1:
        raise _Fail(f"takes one input, got {len(ins)}")
    return ins[0]


def _check_window(kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, offsets: dict) -> None:
    """Kernel, stride and dilation positive; paddings (`offsets`: name -> pair) non-negative."""
    for v, what in ((kh, "kernel"), (kw, "kernel"), (sh, "stride"), (sw, "stride"), (dh, "dilation"), (dw, "dilation")):
        _positive(v, what)
    for what, pair in offsets.items():
        for v in pair:
            _positive(v, what, allow_zero=True)


def _conv_out_channels(a: dict, x: Shape) -> int:
    """Output channels of a (transposed) convolution over a (C, H, W) input, groups dividing both."""
    _expect_rank(x, (3,), "C, H, W")
    cout, groups = _positive(a["out_channels"], "out_channels"), _positive(a["groups"], "groups")
    if x[0] % groups or cout % groups:
        raise _Fail(f"groups={groups} must divide in_channels={x[0]} and out_channels={cout}")
    return cout


def conv_geometry(attrs: dict, in_shape: Shape) -> dict:
    """Kernel, stride, padding, dilation and output size of a conv2d / pooling window.

    Output size (S002 Appendix B, with dilation d): H' = floor((H + 2P - d(K-1) - 1)/S) + 1.
    """
    kh, kw = _pair(attrs["kernel"], "kernel")
    stride = attrs.get("stride")
    sh, sw = _pair(attrs["kernel"] if stride is None else stride, "stride")  # a window's stride defaults to it
    padding = attrs.get("padding", 0)
    dh, dw = _pair(attrs.get("dilation", 1), "dilation")
    if padding == "same":
        ph, pw = (dh * (kh - 1)) // 2, (dw * (kw - 1)) // 2
    else:
        ph, pw = _pair(padding, "padding")
    _check_window(kh, kw, sh, sw, dh, dw, {"padding": (ph, pw)})
    _, h, w = in_shape
    def out(n: int, k: int, s: int, p: int, d: int) -> int:
        span = n + 2 * p - d * (k - 1) - 1
        if attrs.get("ceil_mode"):
            return -(-span // s) + 1
        return span // s + 1
    ho, wo = out(h, kh, sh, ph, dh), out(w, kw, sw, pw, dw)
    if ho < 1 or wo < 1:
        raise _Fail(f"window {kh}x{kw} (stride {sh}, padding {ph}, dilation {dh}) does not fit input {h}x{w}")
    return {"kh": kh, "kw": kw, "sh": sh, "sw": sw, "ph": ph, "pw": pw, "dh": dh, "dw": dw, "ho": ho, "wo": wo}


# --- shape rules -------------------------------------------------------------------------

def _conv2d(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    cout = _conv_out_channels(a, x)
    g = conv_geometry(a, x)
    return (cout, g["ho"], g["wo"])


def _pool(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    _expect_rank(x, (3,), "C, H, W")
    g = conv_geometry(a, x)
    return (x[0], g["ho"], g["wo"])


def _global_pool(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    _expect_rank(x, (3,), "C, H, W")
    return (x[0],)


def _linear(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    if len(x) == 0:
        raise _Fail("expects a per-sample input with a feature dimension, got a scalar")
    return x[:-1] + (_positive(a["out_features"], "out_features"),)


def _same(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    if len(x) == 0:
        raise _Fail("cannot apply to a scalar")
    return x


def _batchnorm(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    _expect_rank(x, (1, 2, 3), "C, or C, L, or C, H, W")
    return x


def _lrn(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    _expect_rank(x, (3,), "C, H, W")
    _positive(a["size"], "size")
    return x


def _add(a: dict, ins: list[Shape]) -> Shape:
    if len(ins) < 2:
        raise _Fail(f"needs at least two inputs, got {len(ins)}")
    if any(s != ins[0] for s in ins):
        raise _Fail(f"input shapes differ: {[list(s) for s in ins]}")
    return ins[0]


def _concat(a: dict, ins: list[Shape]) -> Shape:
    if len(ins) < 2:
        raise _Fail(f"needs at least two inputs, got {len(ins)}")
    axis = a["axis"]
    rank = len(ins[0])
    if not -rank <= axis < rank:
        raise _Fail(f"axis {axis} out of range for {rank}-d inputs")
    axis %= rank
    for s in ins:
        if len(s) != rank or any(s[i] != ins[0][i] for i in range(rank) if i != axis):
            raise _Fail(f"inputs differ outside axis {axis}: {[list(s) for s in ins]}")
    return ins[0][:axis] + (sum(s[axis] for s in ins),) + ins[0][axis + 1:]


def _flatten(a: dict, ins: list[Shape]) -> Shape:
    return (math.prod(_single(ins)),)


def _reshape(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    target = list(a["shape"])
    if sum(1 for d in target if d == -1) > 1 or any((not isinstance(d, int)) or d == 0 or d < -1 for d in target):
        raise _Fail(f"shape {target} must hold positive integers and at most one -1")
    total, known = math.prod(x), math.prod(d for d in target if d != -1)
    if -1 in target:
        if total % known:
            raise _Fail(f"cannot reshape {list(x)} into {target}")
        target[target.index(-1)] = total // known
    if math.prod(target) != total:
        raise _Fail(f"cannot reshape {list(x)} ({total} elements) into {target}")
    return tuple(target)


def _embedding(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    _expect_rank(x, (1,), "token ids L")
    _positive(a["vocab"], "vocab")
    if a["positions"] and x[0] > a["positions"]:
        raise _Fail(f"sequence length {x[0]} exceeds positions={a['positions']}")
    return (x[0], _positive(a["dim"], "dim"))


def _recurrent(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    _expect_rank(x, (2,), "L, features")
    _positive(a["layers"], "layers")
    return (x[0], _positive(a["hidden"], "hidden") * (2 if a["bidirectional"] else 1))


def _attention(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    _expect_rank(x, (2,), "L, D")
    heads = _positive(a["heads"], "heads")
    kv = _positive(a["kv_heads"] or heads, "kv_heads")
    if x[1] % heads:
        raise _Fail(f"hidden size {x[1]} is not divisible by heads={heads}")
    if heads % kv:
        raise _Fail(f"heads={heads} is not divisible by kv_heads={kv}")
    return x


def _mla(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    _expect_rank(x, (2,), "L, D")
    _positive(a["heads"], "heads")
    _positive(a["q_lora"], "q_lora", allow_zero=True)
    for key in ("kv_lora", "qk_nope_dim", "qk_rope_dim", "v_head_dim"):
        _positive(a[key], key)
    if a["qk_rope_dim"] % 2:
        raise _Fail(f"qk_rope_dim must be even (rotary pairs), got {a['qk_rope_dim']}")
    return x


def _glu(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    if len(x) == 0 or x[-1] % 2:
        raise _Fail(f"needs an even last dimension (gate and value halves), got shape {list(x)}")
    return x[:-1] + (x[-1] // 2,)


_MOE_ACTIVATIONS = {"swiglu": 3, "geglu": 3, "gelu": 2, "relu": 2}
"""Weight matrices of one expert MLP: gated units have gate, up and down (Shazeer 2020), others up and down."""


def _moe(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    _expect_rank(x, (2,), "L, D")
    experts, k = _positive(a["experts"], "experts"), _positive(a["top_k"], "top_k")
    _positive(a["ffn_hidden"], "ffn_hidden")
    _positive(a["shared_experts"], "shared_experts", allow_zero=True)
    if a["shared_ffn_hidden"] is not None:
        _positive(a["shared_ffn_hidden"], "shared_ffn_hidden")
    if k > experts:
        raise _Fail(f"top_k={k} exceeds experts={experts}")
    if a["activation"] not in _MOE_ACTIVATIONS:
        raise _Fail(f"activation must be one of {', '.join(_MOE_ACTIVATIONS)}, got {a['activation']!r}")
    cap = a["capacity_factor"]
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap <= experts):
        raise _Fail(f"capacity_factor must be a number in (0, experts] or null (dropless), got {cap!r}")
    if not 1 <= a["imbalance"] <= experts:
        raise _Fail(f"imbalance (busiest expert rank's load / mean) must be in [1, experts], got {a['imbalance']!r}")
    return x


def _expert_params(a: dict, d: int, f: int) -> int:
    """One expert MLP of width f: 3·d·f weights gated (2·d·f otherwise), biases f per up matrix and d."""
    mats = _MOE_ACTIVATIONS[a["activation"]]
    return mats * d * f + (((mats - 1) * f + d) if a["bias"] else 0)


def _moe_params(a: dict, ins: list[Shape], out: Shape, active: bool = False) -> int:
    """Router d·E, E routed experts (k of them when `active`), shared experts of width shared_ffn_hidden."""
    d = ins[0][-1]
    shared = a["shared_ffn_hidden"] or a["ffn_hidden"]
    routed = a["top_k"] if active else a["experts"]
    return d * a["experts"] + routed * _expert_params(a, d, a["ffn_hidden"]) + \
        a["shared_experts"] * _expert_params(a, d, shared)


def _moe_active(a: dict, ins: list[Shape], out: Shape) -> int:
    return _moe_params(a, ins, out, active=True)


def _loss(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    _expect_rank(x, (1, 2), "classes or L, vocab")
    return ()


def _conv_transpose2d(a: dict, ins: list[Shape]) -> Shape:
    """Transposed convolution (the gradient of a convolution with respect to its input; Dumoulin &
    Visin 2016, "A guide to convolution arithmetic", relationship 14):
    H' = (H - 1)·S - 2P + d(K - 1) + output_padding + 1."""
    x = _single(ins)
    cout = _conv_out_channels(a, x)
    g = transposed_geometry(a, x)
    return (cout, g["ho"], g["wo"])


def transposed_geometry(a: dict, in_shape: Shape) -> dict:
    """Kernel, stride, padding, dilation, output padding and output size of a transposed convolution."""
    kh, kw = _pair(a["kernel"], "kernel")
    sh, sw = _pair(1 if a.get("stride") is None else a["stride"], "stride")
    ph, pw = _pair(a.get("padding", 0), "padding")
    dh, dw = _pair(a.get("dilation", 1), "dilation")
    oh, ow = _pair(a.get("output_padding", 0), "output_padding")
    _check_window(kh, kw, sh, sw, dh, dw, {"padding": (ph, pw), "output_padding": (oh, ow)})
    _, h, w = in_shape
    ho = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oh + 1
    wo = (w - 1) * sw - 2 * pw + dw * (kw - 1) + ow + 1
    if ho < 1 or wo < 1:
        raise _Fail(f"transposed window {kh}x{kw} (stride {sh}, padding {ph}) gives an empty output from {h}x{w}")
    return {"kh": kh, "kw": kw, "sh": sh, "sw": sw, "ph": ph, "pw": pw, "dh": dh, "dw": dw, "ho": ho, "wo": wo}


def _groupnorm(a: dict, ins: list[Shape]) -> Shape:
    x = _single(ins)
    if len(x) < 1:
        raise _Fail("expects a per-sample input (C, ...), got a scalar")
    groups = _positive(a["groups"], "groups")
    if x[0] % groups:
        raise _Fail(f"groups={groups} must divide the {x[0]} channels")
    return x


def _matmul(a: dict, ins: list[Shape]) -> Shape:
    """Matrix product of two activations (..., m, k) x (..., k, n) with broadcast leading dimensions."""
    if len(ins) != 2:
        raise _Fail(f"takes two inputs, got {len(ins)}")
    x, y = ins
    if len(x) < 2 or len(y) < 2:
        raise _Fail(f"needs two inputs of at least 2 dimensions, got {list(x)} and {list(y)}")
    if x[-1] != y[-2]:
        raise _Fail(f"inner dimensions differ: {list(x)} x {list(y)}")
    return broadcast(x[:-2], y[:-2]) + (x[-2], y[-1])


def broadcast(x: Shape, y: Shape) -> Shape:
    """NumPy broadcasting of two shapes."""
    out = []
    for i in range(1, max(len(x), len(y)) + 1):
        a = x[-i] if i <= len(x) else 1
        b = y[-i] if i <= len(y) else 1
        if a != b and 1 not in (a, b):
            raise _Fail(f"shapes {list(x)} and {list(y)} do not broadcast")
        out.append(max(a, b))
    return tuple(reversed(out))


def _sdpa(a: dict, ins: list[Shape]) -> Shape:
    """softmax(Q·Kᵀ/√d)·V over (..., L, d), (..., S, d), (..., S, d_v): output (..., L, d_v)."""
    if len(ins) != 3:
        raise _Fail(f"takes three inputs (query, key, value), got {len(ins)}")
    q, k, v = ins
    if min(len(q), len(k), len(v)) < 2:
        raise _Fail(f"query, key and value need at least 2 dimensions, got {[list(s) for s in ins]}")
    if q[-1] != k[-1] or k[-2] != v[-2]:
        raise _Fail(f"query/key widths or key/value lengths differ: {[list(s) for s in ins]}")
    return broadcast(q[:-2], broadcast(k[:-2], v[:-2])) + (q[-2], v[-1])


def _generic(a: dict, ins: list[Shape]) -> Shape:
    if not ins:
        raise _Fail("needs at least one input")
    shape = a["shape"]
    if not isinstance(shape, list) or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise _Fail(f"shape must be a list of non-negative integers, got {shape!r}")
    for key in ("flops", "bytes", "grad_flops", "grad_bytes", "wgrad_flops", "wgrad_bytes"):
        if a[key] < 0:
            raise _Fail(f"{key} must not be negative, got {a[key]!r}")
    return tuple(shape)


# --- parameter counts --------------------------------------------------------------------

def _no_params(a: dict, ins: list[Shape], out: Shape) -> int:
    return 0


def _conv2d_params(a: dict, ins: list[Shape], out: Shape) -> int:
    kh, kw = _pair(a["kernel"], "kernel")
    cin, cout = ins[0][0], a["out_channels"]
    return cout * (cin // a["groups"]) * kh * kw + (cout if a["bias"] else 0)


def _linear_params(a: dict, ins: list[Shape], out: Shape) -> int:
    weight = 0 if a["tied_to"] else ins[0][-1] * a["out_features"]
    return weight + (a["out_features"] if a["bias"] else 0)


def _norm_params(a: dict, ins: list[Shape], out: Shape) -> int:
    channels = ins[0][0] if a.get("_channel_first") else ins[0][-1]
    return 2 * channels if a["affine"] else 0


def _mla_params(a: dict, ins: list[Shape], out: Shape) -> int:
    """Multi-head latent attention (DeepSeek-V2 §2.1): Q down D·q_lora, its RMSNorm q_lora, Q up
    q_lora·H·(nope + rope) (D·H·(nope + rope) without Q compression); KV down D·(kv_lora + rope), its
    RMSNorm kv_lora, KV up kv_lora·H·(nope + v); output H·v·D. No biases."""
    d, h, q = ins[0][-1], a["heads"], a["q_lora"]
    qk, v = a["qk_nope_dim"] + a["qk_rope_dim"], a["v_head_dim"]
    query = d * q + q + q * h * qk if q else d * h * qk
    return query + d * (a["kv_lora"] + a["qk_rope_dim"]) + a["kv_lora"] + a["kv_lora"] * h * (a["qk_nope_dim"] + v) \
        + h * v * d


def _rmsnorm_params(a: dict, ins: list[Shape], out: Shape) -> int:
    return ins[0][-1] if a["affine"] else 0


def _bn_params(a: dict, ins: list[Shape], out: Shape) -> int:
    return 2 * ins[0][0] if a["affine"] else 0


def _embedding_params(a: dict, ins: list[Shape], out: Shape) -> int:
    return (a["vocab"] + a["positions"] + a["token_types"]) * a["dim"]


def recurrent_gates(kind: str) -> int:
    """Gate GEMMs per time step: LSTM 4 (i, f, g, o), GRU 3 (r, z, n), Elman RNN 1."""
    return {"lstm": 4, "gru": 3, "rnn": 1}[kind]


def _recurrent_params(kind: str) -> Callable[[dict, list[Shape], Shape], int]:
    def count(a: dict, ins: list[Shape], out: Shape) -> int:
        """PyTorch convention: per layer and direction g*(F*h + h*h) weights and 2*g*h biases."""
        g, h, dirs = recurrent_gates(kind), a["hidden"], 2 if a["bidirectional"] else 1
        total, feat = 0, ins[0][-1]
        for _ in range(a["layers"]):
            total += dirs * (g * (feat * h + h * h) + (2 * g * h if a["bias"] else 0))
            feat = h * dirs
        return total
    return count


def _attention_params(a: dict, ins: list[Shape], out: Shape) -> int:
    """Q and output projections D x D, K and V projections D x (kv_heads * head_dim), with biases."""
    d, heads = ins[0][-1], a["heads"]
    kv_dim = d // heads * (a["kv_heads"] or heads)
    weights = 2 * d * d + 2 * d * kv_dim
    return weights + ((2 * d + 2 * kv_dim) if a["bias"] else 0)


def _conv_transpose2d_params(a: dict, ins: list[Shape], out: Shape) -> int:
    """Weight (C_in, C_out/g, K_y, K_x) and C_out biases, as PyTorch's ConvTranspose2d holds them."""
    kh, kw = _pair(a["kernel"], "kernel")
    return ins[0][0] * (a["out_channels"] // a["groups"]) * kh * kw + (a["out_channels"] if a["bias"] else 0)


def _groupnorm_params(a: dict, ins: list[Shape], out: Shape) -> int:
    return 2 * ins[0][0] if a["affine"] else 0


def _generic_params(a: dict, ins: list[Shape], out: Shape) -> int:
    return _positive(a["params"], "params", allow_zero=True)


GELU_FORMS = ("tanh", "none")
MEMORY_FORMATS = ("contiguous", "channels_last")
"""How a convolution's input is stored: NCHW (PyTorch's default) or NHWC (``torch.channels_last``, what a
network's permutes leave behind, ConvNeXt's among them); oneDNN runs different kernels for the two (a
depthwise 7×7 backward over 32 × 32 × 8 × 8: 751-774 against 2007 µs on the 2-core EPYC host, 2026-11-24;
`reports/archive/validation-torch-nets/kernel_form_probe.py`)."""


def table_op(layer_type: str, attrs: Mapping[str, Any]) -> str:
    """The name a layer's memory-bound kernel has in the measured tables: its type, except the exact GELU
    (``approximate: none``, x·Φ(x) through erf), ``gelu_erf``: a different kernel from the tanh form that
    ``gelu`` rows time (on the 2-core EPYC host, 2026-11-24, for 262,144 fp32 elements: forward 131 against
    441 µs, backward 239 against 505 µs; `reports/archive/validation-torch-nets/kernel_form_probe.py`)."""
    if layer_type == "gelu" and attrs.get("approximate", "tanh") == "none":
        return "gelu_erf"
    return layer_type


LOSS_KERNELS = ("single_pass", "megatron", "megatron_fused", "torch")
"""How a stack computes the softmax cross-entropy (strategy and stack key `loss_kernel`; the kernels and
their bytes in `dlsim.cost.loss`): single_pass (one kernel reading the logits in the training dtype each
way: a stack whose loss code is not named), megatron (Megatron-LM's vocab-parallel cross-entropy on an
fp32 copy of the logits, one kernel per operation), megatron_fused (Megatron-Core's
cross_entropy_loss_fusion under torch.compile), torch (``F.cross_entropy`` on fp32 logits: cast,
log_softmax, nll_loss)."""


@dataclass(frozen=True)
class OpType:
    """An operator type: attribute defaults, shape rule, parameter count, number of inputs."""

    name: str
    attrs: dict
    shape: Callable[[dict, list[Shape]], Shape]
    params: Callable[[dict, list[Shape], Shape], int] = _no_params
    doc: str = ""
    active: Callable[[dict, list[Shape], Shape], int] | None = None
    """Parameters one token uses (mixture of experts); None: all of `params`."""


_WINDOW = {"kernel": REQUIRED, "stride": None, "padding": 0, "dilation": 1, "ceil_mode": False}

OPS: dict[str, OpType] = {op.name: op for op in [
    OpType("conv2d", {"out_channels": REQUIRED, "kernel": REQUIRED, "stride": 1, "padding": 0,
                      "dilation": 1, "groups": 1, "bias": True, "method": "auto", "memory_format": "contiguous"},
           _conv2d, _conv2d_params, "2-D convolution (cross-correlation), NCHW shapes; memory_format channels_last "
                                    "when its input is stored NHWC (a different kernel)"),
    OpType("linear", {"out_features": REQUIRED, "bias": True, "tied_to": None}, _linear, _linear_params,
           "fully connected layer over the last dimension"),
    OpType("maxpool", dict(_WINDOW), _pool, doc="max pooling"),
    OpType("avgpool", dict(_WINDOW), _pool, doc="average pooling"),
    OpType("global_avgpool", {}, _global_pool, doc="average over H and W, output (C,)"),
    OpType("global_maxpool", {}, _global_pool, doc="max over H and W, output (C,)"),
    OpType("batchnorm", {"affine": True, "eps": 1e-5}, _batchnorm, _bn_params, "batch normalisation"),
    OpType("layernorm", {"affine": True, "eps": 1e-5}, _same, _norm_params, "layer normalisation over the last dimension"),
    OpType("rmsnorm", {"affine": True, "eps": 1e-5}, _same, _rmsnorm_params,
           "RMS normalisation over the last dimension (Zhang & Sennrich 2019), scale only"),
    OpType("lrn", {"size": 5, "alpha": 1e-4, "beta": 0.75, "k": 2.0}, _lrn, doc="local response normalisation across channels"),
    OpType("relu", {}, _same, doc="max(0, x)"),
    OpType("gelu", {"approximate": "tanh"}, _same,
           doc="Gaussian error linear unit: approximate tanh (Hendrycks & Gimpel 2016, eq. 2) or none (x·Φ(x), erf)"),
    OpType("tanh", {}, _same, doc="hyperbolic tangent"),
    OpType("sigmoid", {}, _same, doc="logistic function"),
    OpType("softmax", {}, _same, doc="softmax over the last dimension"),
    OpType("swiglu", {}, _glu, doc="silu(a) * b of the two halves of the last dimension (Shazeer 2020)"),
    OpType("geglu", {}, _glu, doc="gelu(a) * b of the two halves of the last dimension (Shazeer 2020)"),
    OpType("dropout", {"p": 0.5}, _same, doc="dropout with keep-mask"),
    OpType("add", {}, _add, doc="element-wise sum of two or more tensors (residual)"),
    OpType("concat", {"axis": 0}, _concat, doc="concatenation along a per-sample axis (0 = channels)"),
    OpType("flatten", {}, _flatten, doc="flatten to (features,)"),
    OpType("reshape", {"shape": REQUIRED}, _reshape, doc="reshape (one -1 allowed)"),
    OpType("embedding", {"vocab": REQUIRED, "dim": REQUIRED, "positions": 0, "token_types": 0},
           _embedding, _embedding_params, "token (+ learned position / token-type) embedding lookup"),
    OpType("lstm", {"hidden": REQUIRED, "layers": 1, "bias": True, "bidirectional": False},
           _recurrent, _recurrent_params("lstm"), "LSTM over the sequence"),
    OpType("gru", {"hidden": REQUIRED, "layers": 1, "bias": True, "bidirectional": False},
           _recurrent, _recurrent_params("gru"), "GRU over the sequence"),
    OpType("rnn", {"hidden": REQUIRED, "layers": 1, "bias": True, "bidirectional": False},
           _recurrent, _recurrent_params("rnn"), "Elman RNN (tanh) over the sequence"),
    OpType("attention", {"heads": REQUIRED, "kv_heads": None, "causal": False, "bias": True, "dropout": 0.0,
                         "rotary": False},
           _attention, _attention_params, "multi-head (grouped-query with kv_heads) self-attention with Q/K/V and "
                                          "output projections; rotary: rotary position embeddings on Q and K"),
    OpType("moe", {"experts": REQUIRED, "top_k": REQUIRED, "ffn_hidden": REQUIRED, "shared_experts": 0,
                   "shared_ffn_hidden": None, "activation": "swiglu", "bias": False, "capacity_factor": None,
                   "imbalance": 1.0, "aux_loss": True},
           _moe, _moe_params, "mixture of experts: router, top_k of `experts` MLPs (ffn_hidden wide) per token, "
                              "shared experts; capacity_factor (null: dropless), imbalance (busiest expert "
                              "rank's load / mean), aux_loss (load-balancing loss)", _moe_active),
    OpType("mla", {"heads": REQUIRED, "q_lora": 0, "kv_lora": REQUIRED, "qk_nope_dim": REQUIRED,
                   "qk_rope_dim": REQUIRED, "v_head_dim": REQUIRED, "causal": False},
           _mla, _mla_params, "multi-head latent attention (DeepSeek-V2): low-rank compressed Q (q_lora, 0: none) "
                              "and KV (kv_lora), decoupled rotary keys of qk_rope_dim, heads of qk_nope_dim + "
                              "qk_rope_dim (scores) and v_head_dim (values)"),
    OpType("cross_entropy", {}, _loss, doc="softmax cross-entropy loss against integer labels"),
    OpType("relu6", {}, _same, doc="min(max(0, x), 6) (MobileNetV2)"),
    OpType("silu", {}, _same, doc="x·sigmoid(x) (swish)"),
    OpType("conv_transpose2d", {"out_channels": REQUIRED, "kernel": REQUIRED, "stride": 1, "padding": 0,
                                "output_padding": 0, "dilation": 1, "groups": 1, "bias": True},
           _conv_transpose2d, _conv_transpose2d_params, "2-D transposed convolution (fractionally strided), NCHW"),
    OpType("groupnorm", {"groups": REQUIRED, "affine": True, "eps": 1e-5}, _groupnorm, _groupnorm_params,
           "group normalisation over (C/groups, ...) per sample (Wu & He 2018)"),
    OpType("matmul", {}, _matmul, doc="matrix product of two activations (..., m, k) x (..., k, n)"),
    OpType("sdpa", {"causal": False, "dropout": 0.0}, _sdpa,
           doc="scaled dot-product attention softmax(QKᵀ/√d)V of three activations, no projections"),
    OpType("generic", {"op": REQUIRED, "shape": REQUIRED, "params": 0, "flops": 0.0, "bytes": 0.0,
                       "grad_flops": 0.0, "grad_bytes": 0.0, "wgrad_flops": 0.0, "wgrad_bytes": 0.0},
           _generic, _generic_params,
           "an operator dlsim has no model for, priced by its measured FLOPs and bytes per sample: forward, "
           "input gradients (grad_*) and weight gradients (wgrad_*); op names the source operator"),
]}


def infer(op: OpType, attrs: dict, in_shapes: list[Shape], layer: str, where: object = None) -> tuple[Shape, int]:
    """Output shape and parameter count of a layer, or a ShapeError that names the layer."""
    try:
        out = op.shape(attrs, in_shapes)
        return out, op.params(attrs, in_shapes, out)
    except _Fail as exc:
        raise ShapeError(f"{op.name}: {exc}", path=where, field=f"layer {layer!r}") from None
