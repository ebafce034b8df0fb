"""Typed configuration records (pydantic v2) and their errors as one `SpecError` line.

Every file kind (model, hardware profile, strategy, sweep spec) is declared once as a pydantic
model at the boundary: its keys (unit in the name), their types, ranges and choices. The same
declaration validates what a user wrote, gives the JSON Schema shipped for editors
(`dlsim.io.schemas`) and words the error: `spec_error` turns pydantic's first error into
``file: field.path: reason`` with the reason read off the field's own schema ("must be an
integer >= 1, got 0", "unknown value 'zip' (use none, fp16, ...)", "unknown field (allowed:
...)"). The records are converted into the frozen dataclasses of `dlsim.spec`, which stay the
types inside the code.

Validation is strict (no "12" for 12, no true for 1, no 2.5 for an integer); lists and tuples are
accepted alike wherever a sequence is expected (`Seq`); numbers are finite.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Annotated, Any, TypeVar, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from dlsim.errors import SpecError, excerpt

T = TypeVar("T")


def as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


Seq = Annotated[tuple[T, ...], BeforeValidator(as_tuple)]
"""A sequence of T: a YAML list, a Python list or tuple; held as a tuple."""



def _listed(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _distinct(values: tuple) -> tuple:
    if len(set(map(repr, values))) != len(values):
        raise fail("lists a value twice")
    return values


def one_or_many(item: Any, max_items: int = 10_000) -> Any:
    """A value of type `item` or a list of distinct ones (at least one, at most `max_items`); held as a tuple."""
    many = Annotated[list[item], Field(min_length=1, max_length=max_items)]  # type: ignore[valid-type]
    return Annotated[tuple[item, ...], Field(min_length=1, max_length=max_items),
                     BeforeValidator(_listed, json_schema_input_type=Union[item, many]), AfterValidator(_distinct)]


Count = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
"""A fraction of a peak or a bandwidth, in (0, 1]."""
Text = Annotated[str, Field(max_length=100_000)]
Name = Annotated[str, Field(min_length=1, max_length=4096, pattern=r"\S")]
"""A name or a path: not blank."""


class Record(BaseModel):
    """Base of the configuration records: strict types, unknown keys refused, finite numbers."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False,
                              hide_input_in_errors=True)


def fail(message: str) -> PydanticCustomError:
    """An error a validator raises with the project's own wording (no pydantic prefix)."""
    return PydanticCustomError("dlsim", message)


def validate(model: type[BaseModel], data: Any, path: object = None, prefix: str = "",
             from_attributes: bool = False) -> Any:
    """`model` validated from `data` (a mapping; or an object's attributes, nested ones too, with
    `from_attributes`), or one `SpecError` naming `path`, the field (under `prefix`) and the reason."""
    try:
        return model.model_validate(data, from_attributes=from_attributes)
    except ValidationError as exc:
        raise spec_error(exc, model, path, prefix) from None


def field_path(loc: tuple, prefix: str = "") -> str:
    """A pydantic location as the project writes a field: ``layer_groups[0].parallel``."""
    out = prefix
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = str(part) if len(str(part)) <= 40 else excerpt(part, 40)
            out = f"{out}.{text}" if out else text
    return out


@cache
def _schema(model: type[BaseModel]) -> dict:
    return model.model_json_schema()


def _node(schema: dict, node: dict, want: str | None = None) -> dict:
    """`node` with its $ref followed and, of an anyOf, the branch of type `want` (else the first non-null)."""
    while True:
        if "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        elif "anyOf" in node:
            branches = [_node(schema, b) for b in node["anyOf"]]
            fits = [b for b in branches if want and b.get("type") == want] or \
                [b for b in branches if b.get("type") != "null"] or branches
            node = fits[0]
        else:
            return node


