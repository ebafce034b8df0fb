"""Execute a dlsim `Model` as a PyTorch module, operator by operator.

`build_torch_model` turns every dlsim layer into one `torch.nn.Module` with the same attributes,
shapes and parameters (registered under the layer's name with dots written as "/"), and runs them
in the model's topological order: the output of each layer goes to the layers that name it as an
input, and is dropped after its last use, as a framework would. The result trains like any
PyTorch model: ``loss = net(x, target); loss.backward()``, with `example_batch` giving float images
or int64 token ids and integer labels. Forward hooks on `net.layers[...]` see exactly the layers
dlsim prices, so the same module serves to validate per-layer and per-iteration timings.

Operators map onto PyTorch as their dlsim definitions say (`dlsim.spec.ops`): conv2d with
dlsim's explicit padding (``"same"`` resolved to ⌊d(K−1)/2⌋ as dlsim does); attention as a fused
Q/K/V projection, explicit QKᵀ and AV batched matmuls (the math path dlsim's cost model prices,
and the one `FlopCounterMode` counts), optionally PyTorch's fused
`scaled_dot_product_attention` instead (``attention="sdpa"``); embedding as a token table plus
learned position and token-type tables added together; a linear layer with ``tied_to`` shares
the weight of that embedding's token table (or that linear layer); LSTM/GRU/RNN as `nn.LSTM`
etc. with ``batch_first``; the loss as softmax cross-entropy over the last dimension.

torch is imported inside the functions only: importing this module never needs it.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace
from typing import Any

from dlsim.errors import SpecError
from dlsim.spec.model import INPUT, Layer, Model
from dlsim.spec.ops import conv_geometry

TORCH_DTYPES = {"fp64": "float64", "fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def module_key(layer_name: str) -> str:
    """The key of a layer's module in `net.layers` (PyTorch forbids dots in module names)."""
    return layer_name.replace(".", "/")


