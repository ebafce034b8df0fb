"""Reading YAML files into plain data, with one-line errors that name the file.

Every read is bounded before it is used: the file's size, its encoding (UTF-8; anything else is one
line naming the byte), the nesting depth, the number of nodes once aliases are expanded (an alias
bomb or a self-referencing alias is refused, not expanded) and the size of integers. Only YAML's
safe types are built (no tag runs code); libyaml parses where it is installed.
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


_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser where PyYAML was built with it (about ten times faster), else the pure-Python one.
Either way only the safe constructors run: no tag creates a Python object."""


def _bounded_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    digits = sum(ch.isdigit() for ch in node.value)
    if digits > MAX_INT_DIGITS:
        raise yaml.YAMLError(f"integer of {digits} digits on line {node.start_mark.line + 1} is out of range")
    return yaml.SafeLoader.construct_yaml_int(loader, node)


class _BoundedLoader(_SafeLoader):  # type: ignore[misc, valid-type]
    """The safe loader with bounded integers; the pure-Python composer also refuses deep nesting while
    composing (before Python's recursion limit; libyaml refuses more than 1000 levels itself)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    if _SafeLoader is yaml.SafeLoader:
        def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D102
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    mark = self.peek_event().start_mark
                    raise yaml.YAMLError(f"nested deeper than {MAX_DEPTH} levels (line {mark.line + 1})")
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _bounded_int)


def _check_tree(root: yaml.Node) -> None:
    """Refuse a tree nested deeper than MAX_DEPTH, an alias cycle, or more than MAX_NODES nodes once
    aliases are expanded (an alias bomb); iterative, so that no input reaches Python's recursion limit."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        key = id(node)
        if done:
            children = node.value if isinstance(node, yaml.SequenceNode) else \
                [n for pair in node.value for n in pair]
            total = 1 + sum(sizes[id(c)] for c in children)
            if total > MAX_NODES:
                raise yaml.YAMLError(f"more than {MAX_NODES} nodes once aliases are expanded (an alias bomb?)")
            sizes[key] = total
            active.discard(key)
            continue
        if key in sizes:
            continue
        if key in active:
            raise yaml.YAMLError("an alias refers to the node that contains it (a cycle)")
        if depth > MAX_DEPTH:
            raise yaml.YAMLError(f"nested deeper than {MAX_DEPTH} levels (line {node.start_mark.line + 1})")
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = 1
            continue
        active.add(key)
        stack.append((node, depth, True))
        children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
        stack.extend((child, depth + 1, False) for child in reversed(children))


def parse_yaml_text(text: str) -> Any:
    """Parse YAML text with the bounds above; raises yaml.YAMLError (or RecursionError) on bad input."""
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_tree(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def yaml_problem(exc: BaseException) -> tuple[str, str | None]:
    """(reason, 'line L, column C' or None) of a YAML error, short enough for one line."""
    if isinstance(exc, RecursionError):
        return f"nested deeper than {MAX_DEPTH} levels", None
    if isinstance(exc, ValueError) and not isinstance(exc, yaml.YAMLError):
        return f"malformed YAML: {excerpt(str(exc), 120)}", None
    if "maximum nesting depth" in str(getattr(exc, "problem", "")):
        return f"nested deeper than {MAX_DEPTH} levels", None
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
