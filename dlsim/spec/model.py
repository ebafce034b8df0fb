"""A network: a DAG of layers with per-sample shapes inferred from the input."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from dlsim.errors import SpecError, excerpt
from dlsim.spec.ops import GELU_FORMS, MEMORY_FORMATS, OPS, REQUIRED, Shape, infer
from dlsim.units import DTYPE_BYTES

INPUT = "input"


@dataclass(frozen=True)
class Layer:
    """One operator instance. Shapes exclude the batch dimension."""

    name: str
    type: str
    inputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    in_shapes: tuple[Shape, ...]
    out_shape: Shape
    params: int

    @property
    def in_elements(self) -> int:
        """Elements of all inputs, per sample."""
        return sum(math.prod(s) for s in self.in_shapes)

    @property
    def out_elements(self) -> int:
        """Elements of the output, per sample."""
        return math.prod(self.out_shape)


@dataclass(frozen=True)
class Model:
    """A network description after validation and shape inference.

    `input_shape` is per sample; `input_kind` is ``"tensor"`` (float data) or ``"tokens"``
    (integer ids). `layers` are in a topological order.
    """

    name: str
    dtype: str
    input_shape: Shape
    input_kind: str
    layers: tuple[Layer, ...]
    source: str = ""
    params_used: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    stack: str = ""
    """The software stack the model was trained with (`dlsim.spec.stack`; empty: none named)."""

    @property
    def params(self) -> int:
        """Trainable parameters (shared weights counted once)."""
        return sum(layer.params for layer in self.layers)

    @property
    def active_params(self) -> int:
        """Parameters one token passes through: a mixture of experts counts its router, its top-k
        routed and its shared experts (`OpType.active`); every other layer all of its parameters."""
        total = 0
        for layer in self.layers:
            rule = OPS[layer.type].active
            total += rule(dict(layer.attrs), list(layer.in_shapes), layer.out_shape) if rule else layer.params
        return total

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)


_PROBABILITIES = {("dropout", "p"), ("attention", "dropout"), ("sdpa", "dropout")}


def _check_attr(kind: str, key: str, value: Any, default: Any, source: Any, where: str) -> None:
    """A flag is true or false, a real-valued attribute a finite number, a dropout probability in [0, 1), a
    GELU's form tanh or none, a convolution's memory format contiguous or channels_last."""
    choices = {("gelu", "approximate"): GELU_FORMS, ("conv2d", "memory_format"): MEMORY_FORMATS}.get((kind, key))
    if choices and value not in choices:
        raise SpecError(f"must be {' or '.join(choices)}, got {excerpt(value)}", path=source, field=f"{where}.{key}")
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise SpecError(f"must be true or false, got {excerpt(value)}", path=source, field=f"{where}.{key}")
    elif isinstance(default, float) or (kind, key) in _PROBABILITIES:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SpecError(f"must be a number, got {excerpt(value)}", path=source, field=f"{where}.{key}")
        if (kind, key) in _PROBABILITIES and not 0 <= value < 1:
            raise SpecError(f"a dropout probability must be in [0, 1), got {value!r}", path=source, field=f"{where}.{key}")


HOST_OPS = "host_ops"
"""A field any layer may carry: [forward, backward] ATen operators the layer dispatches in an eager step
(set by the PyTorch importer; priced by `dlsim.cost.hostops`)."""


def _check_host_ops(value: Any, source: str, where: str) -> None:
    if not (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
        raise SpecError(f"host_ops must be [forward, backward] operator counts (non-negative integers), got {value!r}",
                        path=source, field=f"{where}.{HOST_OPS}")


ALLOCATED_BYTES = "allocated_bytes"
"""A field any layer may carry: [forward fixed, forward per sample, backward fixed, backward per sample],
the bytes an eager step's operators of the layer request from the CPU allocator in each pass, as
fixed + per_sample · batch (set by the PyTorch importer, which measures them at two batch sizes;
priced by `dlsim.cost.allocation`)."""


def _check_allocated_bytes(value: Any, source: str, where: str) -> None:
    if not (isinstance(value, (list, tuple)) and len(value) == 4 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in value)):
        raise SpecError("allocated_bytes must be [forward fixed, forward per sample, backward fixed, backward per "
                        f"sample] (non-negative numbers), got {excerpt(value)}", path=source,
                        field=f"{where}.{ALLOCATED_BYTES}")


def build_model(name: str, dtype: str, input_shape: Iterable[int], input_kind: str,
                entries: list[dict], *, source: str = "", params_used: Mapping | None = None) -> Model:
    """Validate layer entries and infer shapes through the DAG.

    Each entry is ``{"name", "type", "inputs": [names] or None, "where": field path, **attrs}``;
    ``inputs`` of None means "the previous layer" (the model input for the first one).
    Errors name the source file, the field (``layers[i] 'name'``) and the reason.
    """
    if dtype not in DTYPE_BYTES or dtype in ("int8", "int64"):
        raise SpecError(f"unknown dtype {dtype!r} (use fp32, fp16, bf16, fp8)", path=source, field="dtype")
    shape = tuple(input_shape)
    if not shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
        raise SpecError(f"input shape must be positive integers, got {list(shape)}", path=source, field="input")
    shapes: dict[str, Shape] = {INPUT: shape}
    layers: list[Layer] = []
    previous = INPUT
    for entry in entries:
        where = entry.get("where", "layers")
        lname = entry.get("name")
        if not isinstance(lname, str) or not lname:
            raise SpecError("every layer needs a name", path=source, field=where)
        if lname in shapes:
            raise SpecError(f"duplicate layer name {lname!r}", path=source, field=where)
        kind = entry.get("type")
        if kind not in OPS:
            raise SpecError(f"unknown layer type {kind!r} (known: {', '.join(sorted(OPS))})",
                            path=source, field=f"{where}.type")
        op = OPS[kind]
        attrs = {}
        for key, value in entry.items():
            if key in ("name", "type", "inputs", "where"):
                continue
            if key == HOST_OPS:
                _check_host_ops(value, source, where)
            elif key == ALLOCATED_BYTES:
                _check_allocated_bytes(value, source, where)
            elif key not in op.attrs:
                raise SpecError(f"unknown field for {kind} (known: {', '.join(op.attrs) or 'none'})",
                                path=source, field=f"{where}.{key}")
            attrs[key] = value
        for key, default in op.attrs.items():
            if key not in attrs:
                if default is REQUIRED:
                    raise SpecError(f"missing required field for {kind}", path=source, field=f"{where}.{key}")
                attrs[key] = default
            _check_attr(kind, key, attrs[key], default, source, where)
        inputs = entry.get("inputs") or [previous]
        if isinstance(inputs, str):
            inputs = [inputs]
        for src in inputs:
            if src not in shapes:
                raise SpecError(f"input {src!r} is not a layer defined before it", path=source, field=f"{where}.inputs")
        if attrs.get("tied_to") and attrs["tied_to"] not in shapes:
            raise SpecError(f"tied_to {attrs['tied_to']!r} is not a layer defined before it",
                            path=source, field=f"{where}.tied_to")
        in_shapes = [shapes[s] for s in inputs]
        out, nparams = infer(op, attrs, in_shapes, lname, where=source or None)
        shapes[lname] = out
        layers.append(Layer(lname, kind, tuple(inputs), MappingProxyType(attrs), tuple(in_shapes), out, nparams))
        previous = lname
    if not layers:
        raise SpecError("a model needs at least one layer", path=source, field="layers")
    return Model(name, dtype, shape, input_kind, tuple(layers), source,
                 MappingProxyType(dict(params_used or {})))


def with_input(model: Model, input_shape: Iterable[int], *,
               layer_attrs: Mapping[str, Mapping[str, Any]] | None = None) -> Model:
    """`model` for another per-sample input shape, with `layer_attrs` (layer type -> attributes) set on every
    layer of that type, every layer validated and its shapes inferred again (`build_model`)."""
    extra = layer_attrs or {}
    entries = [{"name": layer.name, "type": layer.type, "inputs": list(layer.inputs), **layer.attrs,
                **extra.get(layer.type, {})} for layer in model.layers]
    return build_model(model.name, model.dtype, input_shape, model.input_kind, entries, source=model.source,
                       params_used=model.params_used)
