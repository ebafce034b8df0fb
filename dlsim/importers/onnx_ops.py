"""Which dlsim operator an ONNX node is, and the FLOPs of one that is none.

`MAP` maps an ONNX operator type to a function of (graph state, node, per-sample input shapes,
per-sample output shape) that returns the dlsim layers it becomes — as (id suffix, layer entry,
input ids or None for the node's own) — or None when its attributes or inputs do not fit a dlsim
operator; every mapping is checked by dlsim's shape rule (`dlsim.importers.graph.shape_fits`).
A node that maps onto none is priced by `dlsim.importers.onnx_flops`.

The graph state (`dlsim.importers.onnx_graph._Graph`) gives `inits` (initializers), `weights`
(which are parameters), `consts` (constant values), `owner` (parameters already counted, by layer
id), `param_of` (tensor -> parameters it was computed from), `active` (tensors that depend on the input), `alias`,
`s2` (shapes at the first batch size), `shape`/`axis` (per-sample) and the fused bias adds.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from dlsim.errors import SpecError
from dlsim.importers.graph import shape_fits
from dlsim.importers.onnx_node import attrs as _attrs
from dlsim.spec.ops import OPS, infer

Mapped = list[tuple[str, dict, list[str] | None]]
G = Any  # dlsim.importers.onnx_graph._Graph


def _pair(v: Any) -> Any:
    v = [int(x) for x in v]
    return v[0] if len(v) == 2 and v[0] == v[1] else v


def _weight(g: G, name: str) -> str | None:
    """The parameter `name` is, when it is one (`dlsim.importers.onnx_weights`) not yet counted."""
    return name if name in g.weights.params and name not in g.owner else None


def _map_conv(g: G, node: Any, ins: list, out: tuple) -> Mapped | None:
    a = _attrs(node)
    w = _weight(g, node.input[1])
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if w is None or (bias is not None and _weight(g, bias) is None) or len(ins) != 1:
        return None
    dims = list(g.inits[w].dims)
    k = len(dims) - 2
    pads = list(a.get("pads", [0] * 2 * k))
    if a.get("auto_pad", "NOTSET") != "NOTSET" or pads[:k] != pads[k:]:
        return None
    groups = int(a.get("group", 1))
    strides, dilations = list(a.get("strides", [1] * k)), list(a.get("dilations", [1] * k))
    transposed = node.op_type == "ConvTranspose"
    if transposed:
        if k != 2 or "output_shape" in a:
            return None
        attrs = {"type": "conv_transpose2d", "out_channels": dims[1] * groups, "kernel": _pair(dims[2:]),
                 "stride": _pair(strides), "padding": _pair(pads[:2]),
                 "output_padding": _pair(a.get("output_padding", [0, 0])), "dilation": _pair(dilations),
                 "groups": groups, "bias": bias is not None}
    elif k == 2:
        attrs = {"type": "conv2d", "out_channels": dims[0], "kernel": _pair(dims[2:]), "stride": _pair(strides),
                 "padding": _pair(pads[:2]), "dilation": _pair(dilations), "groups": groups, "bias": bias is not None}
    elif k == 1 and len(ins[0]) == 2 and len(out) == 2:
        attrs = {"type": "conv2d", "out_channels": dims[0], "kernel": [1, dims[2]], "stride": [1, strides[0]],
                 "padding": [0, pads[0]], "dilation": [1, dilations[0]], "groups": groups, "bias": bias is not None}
        mid, conv_out = (ins[0][0], 1, ins[0][1]), (out[0], 1, out[1])
        if not shape_fits("conv2d", {k2: v for k2, v in attrs.items() if k2 != "type"}, [mid], conv_out):
            return None
        return [("_in2d", {"type": "reshape", "shape": list(mid)}, None), ("_conv", attrs, ["_in2d"]),
                ("", {"type": "reshape", "shape": list(out)}, ["_conv"])]
    else:
        return None
    if not shape_fits(attrs["type"], {k2: v for k2, v in attrs.items() if k2 != "type"}, ins, out):
        return None
    return [("", attrs, None)]


def _map_gemm(g: G, node: Any, ins: list, out: tuple) -> Mapped | None:
    a = _attrs(node)
    if a.get("transA", 0) or float(a.get("alpha", 1.0)) != 1.0 or float(a.get("beta", 1.0)) != 1.0:
        return None
    w = _weight(g, node.input[1])
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if w is None or len(ins) != 1 or (bias is not None and _weight(g, bias) is None):
        return None
    dims = list(g.inits[w].dims)
    attrs = {"out_features": dims[0] if a.get("transB", 0) else dims[1], "bias": bias is not None}
    if not shape_fits("linear", attrs, ins, out):
        return None
    return [("", {"type": "linear", **attrs}, None)]


def _map_matmul(g: G, node: Any, ins: list, out: tuple) -> Mapped | None:
    x, y = node.input[:2]
    if x in g.active and y in g.active and shape_fits("matmul", {}, ins, out):
        return [("", {"type": "matmul"}, None)]
    if x in g.active and y not in g.active:
        sources = g.param_of.get(y, set())
        if len(sources) != 1 or g.s2.get(y) is None or len(g.s2[y]) != 2:
            return None
        (src,) = sources
        attrs = {"out_features": g.s2[y][1], "bias": False}
        if not shape_fits("linear", attrs, ins, out) or math.prod(g.inits[src].dims) != math.prod(g.s2[y]):
            return None
        if src in g.owner:  # a weight shared with an earlier layer (tied output embedding)
            attrs["tied_to"] = g.owner[src]
        add, bias = g.bias_after.get(node.output[0], (None, None))
        if bias is not None and bias not in g.owner and list(g.inits[bias].dims) == [attrs["out_features"]]:
            attrs["bias"] = True  # MatMul + Add of a bias vector: the exporter's form of a linear layer
            g.fused[add] = node.output[0]
        return [("", {"type": "linear", **attrs}, None)]
    return None


def _map_norm(g: G, node: Any, ins: list, out: tuple) -> Mapped | None:
    a = _attrs(node)
    if len(ins) != 1:
        return None
    scale = node.input[1] if len(node.input) > 1 else ""
    bias = node.input[2] if len(node.input) > 2 else ""
    if not scale or not bias or _weight(g, scale) is None or _weight(g, bias) is None:
        return None
    if node.op_type == "BatchNormalization":
        attrs = {"type": "batchnorm", "affine": True, "eps": float(f"{a.get('epsilon', 1e-5):.6g}")}
    else:
        if g.axis(node.input[0], int(a.get("axis", -1))) != len(ins[0]) - 1:
            return None
        attrs = {"type": "layernorm", "affine": True, "eps": float(f"{a.get('epsilon', 1e-5):.6g}")}
    if not shape_fits(attrs["type"], {k: v for k, v in attrs.items() if k != "type"}, ins, out):
        return None
    return [("", attrs, None)]


def _map_instancenorm(g: G, node: Any, ins: list, out: tuple) -> Mapped | None:
    """Instance normalisation of a per-sample (C, ...) tensor is group normalisation with C groups (the
    exporter's form of GroupNorm: a reshape to (G, -1), instance norm with unit scale, then the affine
    product and sum as their own operators)."""
    if len(ins) != 1 or len(ins[0]) < 2:
        return None
    scale, bias = node.input[1], node.input[2]
    weights = [_weight(g, scale), _weight(g, bias)]
    affine = all(w is not None for w in weights)
    if not affine and (g.param_of.get(scale) or g.param_of.get(bias)):
        return None
    attrs = {"groups": ins[0][0], "affine": affine, "eps": float(f"{_attrs(node).get('epsilon', 1e-5):.6g}")}
    if not shape_fits("groupnorm", attrs, ins, out):
        return None
    return [("", {"type": "groupnorm", **attrs}, None)]


def _map_activation(g: G, node: Any, ins: list, out: tuple) -> Mapped | None:
    if len(ins) != 1 or tuple(ins[0]) != tuple(out) or not out:
        return None
    kind = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Gelu": "gelu"}.get(node.op_type)
    if node.op_type == "Clip":
        lo = g.const(node.input[1]) if len(node.input) > 1 and node.input[1] else None
        hi = g.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        kind = "relu6" if lo is not None and hi is not None and (float(lo), float(hi)) == (0.0, 6.0) else None
    if kind == "gelu":  # ONNX Gelu (opset 20): attribute approximate, "none" (erf) by default
        form = _attrs(node).get("approximate", "none")
        return [("", {"type": kind, "approximate": form.decode() if isinstance(form, bytes) else form}, None)]
    return [("", {"type": kind}, None)] if kind else None


def _map_softmax(g: G, node: Any, ins: list, out: tuple) -> Mapped | None:
    axis = int(_attrs(node).get("axis", -1))
    if len(ins) != 1 or g.axis(node.input[0], axis) != len(ins[0]) - 1 or tuple(ins[0]) != tuple(out):
        return None
    return [("", {"type": "softmax"}, None)]


def _map_dropout(g: G, node: Any, ins: list, out: tuple) -> Mapped | None:
    ratio = g.const(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    training = g.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    p = float(ratio) if ratio is not None else 0.5
    if len(ins) != 1 or training is None or not bool(training) or not 0 <= p < 1 or tuple(ins[0]) != tuple(out):
        return None
    return [("", {"type": "dropout", "p": p}, None)]


def _map_add(g: G, node: Any, ins: list, out: tuple) -> Mapped | None:
    if len(ins) != 2 or not all(i in g.active for i in node.input) or not (tuple(ins[0]) == tuple(ins[1]) == tuple(out)):
        return None
    return [("", {"type": "add"}, None)]


def _map_concat(g: G, node: Any, ins: list, out: tuple) -> Mapped | None:
    if len(ins) < 2 or not all(i in g.active for i in node.input):
        return None
    axis = g.axis(node.input[0], int(_attrs(node)["axis"]))
    if axis is None or not shape_fits("concat", {"axis": axis}, ins, out):
        return None
    return [("", {"type": "concat", "axis": axis}, None)]


def _map_gather(g: G, node: Any, ins: list, out: tuple) -> Mapped | None:
    table, ids = node.input[:2]
    if int(_attrs(node).get("axis", 0)) != 0 or _weight(g, table) is None or ids not in g.active or len(ins) != 1:
        return None
    dims = list(g.inits[table].dims)
    attrs = {"vocab": dims[0], "dim": dims[1]} if len(dims) == 2 else None
    if attrs is None or not shape_fits("embedding", attrs, ins, out):
        return None
    return [("", {"type": "embedding", **attrs}, None)]


RECURRENT = {"LSTM": "lstm", "GRU": "gru", "RNN": "rnn"}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DIRECTIONS = ("forward", "reverse", "bidirectional")


def check_recurrent(g: G, node: Any) -> int:
    """The hidden size of an LSTM, GRU or RNN node whose inputs have the shapes ONNX's operator
    defines (X: rank 3 with F features; W: [directions, gates·h, F]; R: [directions, gates·h, h];
    B: [directions, 2·gates·h]; an LSTM's P: [directions, 3·h]); a `SpecError` naming the node and the
    first input that does not. `hidden_size` may be left out (R's last dimension says it)."""
    a = _attrs(node)
    where = f"{node.op_type} {node.output[0] if node.output else node.name}"
    direction, layout = a.get("direction", "forward"), a.get("layout", 0)
    if isinstance(direction, bytes):
        direction = direction.decode("utf-8", "replace")
    if direction not in _DIRECTIONS:
        raise SpecError(f"{where}: direction {direction!r} is not one of {', '.join(_DIRECTIONS)}")
    if layout not in (0, 1):
        raise SpecError(f"{where}: layout {layout!r} is not 0 or 1")
    if len(node.input) < 3 or not node.input[1] or not node.input[2]:
        raise SpecError(f"{where}: needs the inputs X, W and R")
    x, w, r = (g.s2.get(n) for n in node.input[:3])
    hidden = a.get("hidden_size", r[2] if r is not None and len(r) == 3 else None)
    if not isinstance(hidden, int) or hidden < 1:
        raise SpecError(f"{where}: hidden_size must be a positive integer, got {hidden!r}")
    gates, dirs = _GATES[node.op_type], 2 if direction == "bidirectional" else 1
    if x is not None and len(x) != 3:
        raise SpecError(f"{where}: input X must have rank 3, got shape {list(x)}")
    feat = x[2] if x is not None else (w[2] if w is not None and len(w) == 3 else None)
    want = {1: ("W", [dirs, gates * hidden, feat]), 2: ("R", [dirs, gates * hidden, hidden]),
            3: ("B", [dirs, 2 * gates * hidden])}
    if node.op_type == "LSTM":
        want[7] = ("P", [dirs, 3 * hidden])
    for i, (label, shape) in want.items():
        got = g.s2.get(node.input[i]) if len(node.input) > i and node.input[i] else None
        if got is not None and list(got) != shape:
            raise SpecError(f"{where}: input {label} has shape {list(got)}, its direction, hidden_size {hidden} and "
                            f"input features need {shape}")
    return hidden


def _map_recurrent(g: G, node: Any, ins: list, out: tuple) -> Mapped | None:
    """An LSTM, GRU or RNN node as dlsim's layer of that kind: one layer (the exporter writes a stacked
    nn.LSTM/GRU/RNN as one node per layer), as the torch importer maps ``aten.lstm``, ``aten.gru`` and
    ``aten.rnn_tanh``. The weights W, R and B must be what dlsim's layer holds (PyTorch's layout:
    g·(F·h + h·h) weights and 2·g·h biases per direction). A reverse direction, ``layout`` 1 (batch
    first), GRU's ``linear_before_reset``, ``clip``, ``input_forget``, other activations and sequence
    lengths change neither the gate products nor the weights, so they map too; peepholes (LSTM's P,
    3·h more weights per direction) and initial states computed from the input do not."""
    a = _attrs(node)
    x = node.input[0]
    peepholes = len(node.input) > 7 and node.input[7]
    if x not in g.active or peepholes or any(i in g.active for i in node.input[1:] if i):
        return None
    kind, direction, hidden = RECURRENT[node.op_type], a.get("direction", "forward"), check_recurrent(g, node)
    attrs = {"hidden": hidden, "layers": 1, "bias": len(node.input) > 3 and bool(node.input[3]),
             "bidirectional": direction == "bidirectional"}
    xin = g.shape(x)
    want = (xin[0], hidden * (2 if attrs["bidirectional"] else 1)) if len(xin) == 2 else None
    if want is None or not shape_fits(kind, attrs, [xin], want):
        return None
    sources = g.sources(node.input[1:4])
    if any(s in g.owner for s in sources):
        return None
    op = OPS[kind]
    _, params = infer(op, {**op.attrs, **attrs}, [xin], "check")
    if params != sum(int(math.prod(g.inits[s].dims)) for s in sources):
        return None
    return [("", {"type": kind, **attrs}, [g.alias[x]])]


def _map_pool(g: G, node: Any, ins: list, out: tuple) -> Mapped | None:
    if len(ins) != 1:
        return None
    if node.op_type == "GlobalAveragePool":
        if len(ins[0]) != 3 or tuple(out) != (ins[0][0], 1, 1):
            return None
        return [("_pool", {"type": "global_avgpool"}, None), ("", {"type": "reshape", "shape": list(out)}, ["_pool"])]
    a = _attrs(node)
    kernel = list(a["kernel_shape"])
    k = len(kernel)
    pads = list(a.get("pads", [0] * 2 * k))
    if pads[:k] != pads[k:] or a.get("auto_pad", "NOTSET") != "NOTSET":
        return None
    kind = "maxpool" if node.op_type == "MaxPool" else "avgpool"
    strides = list(a.get("strides", [1] * k))
    attrs = {"kernel": kernel, "stride": strides, "padding": pads[:k], "ceil_mode": bool(a.get("ceil_mode", 0))}
    if kind == "maxpool":
        attrs["dilation"] = list(a.get("dilations", [1] * k))
    if k == 1:
        attrs = {key: ([1] + v if key != "padding" else [0] + v) if isinstance(v, list) else v for key, v in attrs.items()}
        if len(ins[0]) != 2 or len(out) != 2:
            return None
        mid, pooled = (ins[0][0], 1, ins[0][1]), (out[0], 1, out[1])
        if not shape_fits(kind, attrs, [mid], pooled):
            return None
        return [("_in2d", {"type": "reshape", "shape": list(mid)}, None), ("_pool", {"type": kind, **attrs}, ["_in2d"]),
                ("", {"type": "reshape", "shape": list(out)}, ["_pool"])]
    attrs = {key: _pair(v) if isinstance(v, list) else v for key, v in attrs.items()}
    if not shape_fits(kind, attrs, ins, out):
        return None
    return [("", {"type": kind, **attrs}, None)]


def _map_view(g: G, node: Any, ins: list, out: tuple) -> Mapped | None:
    if len(ins) != 1 or not out or math.prod(ins[0]) != math.prod(out) or node.input[0] not in g.active:
        return None
    return [("", {"type": "reshape", "shape": list(out)}, None)]


MAP: dict[str, Callable[[G, Any, list, tuple], Mapped | None]] = {
    "Conv": _map_conv, "ConvTranspose": _map_conv, "Gemm": _map_gemm, "MatMul": _map_matmul,
    "BatchNormalization": _map_norm, "LayerNormalization": _map_norm, "InstanceNormalization": _map_instancenorm,
    "Relu": _map_activation, "Sigmoid": _map_activation, "Tanh": _map_activation, "Gelu": _map_activation,
    "Clip": _map_activation, "Softmax": _map_softmax, "Dropout": _map_dropout, "Add": _map_add,
    "Concat": _map_concat, "Gather": _map_gather,
    **{op: _map_recurrent for op in RECURRENT},
    "MaxPool": _map_pool, "AveragePool": _map_pool, "GlobalAveragePool": _map_pool,
    "Flatten": _map_view, "Reshape": _map_view, "Transpose": _map_view, "Squeeze": _map_view,
    "Unsqueeze": _map_view, "Identity": _map_view,
}