def _at(model: type[BaseModel], loc: tuple) -> dict:
    """The JSON Schema node of the field at `loc` ({} where it cannot be followed)."""
    schema = _schema(model)
    node = _node(schema, schema)
    for part in loc:
        if part == "[key]":
            return {"type": "string"}
        node = _node(schema, node, "array" if isinstance(part, int) else "object")
        if node.get("type") == "array":
            items = node.get("prefixItems")
            node = items[part] if items and isinstance(part, int) and part < len(items) else node.get("items", {})
        else:
            props = node.get("properties", {})
            node = props[part] if part in props else node.get("additionalProperties") or {}
            if node is True:
                node = {}
    return _node(schema, node)


def _number(value: Any) -> str:
    return repr(value)


def _wanted(node: dict) -> str:
    """What a bounded number must be, from its schema: "an integer >= 1", "a number in [0.0, 10.0]", "positive"."""
    kind = "an integer" if node.get("type") == "integer" else "a number"
    lo, xlo = node.get("minimum"), node.get("exclusiveMinimum")
    hi, xhi = node.get("maximum"), node.get("exclusiveMaximum")
    low, high = (lo if lo is not None else xlo), (hi if hi is not None else xhi)
    if low is not None and high is not None:
        return f"{kind} in {'[' if lo is not None else '('}{_number(low)}, {_number(high)}{']' if hi is not None else ')'}"
    if xlo == 0 and kind == "a number":
        return "positive"
    if lo == 0 and kind == "a number":
        return "non-negative"
    if low is not None:
        return f"{kind} {'>=' if lo is not None else '>'} {_number(low)}"
    if high is not None:
        return f"{kind} {'<=' if hi is not None else '<'} {_number(high)}"
    return kind


_TYPES = {"int_type": "an integer", "int_from_float": "an integer", "int_parsing": "an integer",
          "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
          "string_type": "a string", "tuple_type": "a list", "list_type": "a list", "set_type": "a list"}
_MAPPINGS = ("dict_type", "model_type", "model_attributes_type", "dataclass_type")
_BOUNDS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number")


def _reason(error: dict, model: type[BaseModel]) -> str:
    kind, loc, value = error["type"], error["loc"], error.get("input")
    got = excerpt(value)
    if kind == "missing":
        return "missing required field"
    if kind == "extra_forbidden":
        allowed = sorted(_node(_schema(model), _at(model, loc[:-1]), "object").get("properties", {}))
        return f"unknown field (allowed: {', '.join(allowed)})"
    if kind == "invalid_key":
        return f"keys must be strings, got {got}"
    if kind == "literal_error" or kind == "enum":
        expected = error["ctx"]["expected"]
        options = _at(model, loc).get("enum") or re.findall(r"'([^']*)'", expected) or [expected]
        noun = "key" if loc[-1:] == ("[key]",) else loc[-1] if loc and isinstance(loc[-1], str) else "value"
        return f"unknown {noun} {got} (use {', '.join(str(o) if o != '' else repr(o) for o in options)})"
    if loc[-1:] == ("[key]",):
        return f"invalid key {got} ({error['msg'].removeprefix('Input ').lower()})"
    if kind in _TYPES:
        return f"must be {_TYPES[kind]}, got {got}"
    if kind in _MAPPINGS:
        return f"must be a mapping, got {type(value).__name__}"
    if kind in _BOUNDS:
        return f"must be {_wanted(_at(model, loc))}, got {got}"
    if kind == "too_short":
        return "must not be empty" if error["ctx"].get("min_length") == 1 else \
            f"must have at least {error['ctx']['min_length']} items"
    if kind == "too_long":
        return f"has {error['ctx'].get('actual_length', 'too many')} items (at most {error['ctx']['max_length']})"
    if kind == "string_too_long":
        return f"a string of {len(value)} characters (at most {error['ctx']['max_length']})"
    if kind in ("string_too_short", "string_pattern_mismatch"):
        return f"must not be blank, got {got}"
    message = error["msg"]
    return message.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def spec_error(exc: ValidationError, model: type[BaseModel], path: object = None, prefix: str = "") -> SpecError:
    """The first error of `exc` (an unknown key before others) as one `SpecError` line: ``path: field: reason``."""
    errors = exc.errors(include_url=False)
    # an unknown key first: a misspelt key also leaves its required field missing
    error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    return SpecError(_reason(error, model), path=path, field=field_path(error["loc"], prefix) or None)
