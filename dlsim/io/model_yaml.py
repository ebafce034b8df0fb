"""Loading a network description (YAML) into a `Model`.

A description has ``name``, ``dtype``, ``input`` (``{shape: [C, H, W]}`` or ``{tokens: L}``),
``params`` (named numbers usable as ``$name`` or ``${expr}`` anywhere), ``blocks`` (parametric
sub-graphs) and ``layers``. ``extends: other`` starts from another description and overrides it
(``params`` are merged), so model families are a few lines each.

A layer entry is either an operator ``{name, type, inputs?, ...attrs}`` or a block call
``{name, block, repeat?, args?}``. Inside a block, ``input`` names the block's input, ``$index``
is the repeat index and ``when: ${expr}`` drops a layer for some repeats. Repeats are chained:
the input of repeat i+1 is the last layer of repeat i.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Mapping

from pydantic import Field, WithJsonSchema

from dlsim.errors import SpecError, excerpt
from dlsim.io.expr import ExprError, substitute
from dlsim.io.model_schema import VALUE_SCHEMA, Block, LayerEntry
from dlsim.io.paths import resolve_model
from dlsim.io.yamlfile import read_yaml
from dlsim.spec.model import INPUT, Model, build_model
from dlsim.spec.typed import Name, Record, Seq, Text, validate

_MAX_DEPTH = 8
MAX_LAYERS = 50_000          # operators once blocks are expanded
MAX_INT = 2**40              # any integer attribute (sizes, counts)
MAX_ELEMENTS = 2**50         # elements of one layer's output per sample, or of its parameters
MAX_LIST = 16                # items of a list-valued attribute (kernel: [3, 3], shape: [...])


Value = Annotated[Any, WithJsonSchema(VALUE_SCHEMA)]


class InputRecord(Record):
    """The model's input per sample: a tensor shape or a token count (numbers or ``$param`` expressions)."""

    model_config = {"json_schema_extra": {"oneOf": [{"required": ["shape"]}, {"required": ["tokens"]}]}}
    shape: Seq[int | str] | None = Field(None, description="[C, H, W]")
    tokens: int | str | None = Field(None, description="sequence length L")


class BlockCall(Record):
    """A layer entry that calls a block: ``{name, block, repeat?, args?, inputs?, when?}``."""

    name: Any = None
    block: Any = None
    repeat: Value = None
    args: Value = None
    inputs: Value = None
    when: Value = None


class ModelFile(Record):
    """A network description (one file; ``extends`` merges it over another)."""

    name: Name | None = None
    description: Text | None = None
    source: Text | None = None
    dtype: str | None = Field(None, description="fp32 (default), fp16, bf16, fp8")
    input: InputRecord | None = None
    params: dict[str, Value] | None = Field(None, description="named numbers, usable as $name or ${expr}")
    blocks: dict[str, Block] | None = Field(None, description="parametric sub-graphs, called by name")
    layers: list[LayerEntry] | None = None
    extends: Name | None = Field(None, description="a zoo model or a path, relative to this file")
    stack: Annotated[str, Field(max_length=200)] | None = Field(
        None, description="the software stack it is usually trained with (dlsim stacks), when a run names none")
    published: dict[str, Annotated[float, Field(ge=0, le=MAX_ELEMENTS * 1e6)]] | None = Field(
        None, description="published reference numbers (parameters, FLOPs), for tests and reports")


def _check_value(value: Any, path: Path, where: str) -> None:
    """A layer attribute is a bounded scalar or a short list of bounded scalars."""
    items = value if isinstance(value, list) else [value]
    if isinstance(value, list) and len(value) > MAX_LIST:
        raise SpecError(f"a list of {len(value)} items (at most {MAX_LIST})", path=path, field=where)
    for item in items:
        if isinstance(item, bool) or item is None:
            continue
        if isinstance(item, int):
            if abs(item) > MAX_INT:
                raise SpecError(f"{excerpt(item)} is out of range (at most {MAX_INT})", path=path, field=where)
        elif isinstance(item, float):
            if not math.isfinite(item) or abs(item) > MAX_INT:
                raise SpecError(f"{item!r} is not a finite number up to {MAX_INT}", path=path, field=where)
        elif isinstance(item, str):
            if len(item) > 200:
                raise SpecError(f"a string of {len(item)} characters (at most 200)", path=path, field=where)
        else:
            kind = "list" if isinstance(item, list) else "mapping" if isinstance(item, dict) else type(item).__name__
            raise SpecError(f"must be a number, a string or a list of them, got a {kind}", path=path, field=where)


