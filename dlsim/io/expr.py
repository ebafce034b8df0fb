"""Safe evaluation of the small expressions allowed in descriptions: ``$hidden``, ``${4 * hidden}``."""

from __future__ import annotations

import ast
import operator
from typing import Any, Mapping

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}


class ExprError(ValueError):
    """An expression that cannot be evaluated."""


def _eval(node: ast.AST, names: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body, names)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise ExprError(f"unknown name {node.id!r} (defined: {', '.join(sorted(names)) or 'none'})")
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_eval(node.left, names), _eval(node.right, names))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
        value = _eval(node.operand, names)
        return -value if isinstance(node.op, ast.USub) else (not value if isinstance(node.op, ast.Not) else value)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        return _COMPARE[type(node.ops[0])](_eval(node.left, names), _eval(node.comparators[0], names))
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, names) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.IfExp):
        return _eval(node.body, names) if _eval(node.test, names) else _eval(node.orelse, names)
    if isinstance(node, ast.Subscript):
        container, index = _eval(node.value, names), _eval(node.slice, names)
        try:
            return container[index]
        except (IndexError, KeyError, TypeError):
            raise ExprError(f"cannot index {container!r} with {index!r}") from None
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_eval(e, names) for e in node.elts]
    raise ExprError(f"unsupported expression element {type(node).__name__}")


def evaluate(text: str, names: Mapping[str, Any]) -> Any:
    """Evaluate arithmetic, comparisons and ``a if c else b`` over `names`; integral floats become ints."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"cannot parse expression {text!r}: {exc.msg}") from None
    value = _eval(tree, names)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def substitute(value: Any, names: Mapping[str, Any]) -> Any:
    """Replace ``$name`` and ``${expr}`` strings (recursively in lists and dicts) by their values."""
    if isinstance(value, str) and value.startswith("$"):
        body = value[2:-1] if value.startswith("${") and value.endswith("}") else value[1:]
        return evaluate(body, names)
    if isinstance(value, list):
        return [substitute(v, names) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, names) for k, v in value.items()}
    return value
