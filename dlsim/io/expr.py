"""Safe evaluation of the small expressions allowed in descriptions: ``$hidden``, ``${4 * hidden}``.

The cost of an expression is bounded before it is computed: its text is at most `MAX_TEXT`
characters, a power is refused when its result would exceed `MAX_BITS` bits, a repetition
(``"ab" * n``, ``[0] * n``) when the result would exceed `MAX_ITEMS` items, and every integer result is
kept under `MAX_BITS` bits; such expressions are refused with `ExprError`, never attempted.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Mapping

_BINARY: dict[type, Any] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Div: operator.truediv,
                             ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}


MAX_TEXT = 500
MAX_BITS = 256
MAX_ITEMS = 10_000


class ExprError(ValueError):
    """An expression that cannot be evaluated."""


def _magnitude_bits(x: Any) -> float:
    """log2 of |x| (0 for |x| <= 1); raises ExprError for a value that is not a number."""
    if isinstance(x, bool):
        x = int(x)
    if isinstance(x, int):
        return max(abs(x).bit_length() - 1, 0)
    if isinstance(x, float):
        return math.log2(abs(x)) if math.isfinite(x) and abs(x) > 1 else 0.0
    raise ExprError(f"cannot raise {type(x).__name__} to a power")


def _power(a: Any, b: Any) -> Any:
    if not isinstance(b, (int, float)):
        raise ExprError(f"cannot raise to a {type(b).__name__} power")
    bits = _magnitude_bits(a)
    if bits and b > 0 and bits * b > MAX_BITS:
        raise ExprError(f"power too large (about 2**{min(bits * b, 1e12):.0f}; the limit is 2**{MAX_BITS})")
    if isinstance(a, (int, float)) and a == 0 and b < 0:
        raise ExprError("zero to a negative power")
    if isinstance(b, float) or (isinstance(b, int) and b < 0):
        result = float(a) ** float(b) if not (isinstance(a, (int, float)) and a < 0) else None
        if result is None or isinstance(result, complex):
            raise ExprError("a negative number to a fractional or negative power")
        return result
    return a ** b


def _multiply(a: Any, b: Any) -> Any:
    for seq, n in ((a, b), (b, a)):
        if isinstance(seq, (str, list)) and isinstance(n, int):
            if n * len(seq) > MAX_ITEMS:
                raise ExprError(f"repetition too long ({excerpt_count(n)} x {len(seq)} items; the limit is {MAX_ITEMS})")
    return operator.mul(a, b)


def excerpt_count(n: int) -> str:
    return str(n) if abs(n) < 10**12 else f"about 2**{n.bit_length()}"


def _checked(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_BITS:
        raise ExprError(f"integer result too large (over 2**{MAX_BITS})")
    if isinstance(value, (str, list)) and len(value) > MAX_ITEMS:
        raise ExprError(f"result too long (over {MAX_ITEMS} items)")
    return value


def _eval(node: ast.AST, names: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body, names)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            defined = ", ".join(sorted(names)) or "none"
            raise ExprError(f"unknown name {node.id[:60]!r} (defined: {defined if len(defined) < 150 else defined[:150] + '...'})")
        return names[node.id]
    if isinstance(node, ast.BinOp) and (type(node.op) in _BINARY or isinstance(node.op, (ast.Mult, ast.Pow))):
        left, right = _eval(node.left, names), _eval(node.right, names)
        if isinstance(node.op, ast.Pow):
            return _checked(_power(left, right))
        if isinstance(node.op, ast.Mult):
            return _checked(_multiply(left, right))
        return _checked(_BINARY[type(node.op)](left, right))
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
            raise ExprError(f"cannot index {repr(container)[:60]} with {repr(index)[:60]}") from None
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_eval(e, names) for e in node.elts]
    raise ExprError(f"unsupported expression element {type(node).__name__}")


def evaluate(text: str, names: Mapping[str, Any]) -> Any:
    """Evaluate arithmetic, comparisons and ``a if c else b`` over `names`; integral floats become ints."""
    shown = repr(text) if len(text) <= 60 else repr(text[:60]) + "..."
    if len(text) > MAX_TEXT:
        raise ExprError(f"expression {shown} is longer than {MAX_TEXT} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise ExprError(f"cannot parse expression {shown}: {getattr(exc, 'msg', exc)}") from None
    except (RecursionError, MemoryError):
        raise ExprError(f"expression {shown} is nested too deeply") from None
    try:
        value = _eval(tree, names)
    except RecursionError:
        raise ExprError(f"expression {shown} is nested too deeply") from None
    except (OverflowError, ArithmeticError) as exc:
        raise ExprError(f"expression {shown}: {exc}") from None
    except TypeError as exc:
        raise ExprError(f"expression {shown}: {str(exc)[:100]}") from None
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ExprError(f"expression {shown} is not a finite number")
        if value.is_integer():
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
