"""PyTorch callables for the kernels a calibration times: GEMMs, convolution passes, memory-bound layers.

Each builder returns a zero-argument function that runs exactly one kernel (or one operator's
forward or backward) on tensors allocated once, so timing it measures the kernel, its dispatch and
its output allocation, as a framework pays them in a training step:

* GEMM: ``torch.mm`` (``torch.bmm`` for a batched GEMM) of contiguous A[m×k]·B[k×n]; in fp8 the scaled
  FP8 product `dlsim.calibrate.cuda_calls.fp8_matmul` (single GEMMs only).
* Convolution: forward ``F.conv2d``; backward-data and backward-filter are
  ``aten.convolution_backward`` with output mask (∇x only) and (∇w only), the calls autograd
  makes, under the algorithm choice (`conv_algorithm`) the library exposes.
* Memory-bound layers (`memory_op`): the functional form of the operator PyTorch runs for that
  dlsim layer type (the same ones `dlsim.validate.torch_model` builds its modules from): forward,
  and backward as ``torch.autograd.grad`` of the retained graph with respect to every float input
  and parameter, which is the operator's whole backward (for batch and layer norm it includes ∇γ
  and ∇β, which dlsim's cost model counts in the ∇x pass). A scaled dot-product attention is timed the
  same way, as ``F.scaled_dot_product_attention`` forward and its autograd backward; so are a transposed
  convolution (``F.conv_transpose2d``) and the recurrent layers (``torch._VF.lstm`` / ``gru`` / ``rnn_tanh``).
* Copy (`copy_fn`): ``dst.copy_(src)`` of one contiguous tensor into another of the same type, the
  device-to-device copy a framework runs for ``.contiguous()``, ``.clone()`` and concatenations.

torch is imported inside the functions only.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterator

from dlsim.cost.layers import Gemm, layer_cost
from dlsim.cost.lookup import CHANNELS_LAST
from dlsim.cost.conv_methods import ConvGeometry
from dlsim.errors import DlsimError
from dlsim.spec.model import Layer
from dlsim.spec.ops import conv_geometry, transposed_geometry

TORCH_DTYPES = {"fp64": "float64", "fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def seeded(device: Any, seed: int = 0) -> Any:
    """A random generator on `device`, seeded: operands are drawn where they are used (a GPU draws its own,
    without a host copy of gigabytes), the same values on every run of one device."""
    import torch
    return torch.Generator(device=device).manual_seed(seed)


def torch_dtype(dtype: str) -> Any:
    import torch
    if dtype not in TORCH_DTYPES:
        raise DlsimError(f"no PyTorch type for dtype {dtype!r} (use {', '.join(TORCH_DTYPES)})")
    return getattr(torch, TORCH_DTYPES[dtype])


@contextlib.contextmanager
def _quiet(flags: contextlib.AbstractContextManager) -> Iterator[None]:
    """`flags`, without the warning PyTorch's oneDNN flags emit about Intel-GPU TF32 on every use."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
        with flags:
            yield


def conv_algorithm(algorithm: str) -> contextlib.AbstractContextManager:
    """The context in which PyTorch runs convolutions with `algorithm` (see compute_plan.CONV_ALGORITHMS; a
    channels-last row's name carries `dlsim.cost.lookup.CHANNELS_LAST` after it)."""
    import torch
    algorithm = algorithm.removesuffix(CHANNELS_LAST)
    if algorithm == "mkldnn":
        return _quiet(torch.backends.mkldnn.flags(enabled=True))
    if algorithm == "native":
        return _quiet(torch.backends.mkldnn.flags(enabled=False))
    cudnn = {"cudnn-default": (False, False), "cudnn-benchmark": (True, False), "cudnn-deterministic": (False, True)}
    if algorithm in cudnn:
        benchmark, deterministic = cudnn[algorithm]
        return torch.backends.cudnn.flags(enabled=True, benchmark=benchmark, deterministic=deterministic)
    raise DlsimError(f"unknown convolution algorithm {algorithm!r}")


