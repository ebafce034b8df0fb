"""Reading YAML files into plain data, with one-line errors that name the file.

Every read is bounded before it is used: the file's size, its encoding (UTF-8; anything else is one
line naming the byte), the nesting depth, the number of nodes once aliases are expanded (an alias
bomb or a self-referencing alias is refused, not expanded) and the size of integers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dlsim.errors import SpecError, excerpt
from dlsim.io.files import read_text

MAX_DEPTH = 64             # nesting of mappings and sequences
MAX_NODES = 200_000        # nodes once every alias is expanded
MAX_INT_DIGITS = 40


class _BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that refuses deep nesting while composing (before Python's recursion limit)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D102
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"nested deeper than {MAX_DEPTH} levels (line {mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _bounded_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    digits = sum(ch.isdigit() for ch in node.value)
    if digits > MAX_INT_DIGITS:
        raise yaml.YAMLError(f"integer of {digits} digits on line {node.start_mark.line + 1} is out of range")
    return yaml.SafeLoader.construct_yaml_int(loader, node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _bounded_int)


def _expanded_size(node: yaml.Node) -> int:
    """Nodes in the tree once aliases are expanded; refuses cycles and trees over MAX_NODES."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def visit(n: yaml.Node) -> int:
        key = id(n)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise yaml.YAMLError("an alias refers to the node that contains it (a cycle)")
        active.add(key)
        total = 1
        if isinstance(n, yaml.SequenceNode):
            total += sum(visit(c) for c in n.value)
        elif isinstance(n, yaml.MappingNode):
            total += sum(visit(k) + visit(v) for k, v in n.value)
        active.discard(key)
        if total > MAX_NODES:
            raise yaml.YAMLError(f"more than {MAX_NODES} nodes once aliases are expanded (an alias bomb?)")
        sizes[key] = total
        return total

    return visit(node)


def parse_yaml_text(text: str) -> Any:
    """Parse YAML text with the bounds above; raises yaml.YAMLError (or RecursionError) on bad input."""
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def yaml_problem(exc: BaseException) -> tuple[str, str | None]:
    """(reason, 'line L, column C' or None) of a YAML error, short enough for one line."""
    if isinstance(exc, RecursionError):
        return f"nested deeper than {MAX_DEPTH} levels", None
    if isinstance(exc, ValueError) and not isinstance(exc, yaml.YAMLError):
        return f"malformed YAML: {excerpt(str(exc), 120)}", None
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["?"])[0]
    return f"malformed YAML: {problem if len(problem) <= 160 else problem[:160] + '...'}", where


def read_yaml(path: Path) -> Any:
    """Parse a YAML (or JSON) file; a syntax error becomes a SpecError with the line number."""
    text = read_text(path, "YAML file")
    try:
        return parse_yaml_text(text)
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        reason, where = yaml_problem(exc)
        raise SpecError(reason, path=path, field=where) from None


def expect_mapping(value: Any, path: Path, field: str) -> dict:
    if not isinstance(value, dict):
        raise SpecError(f"must be a mapping, got {type(value).__name__}", path=path, field=field)
    return value


def check_keys(data: dict, allowed: set[str], path: Path, field: str) -> None:
    """Reject unknown keys so a typo never passes silently."""
    unknown = sorted((k for k in data if k not in allowed), key=str)
    if unknown:
        first = excerpt(unknown[0], 40) if not isinstance(unknown[0], str) or len(unknown[0]) > 40 else unknown[0]
        label = f"{field}.{first}" if field else first
        raise SpecError(f"unknown field (allowed: {', '.join(sorted(allowed))})", path=path, field=label)
