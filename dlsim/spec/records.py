"""Frozen dataclass records made and copied without their constructors, where a search makes them by
the hundred thousand.

A frozen dataclass's `__init__` sets each field through `object.__setattr__`, and
`dataclasses.replace` runs that `__init__` again; for records with no derived state (no
`__post_init__`, no `default_factory`) the instance is its `__dict__`, so filling that dictionary
makes the same record in a fraction of the time. The records stay frozen: assigning a field still
raises. `made` and `replaced` refuse a class they cannot make this way (checked once per class).
"""

from __future__ import annotations

from dataclasses import MISSING, fields, is_dataclass
from typing import Any, TypeVar

R = TypeVar("R")

_DEFAULTS: dict[type, dict[str, Any]] = {}  # per class: its fields' defaults (the check done)


def _defaults(cls: type) -> dict[str, Any]:
    got = _DEFAULTS.get(cls)
    if got is None:
        if not is_dataclass(cls) or hasattr(cls, "__post_init__") or hasattr(cls, "__slots__") or any(
                f.default_factory is not MISSING for f in fields(cls)):
            raise TypeError(f"{cls.__name__} is not a plain frozen dataclass record")
        got = _DEFAULTS[cls] = {f.name: f.default for f in fields(cls) if f.default is not MISSING}
    return got


def made(cls: type[R], **values: Any) -> R:
    """`cls(**values)`: the fields' defaults, then `values` (which must name fields only)."""
    defaults = _defaults(cls)
    out = object.__new__(cls)
    out.__dict__.update(defaults, **values)
    return out  # type: ignore[return-value]


def replaced(record: R, **changes: Any) -> R:
    """`dataclasses.replace(record, **changes)` (`changes` must name fields only)."""
    cls = type(record)
    _defaults(cls)
    out = object.__new__(cls)
    out.__dict__.update(record.__dict__, **changes)
    return out
