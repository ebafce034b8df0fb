"""Import a PyTorch `nn.Module` as a dlsim network description (YAML-ready dict).

The module is traced with `torch.fx.symbolic_trace` and its tensor shapes propagated with
`ShapeProp` on an example input; each call maps onto one dlsim operator. torch is imported
lazily: the rest of dlsim never needs it.
"""

from __future__ import annotations

import operator
from typing import Any

from dlsim.errors import SpecError


def _pair(v: Any) -> Any:
    if isinstance(v, (tuple, list)):
        return list(v) if v[0] != v[1] else int(v[0])
    return int(v)


def _module_entry(mod: Any, nn: Any, in_shape: tuple, out_shape: tuple) -> dict | None:
    """dlsim operator attributes for a leaf module, or None when it is not supported."""
    if isinstance(mod, nn.Conv2d):
        if mod.padding_mode != "zeros" or isinstance(mod.padding, str) and mod.padding != "same":
            return None
        return {"type": "conv2d", "out_channels": mod.out_channels, "kernel": _pair(mod.kernel_size),
                "stride": _pair(mod.stride), "padding": mod.padding if isinstance(mod.padding, str) else _pair(mod.padding),
                "dilation": _pair(mod.dilation), "groups": mod.groups, "bias": mod.bias is not None}
    if isinstance(mod, nn.Linear):
        return {"type": "linear", "out_features": mod.out_features, "bias": mod.bias is not None}
    if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)):
        return {"type": "batchnorm", "affine": mod.affine}
    if isinstance(mod, nn.LayerNorm):
        return {"type": "layernorm", "affine": mod.elementwise_affine}
    if isinstance(mod, nn.LocalResponseNorm):
        return {"type": "lrn", "size": mod.size, "alpha": mod.alpha, "beta": mod.beta, "k": mod.k}
    if isinstance(mod, (nn.MaxPool2d, nn.AvgPool2d)):
        kind = "maxpool" if isinstance(mod, nn.MaxPool2d) else "avgpool"
        return {"type": kind, "kernel": _pair(mod.kernel_size), "stride": _pair(mod.stride or mod.kernel_size),
                "padding": _pair(mod.padding), "ceil_mode": bool(mod.ceil_mode)}
    if isinstance(mod, (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)):
        if len(out_shape) == 4 and tuple(out_shape[2:]) == (1, 1):
            return {"type": "global_avgpool" if isinstance(mod, nn.AdaptiveAvgPool2d) else "global_maxpool",
                    "_keep4d": True}
        return None
    if isinstance(mod, nn.Embedding):
        return {"type": "embedding", "vocab": mod.num_embeddings, "dim": mod.embedding_dim}
    if isinstance(mod, (nn.LSTM, nn.GRU, nn.RNN)) and mod.batch_first:
        kind = {nn.LSTM: "lstm", nn.GRU: "gru", nn.RNN: "rnn"}[type(mod)]
        return {"type": kind, "hidden": mod.hidden_size, "layers": mod.num_layers, "bias": mod.bias,
                "bidirectional": mod.bidirectional}
    simple = {nn.ReLU: "relu", nn.GELU: "gelu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.Flatten: "flatten"}
    for cls, kind in simple.items():
        if isinstance(mod, cls):
            return {"type": kind}
    if isinstance(mod, nn.Softmax):
        return {"type": "softmax"}
    if isinstance(mod, nn.Dropout):
        return {"type": "dropout", "p": mod.p}
    return None


def _function_entry(target: Any, torch: Any, F: Any) -> dict | None:
    table = {F.relu: "relu", torch.relu: "relu", F.gelu: "gelu", torch.tanh: "tanh", torch.sigmoid: "sigmoid",
             F.softmax: "softmax", torch.softmax: "softmax", torch.flatten: "flatten", F.dropout: "dropout",
             operator.add: "add", torch.add: "add", torch.cat: "concat", torch.concat: "concat"}
    kind = table.get(target)
    return {"type": kind} if kind else None


def import_torch_module(module: Any, example_input: Any, name: str = "imported") -> dict:
    """A dlsim description (a dict to dump as YAML) of `module` traced on `example_input` (batch first)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.fx import symbolic_trace
    from torch.fx.passes.shape_prop import ShapeProp

    try:
        graph = symbolic_trace(module)
    except Exception as exc:  # torch raises many kinds for untraceable control flow
        raise SpecError(f"torch.fx cannot trace the module: {exc}".splitlines()[0]) from None
    ShapeProp(graph).propagate(example_input)
    modules = dict(graph.named_modules())
    names: dict[str, str] = {}
    layers: list[dict] = []
    input_entry: dict = {}
    for node in graph.graph.nodes:
        meta = node.meta.get("tensor_meta")
        if node.op == "placeholder":
            if meta is None:
                raise SpecError(f"input {node.name!r} is not a tensor")
            shape = list(meta.shape[1:])
            is_int = not meta.dtype.is_floating_point
            input_entry = {"tokens": shape[0]} if is_int and len(shape) == 1 else {"shape": shape}
            names[node.name] = "input"
            continue
        if node.op == "output":
            continue
        args = [a for a in node.args if isinstance(a, torch.fx.Node)]
        if node.op == "call_function" and node.target in (torch.cat, torch.concat) and node.args:
            args = [a for a in node.args[0] if isinstance(a, torch.fx.Node)]
        if node.op == "call_module":
            mod = modules[node.target]
            in_shape = tuple(args[0].meta["tensor_meta"].shape) if args and "tensor_meta" in args[0].meta else ()
            out_shape = tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else ()
            entry = _module_entry(mod, nn, in_shape, out_shape)
            what = f"module {node.target!r} ({type(mod).__name__})"
        elif node.op == "call_function":
            entry = _function_entry(node.target, torch, F)
            what = f"function {getattr(node.target, '__name__', node.target)!r}"
        elif node.op == "call_method" and node.target in ("view", "reshape", "flatten"):
            entry = {"type": "flatten"} if node.target == "flatten" else {
                "type": "reshape", "shape": [int(d) for d in meta.shape[1:]]}
            what = f"method {node.target!r}"
        else:
            entry, what = None, f"{node.op} {node.target!r}"
        if entry is None:
            raise SpecError(f"no dlsim operator for {what} at node {node.name!r}")
        keep4d = entry.pop("_keep4d", False)
        entry = {"name": node.name, **entry, "inputs": [names[a.name] for a in args]}
        layers.append(entry)
        names[node.name] = node.name
        if keep4d:  # adaptive pooling to 1x1 keeps (C, 1, 1); dlsim's global pooling gives (C,)
            layers.append({"name": f"{node.name}_4d", "type": "reshape", "shape": [int(d) for d in meta.shape[1:]],
                           "inputs": [node.name]})
            names[node.name] = f"{node.name}_4d"
    dtype = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(next(module.parameters(), torch.zeros(1)).dtype, "fp32")
    return {"name": name, "dtype": dtype, "input": input_entry, "layers": layers}