def _load_raw(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    if path.resolve() in chain:
        raise SpecError("extends forms a cycle", path=path, field="extends")
    data = read_yaml(path)
    validate(ModelFile, data, path)
    if "extends" not in data:
        return dict(data)
    parent = _load_raw(resolve_model(data["extends"], relative_to=path.parent), chain + (path.resolve(),))
    merged = {**parent, **{k: v for k, v in data.items() if k != "extends"}}
    for key in ("params", "blocks"):
        merged[key] = {**(parent.get(key) or {}), **(data.get(key) or {})}
    return merged


class _Expander:
    """Expands block calls into flat operator entries with unique, dotted names."""

    def __init__(self, path: Path, blocks: dict, params: Mapping[str, Any]):
        self.path, self.blocks, self.params = path, blocks, params
        self.out: list[dict] = []

    def _sub(self, value: Any, names: Mapping[str, Any], where: str) -> Any:
        try:
            return substitute(value, names)
        except (ExprError, ZeroDivisionError, TypeError) as exc:
            raise SpecError(str(exc), path=self.path, field=where) from None

    def expand(self, entries: Any, names: Mapping[str, Any], prefix: str, block_input: str,
               where: str, depth: int = 0) -> str:
        """Append the entries' operators; return the name of the last one (the scope's output)."""
        if not isinstance(entries, list):
            raise SpecError("must be a list of layers", path=self.path, field=where)
        local: dict[str, str] = {INPUT: block_input}
        last = block_input
        for i, raw in enumerate(entries):
            here = f"{where}[{i}]"
            if not isinstance(raw, dict):
                raise SpecError(f"must be a mapping, got {type(raw).__name__}", path=self.path, field=here)
            if "when" in raw and not self._sub(raw["when"], names, f"{here}.when"):
                continue
            name = raw.get("name")
            if not isinstance(name, str) or not name or name == INPUT or "." in name:
                raise SpecError("every layer needs a name without dots, other than 'input'",
                                path=self.path, field=f"{here}.name")
            here = f"{where}[{i}] {name!r}" if depth == 0 else f"{where}[{i}] {prefix}{name!r}"
            full = prefix + name
            if "block" in raw:
                last = self._call(raw, names, full, last, here, depth)
            else:
                entry = {k: self._sub(v, names, f"{here}.{k}") for k, v in raw.items() if k not in ("inputs", "when")}
                if "inputs" in raw:
                    inputs = self._sub(raw["inputs"], names, f"{here}.inputs")
                    inputs = [inputs] if isinstance(inputs, str) else inputs
                    if not isinstance(inputs, list) or not all(isinstance(s, str) for s in inputs):
                        raise SpecError("inputs must be a list of layer names", path=self.path, field=f"{here}.inputs")
                    entry["inputs"] = [local.get(s, s) for s in inputs]
                else:
                    entry["inputs"] = [last]
                if isinstance(entry.get("tied_to"), str):
                    entry["tied_to"] = local.get(entry["tied_to"], entry["tied_to"])
                for key, value in entry.items():
                    if key != "inputs":
                        _check_value(value, self.path, f"{here}.{key}")
                if len(self.out) >= MAX_LAYERS:
                    raise SpecError(f"more than {MAX_LAYERS} layers once blocks are expanded", path=self.path, field=here)
                entry["name"], entry["where"] = full, here
                self.out.append(entry)
                last = full
            local[name] = last
        return last

    def _call(self, raw: dict, names: Mapping[str, Any], full: str, previous: str, here: str, depth: int) -> str:
        validate(BlockCall, raw, self.path, here)
        if depth >= _MAX_DEPTH:
            raise SpecError(f"blocks nested deeper than {_MAX_DEPTH}", path=self.path, field=here)
        bname = raw["block"]
        if not isinstance(bname, str) or bname not in self.blocks:
            raise SpecError(f"unknown block {excerpt(bname)} (defined: {', '.join(self.blocks) or 'none'})",
                            path=self.path, field=f"{here}.block")
        block = self.blocks[bname]
        if isinstance(block, list):
            block = {"layers": block}
        if not isinstance(block, dict):
            raise SpecError(f"must be a mapping, got {type(block).__name__}", path=self.path, field=f"blocks.{bname}")
        repeat = self._sub(raw.get("repeat", 1), names, f"{here}.repeat")
        if isinstance(repeat, bool) or not isinstance(repeat, int) or not 1 <= repeat <= MAX_LAYERS:
            raise SpecError(f"repeat must be an integer in [1, {MAX_LAYERS}], got {excerpt(repeat)}",
                            path=self.path, field=f"{here}.repeat")
        args = self._sub(raw.get("args", {}), names, f"{here}.args")
        defaults = self._sub(block.get("args", {}), names, f"blocks.{bname}.args")
        if not isinstance(args, dict) or not isinstance(defaults, dict):
            raise SpecError("args must be a mapping", path=self.path, field=f"{here}.args")
        first_input = previous
        if "inputs" in raw:
            first_input = self._sub(raw["inputs"], names, f"{here}.inputs")
            first_input = first_input[0] if isinstance(first_input, list) else first_input
        last = first_input
        for index in range(repeat):
            scope = {**names, **defaults, **args, "index": index, "repeat": repeat}
            prefix = f"{full}.{index}." if repeat > 1 else f"{full}."
            last = self.expand(block.get("layers"), scope, prefix, last, f"blocks.{bname}.layers", depth + 1)
        return last


def load_model(name_or_path: str | Path, overrides: Mapping[str, Any] | None = None) -> Model:
    """Load a zoo model name or a YAML path; `overrides` replace entries of ``params``."""
    path = resolve_model(name_or_path)
    raw = _load_raw(path)
    params = raw.get("params") or {}
    for key in overrides or {}:
        if key not in params:
            raise SpecError(f"unknown parameter {key!r} (model parameters: {', '.join(params) or 'none'})",
                            path=path, field="params")
    params = {**params, **(overrides or {})}
    for key, value in params.items():
        _check_value(value, path, f"params.{key}")
    names: dict[str, Any] = {}
    for key, value in params.items():  # params may refer to earlier params
        try:
            names[key] = substitute(value, names)
        except (ExprError, ZeroDivisionError, TypeError) as exc:
            raise SpecError(str(exc), path=path, field=f"params.{key}") from None
    blocks = {str(k): v for k, v in (raw.get("blocks") or {}).items()}
    inp = raw.get("input")
    if inp is None:
        raise SpecError("missing required field", path=path, field="input")
    if ("shape" in inp) == ("tokens" in inp):
        raise SpecError("give exactly one of shape: [C, H, W] or tokens: L", path=path, field="input")
    expander = _Expander(path, blocks, names)
    if "tokens" in inp:
        shape, kind = [expander._sub(inp["tokens"], names, "input.tokens")], "tokens"
    else:
        shape, kind = expander._sub(inp["shape"], names, "input.shape"), "tensor"
        if not isinstance(shape, list):
            raise SpecError("shape must be a list of sizes", path=path, field="input.shape")
    if not isinstance(shape, list) or len(shape) > MAX_LIST or any(
            isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= MAX_INT for d in shape):
        raise SpecError(f"input shape must be positive integers (at most {MAX_LIST} of them, each up to {MAX_INT}), "
                        f"got {excerpt(shape)}",
                        path=path, field=f"input.{'tokens' if kind == 'tokens' else 'shape'}")
    expander.expand(raw.get("layers"), names, "", INPUT, "layers")
    name = raw.get("name") or path.stem
    dtype = raw.get("dtype") or "fp32"
    try:
        model = build_model(excerpt(name, 80) if len(name) > 80 else name, dtype, shape,
                            kind, expander.out, source=str(path), params_used=names)
    except (TypeError, ValueError, OverflowError, ZeroDivisionError, KeyError, IndexError) as exc:
        raise SpecError(f"malformed description ({type(exc).__name__}: {excerpt(str(exc), 120)})", path=path) from None
    stack = raw.get("stack") or ""
    if stack:
        model = replace(model, stack=stack)
    for layer in model.layers:
        for what, count in (("output elements per sample", math.prod(layer.out_shape)), ("parameters", layer.params)):
            if count > MAX_ELEMENTS:
                raise SpecError(f"{count:.3g} {what}; the limit is 2**50 (a size out of range?)", path=path,
                                field=f"layer {layer.name!r}")
    return model
