"""Reading YAML files into plain data, with one-line errors that name the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dlsim.errors import SpecError


def read_yaml(path: Path) -> Any:
    """Parse a YAML (or JSON) file; a syntax error becomes a SpecError with the line number."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SpecError(f"cannot read file ({exc.strerror})", path=path) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"malformed YAML: {problem}", path=path, field=where) from None


def expect_mapping(value: Any, path: Path, field: str) -> dict:
    if not isinstance(value, dict):
        raise SpecError(f"must be a mapping, got {type(value).__name__}", path=path, field=field)
    return value


def check_keys(data: dict, allowed: set[str], path: Path, field: str) -> None:
    """Reject unknown keys so a typo never passes silently."""
    unknown = sorted(set(data) - allowed)
    if unknown:
        label = f"{field}.{unknown[0]}" if field else unknown[0]
        raise SpecError(f"unknown field (allowed: {', '.join(sorted(allowed))})", path=path, field=label)
