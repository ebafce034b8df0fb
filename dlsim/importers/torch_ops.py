"""Which dlsim operator an ATen operator of a captured graph is.

`MAPPERS` maps an ATen operator's name to a function of (capture context, FX node, per-sample input
shapes, per-sample output shape) that returns the dlsim layers it becomes — usually one, a 1-D
convolution or pooling three (a reshape to a single row, the 2-D operator, a reshape back) — as
(id suffix, layer entry, input ids or None for the node's own), or None when the operator's
arguments do not fit a dlsim operator (which then prices it as generic). Every mapping is checked
by dlsim's own shape rule against the captured shape (`dlsim.importers.graph.shape_fits`).

The context (`dlsim.importers.torch_export._Context`) gives `params` (parameter name -> tensor),
`owner` (parameters already counted, by layer id), `canonical` (tied names), `active` (nodes that
depend on the input), `alias` (node -> layer id), `meta` (symbolic values) and `shapes`
(per-sample shapes and axes). torch is needed only through the nodes it is given.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from dlsim.importers.graph import shape_fits

Mapped = list[tuple[str, dict, list[str] | None]]
Ctx = Any  # dlsim.importers.torch_export._Context


def _row(v: Any, height: int) -> list[int]:
    """A 1-D window size as the (height, width) of a 2-D window over a single row."""
    return [height, int(v[0] if isinstance(v, (list, tuple)) else v)]


def _pair(v: Any) -> Any:
    v = list(v) if isinstance(v, (list, tuple)) else [v, v]
    v = [int(x) for x in v]
    return v[0] if len(v) == 2 and v[0] == v[1] else v


def _arg(node: Any, i: int, name: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _param_name(ctx: Ctx, a: Any) -> str | None:
    """The parameter a graph argument is, when it is one parameter placeholder."""
    import torch.fx
    if isinstance(a, torch.fx.Node) and a.op == "placeholder" and a.name in ctx.params:
        return ctx.canonical.get(a.name, a.name)
    return None


def _weights(ctx: Ctx, node: Any, idx: list[int], names: list[str]) -> list[str | None] | None:
    """The parameters at argument positions `idx` (None where the argument is None); None if any other
    argument is not an unclaimed parameter."""
    out = []
    for i, n in zip(idx, names):
        a = _arg(node, i, n)
        if a is None:
            out.append(None)
            continue
        p = _param_name(ctx, a)
        if p is None or p in ctx.owner:
            return None
        out.append(p)
    return out


def _map_conv(ctx: Ctx, node: Any, ins: list, out: tuple) -> Mapped | None:
    w = _weights(ctx, node, [1, 2], ["weight", "bias"])
    if w is None or w[0] is None or len(ins) != 1:
        return None
    weight = ctx.params[w[0]]
    transposed = "transpose" in node.target.__name__
    stride, padding, dilation = _arg(node, 3, "stride", 1), _arg(node, 4, "padding", 0), _arg(node, 5 if not transposed else 6, "dilation", 1)
    groups = int(_arg(node, 6 if not transposed else 5, "groups", 1))
    if transposed:
        out_pad = _arg(node, 5, "output_padding", 0)
        dilation = _arg(node, 7, "dilation", 1)
        attrs = {"type": "conv_transpose2d", "out_channels": int(weight.shape[1]) * groups,
                 "kernel": _pair(weight.shape[2:]), "stride": _pair(stride), "padding": _pair(padding),
                 "output_padding": _pair(out_pad), "dilation": _pair(dilation), "groups": groups, "bias": w[1] is not None}
    else:
        pad = padding if isinstance(padding, str) else _pair(padding)
        if pad == "valid":
            pad = 0
        attrs = {"type": "conv2d", "out_channels": int(weight.shape[0]), "kernel": None, "stride": None,
                 "padding": pad, "dilation": None, "groups": groups, "bias": w[1] is not None}
        if weight.dim() == 3:  # conv1d: a conv2d over a height of 1, between two reshapes
            c, length = ins[0] if len(ins[0]) == 2 else (None, None)
            if c is None:
                return None
            attrs.update(kernel=_row(weight.shape[2:], 1), stride=_row(stride, 1), dilation=_row(dilation, 1),
                         padding=pad if isinstance(pad, str) else _row(padding, 0))
            mid = (int(c), 1, int(length))
            conv_out = (out[0], 1, out[1]) if len(out) == 2 else None
            if conv_out is None or not shape_fits("conv2d", {k: v for k, v in attrs.items() if k != "type"}, [mid], conv_out):
                return None
            return [("_in2d", {"type": "reshape", "shape": list(mid)}, None),
                    ("_conv", attrs, ["_in2d"]),
                    ("", {"type": "reshape", "shape": list(out)}, ["_conv"])]
        if weight.dim() != 4:
            return None
        attrs.update(kernel=_pair(weight.shape[2:]), stride=_pair(stride), dilation=_pair(dilation))
        if _channels_last(ctx.values.get(node.args[0].name)):
            attrs["memory_format"] = "channels_last"
    if not shape_fits(attrs["type"], {k: v for k, v in attrs.items() if k != "type"}, ins, out):
        return None
    return [("", attrs, None)]


def _channels_last(x: Any) -> bool:
    """Whether a 4-D tensor is stored NHWC only (a network's permutes leave it so; oneDNN then runs its
    channels-last kernels)."""
    import torch
    return isinstance(x, torch.Tensor) and x.dim() == 4 and not x.is_contiguous() and \
        x.is_contiguous(memory_format=torch.channels_last)


def _map_linear(ctx: Ctx, node: Any, ins: list, out: tuple) -> Mapped | None:
    if len(ins) != 1:
        return None
    wa, ba = _arg(node, 1, "weight"), _arg(node, 2, "bias")
    p = _param_name(ctx, wa)
    bias = _param_name(ctx, ba) if ba is not None else None
    if p is None or (ba is not None and (bias is None or bias in ctx.owner)):
        return None
    weight = ctx.params[p]
    attrs = {"type": "linear", "out_features": int(weight.shape[0]), "bias": ba is not None}
    if p in ctx.owner:  # a weight shared with an earlier layer: tied, counted there
        attrs["tied_to"] = ctx.owner[p]
    if weight.dim() != 2 or not shape_fits("linear", {"out_features": attrs["out_features"], "bias": attrs["bias"]}, ins, out):
        return None
    return [("", attrs, None)]


def _map_matmul(ctx: Ctx, node: Any, ins: list, out: tuple) -> Mapped | None:
    args = [a for a in node.args[:2]]
    acts = [a.name in ctx.active for a in args]
    if all(acts) and len(ins) == 2 and shape_fits("matmul", {}, ins, out):
        return [("", {"type": "matmul"}, None)]
    if acts == [True, False]:  # x @ W with W a parameter [in, out]: a linear layer without bias
        p = _param_name(ctx, args[1])
        if p is None or p in ctx.owner or ctx.params[p].dim() != 2:
            return None
        attrs = {"out_features": int(ctx.params[p].shape[1]), "bias": False}
        if shape_fits("linear", attrs, ins, out):
            return [("", {"type": "linear", **attrs}, None)]
    return None


def _map_norm(ctx: Ctx, node: Any, ins: list, out: tuple) -> Mapped | None:
    name = node.target.__name__
    if len(ins) != 1:
        return None
    if name.startswith("layer_norm"):
        shape = _arg(node, 1, "normalized_shape")
        w = _weights(ctx, node, [2, 3], ["weight", "bias"])
        if w is None or len(shape) != 1 or (w[0] is None) != (w[1] is None):
            return None
        attrs = {"type": "layernorm", "affine": w[0] is not None, "eps": float(_arg(node, 4, "eps", 1e-5))}
    elif name.startswith("rms_norm"):
        shape = _arg(node, 1, "normalized_shape")
        w = _weights(ctx, node, [2], ["weight"])
        if w is None or len(shape) != 1:
            return None
        eps = _arg(node, 3, "eps")
        attrs = {"type": "rmsnorm", "affine": w[0] is not None, "eps": float(eps) if eps is not None else 1e-5}
    elif name.startswith("batch_norm"):
        w = _weights(ctx, node, [1, 2], ["weight", "bias"])
        if w is None or (w[0] is None) != (w[1] is None):
            return None
        attrs = {"type": "batchnorm", "affine": w[0] is not None, "eps": float(_arg(node, 7, "eps", 1e-5))}
    elif name.startswith("group_norm"):
        w = _weights(ctx, node, [2, 3], ["weight", "bias"])
        if w is None or (w[0] is None) != (w[1] is None):
            return None
        attrs = {"type": "groupnorm", "groups": int(_arg(node, 1, "num_groups")), "affine": w[0] is not None,
                 "eps": float(_arg(node, 4, "eps", 1e-5))}
    else:
        return None
    if not shape_fits(attrs["type"], {k: v for k, v in attrs.items() if k != "type"}, ins, out):
        return None
    return [("", attrs, None)]


_ACTIVATIONS = {"relu": "relu", "relu_": "relu", "gelu": "gelu", "gelu_": "gelu", "tanh": "tanh", "tanh_": "tanh",
                "sigmoid": "sigmoid", "sigmoid_": "sigmoid", "silu": "silu", "silu_": "silu", "relu6": "relu6",
                "hardtanh": "relu6", "hardtanh_": "relu6"}


def _map_activation(ctx: Ctx, node: Any, ins: list, out: tuple) -> Mapped | None:
    name = node.target.__name__.split(".")[0]
    kind = _ACTIVATIONS.get(name)
    if kind is None or len(ins) != 1 or len(node.args) < 1 or node.args[0].name not in ctx.active:
        return None
    if name.startswith("hardtanh") and (float(_arg(node, 1, "min_val", -1.0)), float(_arg(node, 2, "max_val", 1.0))) != (0.0, 6.0):
        return None
    if name.startswith("gelu") and node.kwargs.get("approximate", "none") not in ("none", "tanh"):
        return None
    if tuple(ins[0]) != tuple(out) or not out:
        return None
    if kind == "gelu":
        return [("", {"type": kind, "approximate": node.kwargs.get("approximate", "none")}, None)]
    return [("", {"type": kind}, None)]


def _map_softmax(ctx: Ctx, node: Any, ins: list, out: tuple) -> Mapped | None:
    value = ctx.meta[node.args[0].name]
    dim = int(_arg(node, 1, "dim"))
    if len(ins) != 1 or ctx.shapes.axis(value, dim) != len(ins[0]) - 1 or tuple(ins[0]) != tuple(out) or not out:
        return None
    return [("", {"type": "softmax"}, None)]


def _map_dropout(ctx: Ctx, node: Any, ins: list, out: tuple) -> Mapped | None:
    p, train = float(_arg(node, 1, "p", 0.5)), bool(_arg(node, 2, "train", True))
    if len(ins) != 1 or not train or not 0 <= p < 1 or tuple(ins[0]) != tuple(out) or not out:
        return None
    return [("", {"type": "dropout", "p": p}, None)]


def _map_add(ctx: Ctx, node: Any, ins: list, out: tuple) -> Mapped | None:
    args = node.args[:2]
    import torch.fx
    if len(args) != 2 or not all(isinstance(a, torch.fx.Node) and a.name in ctx.active for a in args):
        return None
    if node.kwargs.get("alpha", 1) != 1 or len(ins) != 2 or not (tuple(ins[0]) == tuple(ins[1]) == tuple(out)) or not out:
        return None
    return [("", {"type": "add"}, None)]


def _map_cat(ctx: Ctx, node: Any, ins: list, out: tuple) -> Mapped | None:
    tensors = node.args[0]
    if len(tensors) < 2 or len(ins) != len(tensors) or not all(t.name in ctx.active for t in tensors):
        return None
    axis = ctx.shapes.axis(ctx.meta[tensors[0].name], int(_arg(node, 1, "dim", 0)))
    if axis is None or not shape_fits("concat", {"axis": axis}, ins, out):
        return None
    return [("", {"type": "concat", "axis": axis}, None)]


def _map_embedding(ctx: Ctx, node: Any, ins: list, out: tuple) -> Mapped | None:
    w = _weights(ctx, node, [0], ["weight"])
    if w is None or w[0] is None or len(ins) != 1:
        return None
    table = ctx.params[w[0]]
    attrs = {"vocab": int(table.shape[0]), "dim": int(table.shape[1])}
    if not shape_fits("embedding", attrs, ins, out):
        return None
    return [("", {"type": "embedding", **attrs}, None)]


def _map_sdpa(ctx: Ctx, node: Any, ins: list, out: tuple) -> Mapped | None:
    q, k, v = node.args[:3]
    mask = _arg(node, 3, "attn_mask")
    if mask is not None or not all(a.name in ctx.active for a in (q, k, v)):
        return None
    shapes = [ctx.shapes.per_sample(ctx.meta[a.name]) for a in (q, k, v)]
    attrs = {"causal": bool(_arg(node, 5, "is_causal", False)), "dropout": float(_arg(node, 4, "dropout_p", 0.0))}
    if not shape_fits("sdpa", attrs, shapes, out):
        return None
    ids = [ctx.alias[a.name] for a in (q, k, v)]
    return [("", {"type": "sdpa", **attrs}, ids)]


def _map_recurrent(ctx: Ctx, node: Any, ins: list, out: tuple) -> Mapped | None:
    kind = {"lstm": "lstm", "gru": "gru", "rnn_tanh": "rnn"}[node.target.__name__.split(".")[0]]
    x = node.args[0]
    if x.name not in ctx.active:
        return None
    weights = node.args[2]
    has_bias, layers = bool(node.args[3]), int(node.args[4])
    bidirectional = bool(node.args[7])
    names = [_param_name(ctx, w) for w in weights]
    if any(n is None or n in ctx.owner for n in names):
        return None
    hidden = int(ctx.params[names[1]].shape[1])
    if kind == "lstm" and int(ctx.params[names[1]].shape[0]) != 4 * hidden:
        return None  # projections (proj_size) are not modelled
    attrs = {"hidden": hidden, "layers": layers, "bias": has_bias, "bidirectional": bidirectional}
    xin = ctx.shapes.per_sample(ctx.meta[x.name])
    if not shape_fits(kind, attrs, [xin], out):
        return None
    return [("", {"type": kind, **attrs}, [ctx.alias[x.name]])]


def _map_pool(ctx: Ctx, node: Any, ins: list, out: tuple) -> Mapped | None:
    name = node.target.__name__.split(".")[0]
    if len(ins) != 1:
        return None
    if name in ("adaptive_avg_pool2d", "mean"):
        if name == "mean":
            value = ctx.meta[node.args[0].name]
            axes = [ctx.shapes.axis(value, int(d)) for d in _arg(node, 1, "dim", []) or []]
            dims = sorted(-1 if a is None else a for a in axes)
            if len(ins[0]) != 3 or dims != [1, 2] or node.kwargs.get("dtype") is not None:
                return None
        elif [int(x) for x in _arg(node, 1, "output_size")] != [1, 1] or len(ins[0]) != 3:
            return None
        if tuple(out) == (ins[0][0],):
            return [("", {"type": "global_avgpool"}, None)]
        if tuple(out) == (ins[0][0], 1, 1):
            return [("_pool", {"type": "global_avgpool"}, None), ("", {"type": "reshape", "shape": list(out)}, ["_pool"])]
        return None
    kernel = _arg(node, 1, "kernel_size")
    stride = _arg(node, 2, "stride") or kernel
    if name in ("max_pool1d", "avg_pool1d"):  # a 2-D pooling over a single row, between two reshapes
        if len(ins[0]) != 2 or len(out) != 2 or (name == "max_pool1d" and _row(_arg(node, 4, "dilation", 1), 1) != [1, 1]):
            return None
        attrs = {"kernel": _row(kernel, 1), "stride": _row(stride, 1), "padding": _row(_arg(node, 3, "padding", 0), 0),
                 "ceil_mode": bool(_arg(node, 5 if name == "max_pool1d" else 4, "ceil_mode", False))}
        kind = "maxpool" if name == "max_pool1d" else "avgpool"
        mid, pooled = (ins[0][0], 1, ins[0][1]), (out[0], 1, out[1])
        if not shape_fits(kind, attrs, [mid], pooled):
            return None
        return [("_in2d", {"type": "reshape", "shape": list(mid)}, None), ("_pool", {"type": kind, **attrs}, ["_in2d"]),
                ("", {"type": "reshape", "shape": list(out)}, ["_pool"])]
    attrs = {"kernel": _pair(kernel), "stride": _pair(stride), "padding": _pair(_arg(node, 3, "padding", 0))}
    if name == "max_pool2d":
        attrs.update(dilation=_pair(_arg(node, 4, "dilation", 1)), ceil_mode=bool(_arg(node, 5, "ceil_mode", False)))
        kind = "maxpool"
    else:
        attrs.update(ceil_mode=bool(_arg(node, 4, "ceil_mode", False)))
        if _arg(node, 6, "divisor_override") is not None:
            return None
        kind = "avgpool"
    if not shape_fits(kind, attrs, ins, out):
        return None
    return [("", {"type": kind, **attrs}, None)]


_VIEWS = {"view", "reshape", "_unsafe_view", "flatten", "unflatten", "permute", "transpose", "t", "unsqueeze",
          "squeeze", "swapaxes", "movedim", "view_as", "reshape_as"}


def _copies(ctx: Ctx, node: Any) -> bool:
    """Whether the operator wrote a new tensor instead of a view of its input, as ``reshape`` (or
    ``flatten``) of a non-contiguous tensor does: the output holds other storage than the input."""
    import torch
    src, value = ctx.values.get(node.args[0].name), ctx.values.get(node.name)
    return isinstance(src, torch.Tensor) and isinstance(value, torch.Tensor) and \
        value.untyped_storage().data_ptr() != src.untyped_storage().data_ptr()


def _map_view(ctx: Ctx, node: Any, ins: list, out: tuple) -> Mapped | None:
    """A view: dlsim's ``reshape`` (no kernel). One that copied its input (a reshape of a non-contiguous
    tensor) is no view: None, so the importer prices it as the generic operator its kernels are (the
    copy's bytes, metered)."""
    if len(ins) != 1 or not out or math.prod(ins[0]) != math.prod(out) or node.args[0].name not in ctx.active:
        return None
    if _copies(ctx, node):
        return None
    return [("", {"type": "reshape", "shape": list(out)}, None)]


MAPPERS: dict[str, Callable[[Ctx, Any, list, tuple], Mapped | None]] = {
    "conv2d": _map_conv, "conv1d": _map_conv, "conv_transpose2d": _map_conv,
    "linear": _map_linear, "matmul": _map_matmul, "mm": _map_matmul, "bmm": _map_matmul,
    "layer_norm": _map_norm, "rms_norm": _map_norm, "batch_norm": _map_norm, "group_norm": _map_norm,
    "softmax": _map_softmax, "dropout": _map_dropout, "add": _map_add, "add_": _map_add, "cat": _map_cat,
    "embedding": _map_embedding, "scaled_dot_product_attention": _map_sdpa,
    "lstm": _map_recurrent, "gru": _map_recurrent, "rnn_tanh": _map_recurrent,
    "max_pool2d": _map_pool, "avg_pool2d": _map_pool, "adaptive_avg_pool2d": _map_pool, "mean": _map_pool,
    "max_pool1d": _map_pool, "avg_pool1d": _map_pool,
    **{name: _map_activation for name in _ACTIVATIONS},
    **{name: _map_view for name in _VIEWS},
}
