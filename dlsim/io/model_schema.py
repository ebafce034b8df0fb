"""The JSON Schema of a model file's layer entries, generated from the operator table (`dlsim.spec.ops.OPS`).

A layer entry is an operator ``{name, type, inputs?, when?, ...attributes}`` or a block call ``{name,
block, repeat?, args?, inputs?, when?}``. Attribute values may be ``$param`` or ``${expr}`` strings,
substituted when the model is loaded, so the schema names each operator's attributes (for an
editor's completion and to catch a misspelt one) and which are required, while their values are
checked after substitution (`dlsim.spec.model.build_model`), where the shapes are known.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import core_schema

from dlsim.spec.model import ALLOCATED_BYTES, HOST_OPS
from dlsim.spec.ops import OPS, REQUIRED

VALUE_SCHEMA: dict = {"type": ["number", "string", "boolean", "array", "null"],
                      "description": "a number, a string, a list of them, or a $param / ${expr} string"}
_NAMES = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
_COMMON = {
    "name": {"type": "string", "description": "unique within its scope, without dots"},
    "inputs": {**_NAMES, "description": "the layers it reads (default: the previous one; 'input': the scope's input)"},
    "when": {"description": "${expr}: the entry is dropped where it is false (inside a block)"},
}


def _operator(name: str) -> dict:
    op = OPS[name]
    attrs = {key: dict(VALUE_SCHEMA, description=f"default {default!r}" if default is not REQUIRED else "required")
             for key, default in op.attrs.items()}
    return {
        "type": "object", "description": f"{name}: {op.doc}",
        "properties": {**_COMMON, "type": {"const": name}, **attrs,
                       HOST_OPS: {"type": "array", "description": "[forward, backward] ATen operators (importer)"},
                       ALLOCATED_BYTES: {"type": "array", "description": "allocator bytes per pass (importer)"}},
        "required": ["name", "type"] + [k for k, d in op.attrs.items() if d is REQUIRED],
        "additionalProperties": False,
    }


_CALL = {
    "type": "object", "description": "a block call, repeated `repeat` times in a chain",
    "properties": {**_COMMON, "block": {"type": "string"}, "repeat": VALUE_SCHEMA,
                   "args": {"type": ["object", "string"], "description": "values of the block's args"}},
    "required": ["name", "block"], "additionalProperties": False,
}

class LayerEntry(dict):
    """A layer entry in a typed record: a mapping, checked in full once expanded (`build_model`); its JSON
    Schema is defined once, as ``$defs/Layer``, from `OPS`."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema(), strict=True, ref="Layer")

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict:
        return {"anyOf": [_CALL] + [_operator(name) for name in sorted(OPS)]}


class Block:
    """A block definition: its layers, or ``{args: {defaults}, layers: [...]}`` (checked when called)."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.any_schema()

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict:
        layers = handler(core_schema.list_schema(core_schema.definition_reference_schema("Layer")))
        return {"anyOf": [layers, {
            "type": "object", "required": ["layers"], "additionalProperties": False,
            "properties": {"args": {"type": "object", "description": "default values of the block's args"},
                           "layers": layers}}]}