def gemm_fn(g: Gemm, dtype: str, device: Any) -> Callable[[], Any]:
    import torch
    if dtype == "fp8":
        if g.count != 1:
            raise DlsimError(f"no batched FP8 GEMM in PyTorch (torch._scaled_mm is 2-D), got {g.count} batches")
        from dlsim.calibrate.cuda_calls import fp8_matmul
        return fp8_matmul(g.m, g.n, g.k, device)
    gen = seeded(device)
    t = torch_dtype(dtype)
    if g.count == 1:
        a = torch.randn(g.m, g.k, generator=gen, device=device).to(dtype=t)
        b = torch.randn(g.k, g.n, generator=gen, device=device).to(dtype=t)
        return lambda: torch.mm(a, b)
    a = torch.randn(g.count, g.m, g.k, generator=gen, device=device).to(dtype=t)
    b = torch.randn(g.count, g.k, g.n, generator=gen, device=device).to(dtype=t)
    return lambda: torch.bmm(a, b)


def conv_fn(shape: ConvGeometry, n: int, pass_name: str, dtype: str, device: Any, channels_last: bool = False
            ) -> tuple[Callable[[], Any], int]:
    """A function running one pass of the convolution, and the bytes of that pass's output tensor; with
    `channels_last`, the input and the output gradient stored NHWC."""
    import torch
    import torch.nn.functional as F
    s = shape
    gen = seeded(device)
    t = torch_dtype(dtype)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(n, s.c_in, s.h, s.w, generator=gen, device=device).to(dtype=t, memory_format=layout)
    w = torch.randn(s.c_out, s.c_in // s.groups, s.k_h, s.k_w, generator=gen, device=device).to(dtype=t)
    stride, pad, dil = [s.stride_h, s.stride_w], [s.pad_h, s.pad_w], [s.dil_h, s.dil_w]
    if pass_name == "forward":
        y = F.conv2d(x, w, None, stride, pad, dil, s.groups)
        return (lambda: F.conv2d(x, w, None, stride, pad, dil, s.groups)), y.numel() * y.element_size()
    dy = torch.randn(n, s.c_out, s.h_out, s.w_out, generator=gen, device=device).to(dtype=t, memory_format=layout)
    mask = [True, False, False] if pass_name == "backward_data" else [False, True, False]
    out = x if pass_name == "backward_data" else w
    back = torch.ops.aten.convolution_backward
    return (lambda: back(dy, x, w, None, stride, pad, dil, False, [0, 0], s.groups, mask)), \
        out.numel() * out.element_size()


def _window(layer: Layer) -> dict:
    return conv_geometry(dict(layer.attrs), layer.in_shapes[0])


def _forward(layer: Layer, xs: list, params: dict) -> Any:
    """The operator PyTorch runs for one memory-bound dlsim layer."""
    import torch
    import torch.nn.functional as F
    a, t, x = layer.attrs, layer.type, xs[0]
    if t in ("maxpool", "avgpool"):
        g = _window(layer)
        k, s, p = (g["kh"], g["kw"]), (g["sh"], g["sw"]), (g["ph"], g["pw"])
        if t == "maxpool":
            return F.max_pool2d(x, k, s, p, (g["dh"], g["dw"]), ceil_mode=bool(a["ceil_mode"]))
        return F.avg_pool2d(x, k, s, p, ceil_mode=bool(a["ceil_mode"]))
    simple = {"global_avgpool": lambda: x.mean((2, 3)), "global_maxpool": lambda: x.amax((2, 3)),
              "relu": lambda: torch.relu(x), "tanh": lambda: torch.tanh(x), "sigmoid": lambda: torch.sigmoid(x),
              "relu6": lambda: F.relu6(x), "silu": lambda: F.silu(x),
              "gelu": lambda: F.gelu(x, approximate=a.get("approximate", "tanh")), "softmax": lambda: torch.softmax(x, -1),
              "dropout": lambda: F.dropout(x, a["p"], training=True),
              "swiglu": lambda: F.silu(x.chunk(2, -1)[0]) * x.chunk(2, -1)[1],
              "geglu": lambda: F.gelu(x.chunk(2, -1)[0], approximate="tanh") * x.chunk(2, -1)[1],
              "concat": lambda: torch.cat(xs, a["axis"] + 1 if a["axis"] >= 0 else a["axis"])}
    if t in simple:
        return simple[t]()
    if t == "sdpa":  # the fused operator; with dropout PyTorch's CPU dispatch runs the math path
        return F.scaled_dot_product_attention(xs[0], xs[1], xs[2], dropout_p=float(a["dropout"]),
                                              is_causal=bool(a["causal"]))
    if t == "conv_transpose2d":
        g, pad = transposed_geometry(dict(a), layer.in_shapes[0]), a.get("output_padding", 0)
        out_pad = (pad, pad) if isinstance(pad, int) else tuple(pad)
        return F.conv_transpose2d(x, params["weight"], params.get("bias"), (g["sh"], g["sw"]), (g["ph"], g["pw"]),
                                  out_pad, a["groups"], (g["dh"], g["dw"]))
    if t in RECURRENT:  # what nn.LSTM / nn.GRU / nn.RNN call: all steps and layers in one operator
        hx = torch.zeros(a["layers"] * (2 if a["bidirectional"] else 1), x.shape[0], a["hidden"], dtype=x.dtype,
                         device=x.device)
        run = getattr(torch._VF, RECURRENT[t])
        state = (hx, torch.zeros_like(hx)) if t == "lstm" else hx
        return run(x, state, list(params.values()), bool(a["bias"]), a["layers"], 0.0, True,
                   bool(a["bidirectional"]), True)[0]
    if t == "add":
        out = xs[0]
        for other in xs[1:]:
            out = out + other
        return out
    if t == "batchnorm":
        return F.batch_norm(x, params["mean"], params["var"], params.get("weight"), params.get("bias"), True, 0.1,
                            a["eps"])
    if t == "layernorm":
        return F.layer_norm(x, (x.shape[-1],), params.get("weight"), params.get("bias"), a["eps"])
    if t == "rmsnorm":
        return F.rms_norm(x, (x.shape[-1],), params.get("weight"), a["eps"])
    if t == "groupnorm":
        return F.group_norm(x, a["groups"], params.get("weight"), params.get("bias"), a["eps"])
    if t == "lrn":
        return F.local_response_norm(x, a["size"], a["alpha"], a["beta"], a["k"])
    if t == "embedding":
        y = F.embedding(x, params["tokens"])
        if "positions" in params:
            y = y + F.embedding(torch.arange(x.shape[1], device=x.device), params["positions"])
        if "token_types" in params:
            y = y + F.embedding(torch.zeros_like(x), params["token_types"])
        return y
    if t == "cross_entropy":
        return F.cross_entropy(x.reshape(-1, x.shape[-1]), xs[1].reshape(-1))
    raise DlsimError(f"layer {layer.name!r}: {t} is not a memory-bound operator dlsim calibrates")


RECURRENT = {"lstm": "lstm", "gru": "gru", "rnn": "rnn_tanh"}
"""dlsim's recurrent layer types and the ``torch._VF`` operators their PyTorch modules call."""


def _recurrent_weights(layer: Layer, floats: Callable[..., Any]) -> dict:
    """Per layer and direction w_ih (g·h, F), w_hh (g·h, h) and the biases b_ih, b_hh (g·h), in nn.LSTM's
    flat-weight order (g gates: `dlsim.spec.ops.recurrent_gates`)."""
    from dlsim.spec.ops import recurrent_gates
    a = layer.attrs
    g, h, dirs = recurrent_gates(layer.type), a["hidden"], 2 if a["bidirectional"] else 1
    out, feat = {}, layer.in_shapes[0][-1]
    for i in range(a["layers"]):
        for d in range(dirs):
            tag = f"l{i}" + ("_reverse" if d else "")
            out[f"weight_ih_{tag}"], out[f"weight_hh_{tag}"] = floats(g * h, feat), floats(g * h, h)
            if a["bias"]:
                out[f"bias_ih_{tag}"], out[f"bias_hh_{tag}"] = floats(g * h), floats(g * h)
        feat = h * dirs
    return out


def _inputs(layer: Layer, batch: int, dtype: str, device: Any) -> tuple[list, dict]:
    import torch
    gen = seeded(device)
    t = torch_dtype(dtype)
    def floats(*shape: int, grad: bool = True) -> Any:
        return torch.randn(*shape, generator=gen, device=device).to(dtype=t).requires_grad_(grad)
    a = layer.attrs
    if layer.type == "embedding":
        steps = layer.in_shapes[0][0]
        ids = torch.randint(0, a["vocab"], (batch, steps), generator=gen, device=device)
        params = {"tokens": floats(a["vocab"], a["dim"])}
        if a["positions"]:
            params["positions"] = floats(a["positions"], a["dim"])
        if a["token_types"]:
            params["token_types"] = floats(a["token_types"], a["dim"])
        return [ids], params
    xs = [floats(batch, *s) for s in layer.in_shapes]
    params: dict = {}
    if layer.type in RECURRENT:
        params = _recurrent_weights(layer, floats)
    elif layer.type == "conv_transpose2d":  # weight (C_in, C_out/g, K_y, K_x), as nn.ConvTranspose2d holds it
        g = transposed_geometry(dict(a), layer.in_shapes[0])
        params = {"weight": floats(layer.in_shapes[0][0], a["out_channels"] // a["groups"], g["kh"], g["kw"])}
        if a["bias"]:
            params["bias"] = floats(a["out_channels"])
    if layer.type == "cross_entropy":
        logits = layer.in_shapes[0]
        xs.append(torch.randint(0, logits[-1], (batch, *logits[:-1]), generator=gen, device=device))
    elif layer.type in ("batchnorm", "layernorm", "groupnorm", "rmsnorm"):
        width = layer.in_shapes[0][0] if layer.type in ("batchnorm", "groupnorm") else layer.in_shapes[0][-1]
        if a["affine"]:
            params = {"weight": floats(width)} if layer.type == "rmsnorm" else {"weight": floats(width),
                                                                                "bias": floats(width)}
        if layer.type == "batchnorm":
            params["mean"] = torch.zeros(width, device=device, dtype=t)
            params["var"] = torch.ones(width, device=device, dtype=t)
    return xs, params


def memory_op(layer: Layer, batch: int, pass_name: str, dtype: str, device: Any) -> Callable[[], Any]:
    """A function running the forward or the backward of one memory-bound layer (see the module docstring)."""
    import torch
    cost = layer_cost(layer, batch, dtype)
    if pass_name != "forward" and getattr(cost, pass_name).kernels == 0:
        raise DlsimError(f"layer {layer.name!r} ({layer.type}) has no {pass_name} pass")
    xs, params = _inputs(layer, batch, dtype, device)
    if pass_name == "forward":  # with autograd recording, as in training
        return lambda: _forward(layer, xs, params)
    y = _forward(layer, xs, params)
    wrt = [v for v in (*xs, *params.values()) if v.requires_grad]
    dy = torch.ones_like(y) if y.dim() == 0 else torch.randn_like(y)
    return lambda: torch.autograd.grad(y, wrt, dy, retain_graph=True)


def copy_fn(elements: int, dtype: str, device: Any) -> tuple[Callable[[], Any], float]:
    """A function copying `elements` elements of `dtype` into a preallocated tensor, and the bytes it moves
    (read + write)."""
    import torch
    src = torch.randn(elements, generator=seeded(device), device=device).to(dtype=torch_dtype(dtype))
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), 2.0 * elements * src.element_size()


OPTIMIZER_NAMES = ("sgd", "momentum", "adam")


def make_optimizer(name: str, params: Any) -> tuple[Any, str]:
    """PyTorch's optimizer for dlsim's name (sgd: SGD; momentum: SGD with momentum 0.9; adam: Adam),
    with the fused implementation (one kernel per parameter tensor) where this PyTorch has it for the
    parameters' device, foreach otherwise; returns (optimizer, implementation)."""
    import torch
    if name not in OPTIMIZER_NAMES:
        raise DlsimError(f"unknown optimizer {name!r} (use {', '.join(OPTIMIZER_NAMES)})")
    params = list(params)
    def build(impl: dict) -> Any:
        if name == "adam":
            return torch.optim.Adam(params, lr=1e-4, **impl)
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9 if name == "momentum" else 0.0, **impl)
    try:
        return build({"fused": True}), "fused"
    except (RuntimeError, TypeError, ValueError):
        return build({"foreach": True}), "foreach"


def optimizer_step_fn(name: str, sizes: tuple[int, ...], device: Any) -> Callable[[], Any]:
    """One optimizer step over fp32 parameter tensors of `sizes` elements with gradients set (the
    optimizer state is created by the first, warm-up, step)."""
    import torch
    params = [torch.zeros(n, device=device, requires_grad=True) for n in sizes]
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    opt, _ = make_optimizer(name, params)
    return opt.step