def torch_dtype(dtype: Any) -> Any:
    """A `torch.dtype` from a dlsim data-type name (fp32, tf32, fp16, bf16, fp64) or a torch dtype."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in TORCH_DTYPES:
        raise SpecError(f"no PyTorch floating type for dtype {dtype!r} (use {', '.join(TORCH_DTYPES)})", field="dtype")
    return getattr(torch, TORCH_DTYPES[dtype])


@lru_cache(maxsize=1)
def _classes() -> SimpleNamespace:
    """The module classes, defined once torch is imported."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Add(nn.Module):
        def forward(self, *xs: Any) -> Any:
            out = xs[0]
            for x in xs[1:]:
                out = out + x
            return out

    class Concat(nn.Module):
        def __init__(self, axis: int):
            super().__init__()
            self.dim = axis + 1 if axis >= 0 else axis  # dlsim axes are per sample

        def forward(self, *xs: Any) -> Any:
            return torch.cat(xs, self.dim)

    class Reshape(nn.Module):
        def __init__(self, shape: list[int]):
            super().__init__()
            self.shape = tuple(shape)

        def forward(self, x: Any) -> Any:
            return x.reshape(x.shape[0], *self.shape)

    class GlobalPool(nn.Module):
        def __init__(self, kind: str):
            super().__init__()
            self.kind = kind

        def forward(self, x: Any) -> Any:
            return x.mean((2, 3)) if self.kind == "avg" else x.amax((2, 3))

    class Embedding(nn.Module):
        """Token table (+ learned position table indexed 0..L−1, + token-type table at type 0), summed."""

        def __init__(self, vocab: int, dim: int, positions: int, token_types: int):
            super().__init__()
            self.tokens = nn.Embedding(vocab, dim)
            self.positions = nn.Embedding(positions, dim) if positions else None
            self.token_types = nn.Embedding(token_types, dim) if token_types else None

        def forward(self, ids: Any) -> Any:
            y = self.tokens(ids)
            if self.positions is not None:
                y = y + self.positions(torch.arange(ids.shape[1], device=ids.device))
            if self.token_types is not None:
                y = y + self.token_types(torch.zeros_like(ids))
            return y

    class Recurrent(nn.Module):
        def __init__(self, kind: str, features: int, hidden: int, layers: int, bias: bool, bidirectional: bool):
            super().__init__()
            cls = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[kind]
            self.rnn = cls(features, hidden, layers, bias=bias, batch_first=True, bidirectional=bidirectional)

        def forward(self, x: Any) -> Any:
            return self.rnn(x)[0]

    class Attention(nn.Module):
        """Multi-head (grouped-query when kv_heads < heads) self-attention, dlsim's `attention` operator."""

        def __init__(self, dim: int, heads: int, kv_heads: int, causal: bool, bias: bool, dropout: float, fused: bool,
                     rotary: bool = False):
            super().__init__()
            self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
            self.causal, self.p, self.fused, self.rotary = causal, dropout, fused, rotary
            self.qkv = nn.Linear(dim, dim + 2 * kv_heads * self.head_dim, bias=bias)
            self.out = nn.Linear(dim, dim, bias=bias)

        def forward(self, x: Any) -> Any:
            n, steps, dim = x.shape
            kv = self.kv_heads * self.head_dim
            q, k, v = self.qkv(x).split([dim, kv, kv], dim=-1)
            q = q.reshape(n, steps, self.heads, self.head_dim).transpose(1, 2)
            k = k.reshape(n, steps, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.reshape(n, steps, self.kv_heads, self.head_dim).transpose(1, 2)
            if self.rotary:  # rotary position embeddings (Su et al. 2021), rotate-half form
                q, k = self._rope(q), self._rope(k)
            if self.kv_heads != self.heads:
                k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
                v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
            p = self.p if self.training else 0.0
            if self.fused:
                ctx = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=self.causal)
            else:
                scores = torch.matmul(q, k.transpose(-2, -1)) * self.head_dim ** -0.5
                if self.causal:
                    future = torch.ones(steps, steps, dtype=torch.bool, device=x.device).triu(1)
                    scores = scores.masked_fill(future, float("-inf"))
                ctx = torch.matmul(F.dropout(torch.softmax(scores, dim=-1), p, self.training), v)
            return self.out(ctx.transpose(1, 2).reshape(n, steps, dim))

        def _rope(self, x: Any) -> Any:
            return rotary(x)

    def rotary(x: Any) -> Any:
        """Rotary position embeddings (Su et al. 2021) over the last dimension, rotate-half form."""
        steps, half = x.shape[-2], x.shape[-1] // 2
        inv = 10000.0 ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
        angle = torch.arange(steps, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = torch.cat([angle.cos()] * 2, -1).to(x.dtype), torch.cat([angle.sin()] * 2, -1).to(x.dtype)
        x1, x2 = x[..., :half], x[..., half:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    class LatentAttention(nn.Module):
        """dlsim's `mla`: multi-head latent attention (DeepSeek-V2), projections unabsorbed, math path."""

        def __init__(self, dim: int, heads: int, q_lora: int, kv_lora: int, nope: int, rope: int, v: int,
                     causal: bool):
            super().__init__()
            self.heads, self.nope, self.rope, self.v, self.kv_lora, self.causal = heads, nope, rope, v, kv_lora, causal
            self.q_down = nn.Sequential(nn.Linear(dim, q_lora, bias=False), nn.RMSNorm(q_lora)) if q_lora else None
            self.q_up = nn.Linear(q_lora or dim, heads * (nope + rope), bias=False)
            self.kv_down = nn.Linear(dim, kv_lora + rope, bias=False)
            self.kv_norm = nn.RMSNorm(kv_lora)
            self.kv_up = nn.Linear(kv_lora, heads * (nope + v), bias=False)
            self.out = nn.Linear(heads * v, dim, bias=False)

        def forward(self, x: Any) -> Any:
            n, steps, _ = x.shape
            h = self.heads
            q = self.q_up(self.q_down(x) if self.q_down is not None else x)
            q_nope, q_rope = q.reshape(n, steps, h, -1).transpose(1, 2).split([self.nope, self.rope], dim=-1)
            latent, k_rope = self.kv_down(x).split([self.kv_lora, self.rope], dim=-1)
            kv = self.kv_up(self.kv_norm(latent)).reshape(n, steps, h, -1).transpose(1, 2)
            k_nope, v = kv.split([self.nope, self.v], dim=-1)
            k_rope = rotary(k_rope[:, None]).expand(n, h, steps, self.rope)
            q = torch.cat([q_nope, rotary(q_rope)], dim=-1)
            k = torch.cat([k_nope, k_rope], dim=-1)
            scores = torch.matmul(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5
            if self.causal:
                future = torch.ones(steps, steps, dtype=torch.bool, device=x.device).triu(1)
                scores = scores.masked_fill(future, float("-inf"))
            ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
            return self.out(ctx.transpose(1, 2).reshape(n, steps, h * self.v))

    class GatedUnit(nn.Module):
        """silu(a)·b (SwiGLU) or gelu(a)·b (GeGLU) of the two halves of the last dimension."""

        def __init__(self, kind: str):
            super().__init__()
            self.act = F.silu if kind == "swiglu" else (lambda t: F.gelu(t, approximate="tanh"))

        def forward(self, x: Any) -> Any:
            a, b = x.chunk(2, dim=-1)
            return self.act(a) * b

    class MixtureOfExperts(nn.Module):
        """dlsim's `moe`: a router, top-k softmax gates, `experts` MLPs each run on the tokens routed to
        it (a token copy per choice, sorted by expert, up to the capacity), outputs scaled by their gates
        and summed back per token, plus `shared` MLPs on every token. On meta tensors (no values) the
        routing is taken as balanced: R·k/E tokens per expert."""

        def __init__(self, dim: int, experts: int, top_k: int, ffn: int, shared: int, shared_ffn: int,
                     activation: str, bias: bool, capacity_factor: float | None):
            super().__init__()
            self.experts, self.top_k, self.capacity_factor = experts, top_k, capacity_factor
            gated = activation in ("swiglu", "geglu")
            up = 2 * ffn if gated else ffn
            self.router = nn.Linear(dim, experts, bias=False)
            self.up = nn.ParameterList([nn.Parameter(torch.empty(dim, up)) for _ in range(experts)])
            self.down = nn.ParameterList([nn.Parameter(torch.empty(ffn, dim)) for _ in range(experts)])
            self.up_bias = nn.ParameterList([nn.Parameter(torch.zeros(up)) for _ in range(experts)]) if bias else None
            self.down_bias = nn.ParameterList([nn.Parameter(torch.zeros(dim)) for _ in range(experts)]) if bias else None
            for w in list(self.up) + list(self.down):
                nn.init.normal_(w, std=0.02)
            self.act = GatedUnit(activation) if gated else (nn.ReLU() if activation == "relu" else
                                                            nn.GELU(approximate="tanh"))
            self.shared = nn.Sequential(nn.Linear(dim, (2 if gated else 1) * shared * shared_ffn, bias=bias), self.act,
                                        nn.Linear(shared * shared_ffn, dim, bias=bias)) if shared else None

        def forward(self, x: Any) -> Any:
            shape = x.shape
            flat = x.reshape(-1, shape[-1])
            rows, k, e = flat.shape[0], self.top_k, self.experts
            gates, idx = torch.topk(torch.softmax(self.router(flat).float(), dim=-1), k, dim=-1)
            order = idx.reshape(-1).argsort(stable=True)
            tokens = order // k
            routed = flat[tokens]
            if flat.is_meta:
                counts = [rows * k // e] * e
            else:
                counts = torch.bincount(idx.reshape(-1), minlength=e).tolist()
            cap = int(self.capacity_factor * rows * k / e) if self.capacity_factor is not None else None
            out = torch.zeros_like(routed)
            start = 0
            for j, count in enumerate(counts):
                keep = count if cap is None else min(count, cap)
                if keep:
                    h = routed[start:start + keep] @ self.up[j]
                    if self.up_bias is not None:
                        h = h + self.up_bias[j]
                    h = self.act(h) @ self.down[j]
                    if self.down_bias is not None:
                        h = h + self.down_bias[j]
                    out[start:start + keep] = h
                start += count
            weights = gates.reshape(-1)[order].to(out.dtype)
            y = torch.zeros_like(flat).index_add(0, tokens, out * weights[:, None])
            if self.shared is not None:
                y = y + self.shared(flat)
            return y.reshape(shape)

    class MatMul(nn.Module):
        def forward(self, a: Any, b: Any) -> Any:
            return torch.matmul(a, b)

    class Sdpa(nn.Module):
        def __init__(self, causal: bool, dropout: float):
            super().__init__()
            self.causal, self.p = causal, dropout

        def forward(self, q: Any, k: Any, v: Any) -> Any:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0,
                                                  is_causal=self.causal)

    class CrossEntropy(nn.Module):
        def forward(self, logits: Any, target: Any) -> Any:
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    class Net(nn.Module):
        """Runs the layer modules in topological order; `forward(x, target)` returns the last layer's output."""

        def __init__(self, model: Model, modules: dict[str, Any]):
            super().__init__()
            self.dlsim_model = model
            self.layers = nn.ModuleDict({module_key(layer.name): modules[layer.name] for layer in model.layers})
            last_use: dict[str, int] = {}
            for i, layer in enumerate(model.layers):
                for src in layer.inputs:
                    last_use[src] = i
            self._plan = [(layer.name, module_key(layer.name), layer.inputs, layer.type == "cross_entropy",
                           [s for s, j in last_use.items() if j == i]) for i, layer in enumerate(model.layers)]

        def forward(self, x: Any, target: Any = None) -> Any:
            values = {INPUT: x}
            out = x
            for name, key, inputs, is_loss, done in self._plan:
                args = [values[s] for s in inputs]
                if is_loss:
                    if target is None:
                        raise ValueError(f"layer {name!r} is a loss: call the module with (input, target)")
                    args.append(target)
                out = self.layers[key](*args)
                values[name] = out
                for src in done:
                    del values[src]
            return out

    return SimpleNamespace(Add=Add, Concat=Concat, Reshape=Reshape, GlobalPool=GlobalPool, Embedding=Embedding,
                           Recurrent=Recurrent, Attention=Attention, GatedUnit=GatedUnit, CrossEntropy=CrossEntropy,
                           MatMul=MatMul, Sdpa=Sdpa,
                           MixtureOfExperts=MixtureOfExperts, LatentAttention=LatentAttention, Net=Net)


def _fail(layer: Layer, reason: str) -> SpecError:
    return SpecError(reason, field=f"layer {layer.name!r}")


def _window(layer: Layer) -> dict:
    g = conv_geometry(dict(layer.attrs), layer.in_shapes[0])
    g["kernel"], g["stride"] = (g["kh"], g["kw"]), (g["sh"], g["sw"])
    g["padding"], g["dilation"] = (g["ph"], g["pw"]), (g["dh"], g["dw"])
    return g


def _layer_module(layer: Layer, attention: str) -> Any:
    """The PyTorch module computing one dlsim layer."""
    import torch.nn as nn

    c, a, t = _classes(), layer.attrs, layer.type
    x = layer.in_shapes[0]
    if t == "conv2d":
        g = _window(layer)
        conv = nn.Conv2d(x[0], a["out_channels"], g["kernel"], g["stride"], g["padding"], g["dilation"],
                         a["groups"], bias=a["bias"])
        if a.get("memory_format") == "channels_last":  # a channels-last weight runs oneDNN's NHWC kernels
            import torch
            conv = conv.to(memory_format=torch.channels_last)
        return conv
    if t == "linear":
        return nn.Linear(x[-1], a["out_features"], bias=a["bias"])
    if t in ("maxpool", "avgpool"):
        g = _window(layer)
        if g["ph"] > g["kh"] // 2 or g["pw"] > g["kw"] // 2:
            raise _fail(layer, f"PyTorch pooling needs padding <= kernel/2, got padding {g['padding']}")
        if t == "maxpool":
            return nn.MaxPool2d(g["kernel"], g["stride"], g["padding"], g["dilation"], ceil_mode=bool(a["ceil_mode"]))
        if g["dilation"] != (1, 1):
            raise _fail(layer, "PyTorch average pooling has no dilation")
        return nn.AvgPool2d(g["kernel"], g["stride"], g["padding"], ceil_mode=bool(a["ceil_mode"]))
    if t in ("global_avgpool", "global_maxpool"):
        return c.GlobalPool("avg" if t == "global_avgpool" else "max")
    if t == "batchnorm":
        cls = nn.BatchNorm2d if len(x) == 3 else nn.BatchNorm1d
        return cls(x[0], eps=a["eps"], affine=a["affine"])
    if t == "layernorm":
        return nn.LayerNorm(x[-1], eps=a["eps"], elementwise_affine=a["affine"])
    if t == "rmsnorm":
        return nn.RMSNorm(x[-1], eps=a["eps"], elementwise_affine=a["affine"])
    if t in ("swiglu", "geglu"):
        return c.GatedUnit(t)
    if t == "lrn":
        return nn.LocalResponseNorm(a["size"], alpha=a["alpha"], beta=a["beta"], k=a["k"])
    simple = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "add": c.Add, "flatten": lambda: nn.Flatten(1),
              "gelu": lambda: nn.GELU(approximate=a.get("approximate", "tanh")), "softmax": lambda: nn.Softmax(dim=-1),
              "cross_entropy": c.CrossEntropy, "relu6": nn.ReLU6, "silu": nn.SiLU, "matmul": c.MatMul}
    if t in simple:
        return simple[t]()
    if t == "dropout":
        return nn.Dropout(a["p"])
    if t == "conv_transpose2d":
        return nn.ConvTranspose2d(x[0], a["out_channels"], a["kernel"], a["stride"], a["padding"], a["output_padding"],
                                  a["groups"], bias=a["bias"], dilation=a["dilation"])
    if t == "groupnorm":
        return nn.GroupNorm(a["groups"], x[0], eps=a["eps"], affine=a["affine"])
    if t == "sdpa":
        return c.Sdpa(bool(a["causal"]), float(a["dropout"]))
    if t == "generic":
        raise _fail(layer, f"a generic operator ({a['op']}) has no PyTorch rebuild; time the source module instead")
    if t == "concat":
        return c.Concat(a["axis"])
    if t == "reshape":
        return c.Reshape(list(a["shape"]))
    if t == "embedding":
        return c.Embedding(a["vocab"], a["dim"], a["positions"], a["token_types"])
    if t in ("lstm", "gru", "rnn"):
        return c.Recurrent(t, x[-1], a["hidden"], a["layers"], a["bias"], a["bidirectional"])
    if t == "attention":
        if attention not in ("math", "sdpa"):
            raise SpecError(f"attention must be 'math' or 'sdpa', got {attention!r}", field="attention")
        return c.Attention(x[-1], a["heads"], a["kv_heads"] or a["heads"], a["causal"], a["bias"], a["dropout"],
                           fused=attention == "sdpa", rotary=bool(a["rotary"]))
    if t == "mla":
        return c.LatentAttention(x[-1], a["heads"], a["q_lora"], a["kv_lora"], a["qk_nope_dim"], a["qk_rope_dim"],
                                 a["v_head_dim"], a["causal"])
    if t == "moe":
        return c.MixtureOfExperts(x[-1], a["experts"], a["top_k"], a["ffn_hidden"], a["shared_experts"],
                                  a["shared_ffn_hidden"] or a["ffn_hidden"], a["activation"], a["bias"],
                                  a["capacity_factor"])
    raise _fail(layer, f"no PyTorch operator for layer type {t!r}")


def _tie(model: Model, modules: dict[str, Any]) -> None:
    """Share the weight of every ``tied_to`` linear layer with its source (an embedding's token table)."""
    c = _classes()
    for layer in model.layers:
        source = layer.attrs.get("tied_to") if layer.type == "linear" else None
        if not source:
            continue
        src = modules[source]
        weight = src.tokens.weight if isinstance(src, c.Embedding) else getattr(src, "weight", None)
        own = modules[layer.name].weight
        if weight is None or tuple(weight.shape) != tuple(own.shape):
            have = list(weight.shape) if weight is not None else "no weight"
            raise _fail(layer, f"tied_to {source!r} has {have}, this layer needs a weight of {list(own.shape)}")
        modules[layer.name].weight = weight


def build_torch_model(model: Model, *, device: Any = None, dtype: Any = None, attention: str = "math") -> Any:
    """A `torch.nn.Module` executing `model` layer by layer (see the module docstring).

    `device` may be ``"meta"``: parameters and activations then have shapes but no storage, which
    is how whole-size models are checked (parameter counts, shapes, FLOPs) without memory.
    `dtype` is a dlsim name or a torch dtype (default float32); `attention` is ``"math"``
    (explicit matmuls, as dlsim prices it) or ``"sdpa"`` (PyTorch's fused kernel).
    """
    import torch

    with torch.device(device) if device is not None else nullcontext():
        modules = {layer.name: _layer_module(layer, attention) for layer in model.layers}
        _tie(model, modules)
        net = _classes().Net(model, modules)
    if dtype is not None:
        net = net.to(dtype=torch_dtype(dtype))
    return net


def example_batch(model: Model, batch: int, *, device: Any = None, dtype: Any = None, seed: int = 0) -> tuple[Any, Any]:
    """An input batch and labels for `model`: float N(0,1) images/features (in `dtype`) or int64 token
    ids below the smallest vocabulary reading the input; int64 labels for the cross-entropy layer
    (shape (N,) or (N, L)), or None when the model has no loss."""
    import torch

    meta = device is not None and torch.device(device).type == "meta"
    gen = torch.Generator().manual_seed(seed)

    def ints(high: int, shape: tuple[int, ...]) -> Any:
        if meta:
            return torch.empty(shape, dtype=torch.int64, device="meta")
        return torch.randint(0, high, shape, generator=gen).to(device)

    shape = (batch, *model.input_shape)
    if model.input_kind == "tokens":
        vocabs = [layer.attrs["vocab"] for layer in model.layers if layer.type == "embedding" and INPUT in layer.inputs]
        x = ints(min(vocabs, default=2), shape)
    elif meta:
        x = torch.empty(shape, dtype=torch_dtype(dtype or "fp32"), device="meta")
    else:
        x = torch.randn(shape, generator=gen).to(device=device, dtype=torch_dtype(dtype or "fp32"))
    losses = [layer for layer in model.layers if layer.type == "cross_entropy"]
    if len(losses) > 1:
        raise SpecError(f"{len(losses)} cross-entropy layers: one label tensor cannot feed them all", path=model.source)
    if not losses:
        return x, None
    logits = losses[0].in_shapes[0]
    return x, ints(logits[-1], (batch, *logits[:-1]))


@dataclass(frozen=True)
class MetaTrace:
    """What one forward pass of the built module on meta tensors shows: the FLOPs `FlopCounterMode`
    counts (matmul-class operators only, a multiply-accumulate = 2) and each layer's output shape."""

    flops: int
    shapes: dict[str, tuple[int, ...]]

    def mismatches(self, model: Model, batch: int) -> list[str]:
        """Layers whose PyTorch output shape differs from dlsim's (batch + per-sample shape)."""
        wrong = []
        for layer in model.layers:
            want = () if layer.type == "cross_entropy" else (batch, *layer.out_shape)
            if self.shapes.get(layer.name) != want:
                wrong.append(f"{layer.name}: torch {list(self.shapes.get(layer.name, ()))}, dlsim {list(want)}")
        return wrong


def trace_on_meta(model: Model, batch: int = 2, attention: str = "math") -> MetaTrace:
    """Run the built module once on meta tensors (shapes only: no memory, no arithmetic, whatever the
    model's size) under `FlopCounterMode`, recording every layer's output shape with forward hooks."""
    from torch.utils.flop_counter import FlopCounterMode

    net = build_torch_model(model, device="meta", attention=attention)
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in model.layers:
        def record(_mod: Any, _inp: Any, out: Any, name: str = layer.name) -> None:
            shapes[name] = tuple(out.shape)
        net.layers[module_key(layer.name)].register_forward_hook(record)
    x, target = example_batch(model, batch, device="meta")
    with FlopCounterMode(display=False) as counter:
        net(x, target)
    return MetaTrace(int(counter.get_total_flops()), shapes)
