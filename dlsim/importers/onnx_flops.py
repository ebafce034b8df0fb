"""The matrix products of an ONNX node that dlsim prices as a generic operator, counted as PyTorch's FLOP
counter (`torch.utils.flop_counter`) counts its torch equivalent, and how the backward splits them.

A `Product` is one matrix product: its forward FLOPs (2 per multiply-accumulate) and its operands,
each the tensors it is computed from and the share of the product's FLOPs its gradient costs (1: in
the counter's mm, bmm and convolution backward formulas each operand's gradient is a product of the
forward's size). Element-wise work counts zero, as in the counter.

- MatMul, Gemm: one product, the output's elements times the contracted size.
- Conv, ConvTranspose: 2·N·|W|·(output spatial size; the input's for a transposed convolution), the
  counter's ``conv_flop_count``.
- Einsum: torch.einsum's own order without opt_einsum (``aten/src/ATen/native/Linear.cpp``): labels of
  one operand only that the output lacks are summed out first (a sum, no product); then the operands
  are contracted left to right, each step one bmm over all labels of its two sides (2·∏ sizes),
  keeping the labels a later operand or the output needs; a step that sums over no label is an
  element-wise product (none). So a 3-operand einsum is two bmm, and its backward up to four. An
  ellipsis stands for labels of its own, broadcast dimensions taking the larger size.
- LSTM, GRU, RNN (g = 4, 3, 1 gates): per direction the input product (N·L, g·h, F) and the
  recurrent one, L steps of (N, g·h, h); the hidden state's gradient runs L − 1 steps (none into the
  zero initial state), as `dlsim.cost.layers._recurrent`.

`pass_flops` splits a node's backward: the gradient of an operand computed from a weight (an
initializer that is a parameter) goes to the weight gradient; that of one computed from a tensor
that needs a gradient to the input gradient; none is run for an operand that needs none (the
network's input and what is computed from it and constants only), as autograd skips it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dlsim.importers.onnx_node import attrs

G = Any  # dlsim.importers.onnx_graph._Graph: s2 (shapes at the first batch), param_of, active, grad


@dataclass(frozen=True)
class Product:
    """One matrix product: forward FLOPs, and per operand (tensors it is computed from, gradient's share)."""

    flops: float
    operands: tuple[tuple[frozenset[str], float], ...]


def _pair(flops: float, a: str, b: str) -> list[Product]:
    return [Product(flops, ((frozenset({a}), 1.0), (frozenset({b}), 1.0)))] if flops else []


def _matmul(g: G, node: Any) -> list[Product]:
    a, y = g.s2.get(node.input[0]), g.s2.get(node.output[0])
    if a is None or y is None:
        return []
    k = a[0] if node.op_type == "Gemm" and attrs(node).get("transA", 0) else a[-1]
    return _pair(2.0 * math.prod(y) * k, node.input[0], node.input[1])


def _conv(g: G, node: Any) -> list[Product]:
    w, x, y = (g.s2.get(n) for n in (node.input[1], node.input[0], node.output[0]))
    if w is None or x is None or y is None:
        return []
    spatial = x[2:] if node.op_type == "ConvTranspose" else y[2:]
    return _pair(2.0 * x[0] * math.prod(w) * math.prod(spatial), node.input[0], node.input[1])


def _einsum_terms(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """(operand terms, output term) of an equation for operands of `ranks`, an ellipsis spelt out as labels
    of its own (right-aligned, as broadcasting aligns them); an implicit output is the ellipsis, then
    the labels that occur once, sorted (numpy's rule)."""
    lhs, arrow, out = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    width = max((r - len(t) + 3 for t, r in zip(terms, ranks) if "..." in t), default=0)
    spare = "".join(chr(0x391 + k) for k in range(width))  # Greek capitals: no equation's letters

    def spell(term: str, rank: int) -> str:
        n = rank - len(term) + 3
        return term.replace("...", spare[width - n:] if n > 0 else "")

    terms = [spell(t, r) for t, r in zip(terms, ranks)]
    if not arrow:
        letters = "".join(terms)
        out = "..." + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in spare))
    return terms, out.replace("...", spare)


def _einsum(g: G, node: Any) -> list[Product]:
    shapes = [g.s2.get(name) for name in node.input]
    if any(s is None for s in shapes):
        return []
    terms, output = _einsum_terms(attrs(node)["equation"], [len(s) for s in shapes])
    sizes: dict[str, int] = {}
    for term, dims in zip(terms, shapes):
        if len(term) != len(dims):
            return []
        for c, d in zip(term, dims):
            sizes[c] = max(sizes.get(c, 1), d)
    counts = {c: sum(c in t for t in terms) for c in sizes}
    labels = [{c for c in t if counts[c] > 1 or c in output} for t in terms]  # one operand's own labels summed first
    products = []
    left, left_from = labels[0], frozenset({node.input[0]})
    for i in range(1, len(terms)):
        later = set(output).union(*labels[i + 1:])
        summed = (left & labels[i]) - later
        if summed:
            flops = 2.0 * math.prod(sizes[c] for c in left | labels[i])
            products.append(Product(flops, ((left_from, 1.0), (frozenset({node.input[i]}), 1.0))))
        left, left_from = (left | labels[i]) - summed, left_from | {node.input[i]}
    return products


def _recurrent(g: G, node: Any) -> list[Product]:
    x, w, r = (g.s2.get(n) for n in node.input[:3])
    if x is None or w is None or r is None or len(x) != 3 or len(w) != 3 or len(r) != 3:
        return []
    steps = x[1] if attrs(node).get("layout", 0) else x[0]
    rows, dirs, gates_h, feat, hidden = x[0] * x[1], w[0], w[1], w[2], r[2]
    chain = frozenset(n for n in node.input if n)  # the hidden state is computed from all of them
    through_time = (steps - 1) / steps if steps else 0.0
    return [Product(2.0 * dirs * rows * gates_h * feat, ((frozenset({node.input[0]}), 1.0), (frozenset({node.input[1]}), 1.0))),
            Product(2.0 * dirs * rows * gates_h * hidden, ((chain, through_time), (frozenset({node.input[2]}), 1.0)))]


_PRODUCTS = {"MatMul": _matmul, "Gemm": _matmul, "Conv": _conv, "ConvTranspose": _conv, "Einsum": _einsum,
             "LSTM": _recurrent, "GRU": _recurrent, "RNN": _recurrent}


def products(g: G, node: Any) -> list[Product]:
    """The node's matrix products at the first batch size (none for an element-wise operator)."""
    rule = _PRODUCTS.get(node.op_type)
    return rule(g, node) if rule is not None else []


def _gradient(g: G, names: frozenset[str]) -> str | None:
    """Which backward pass computes the gradient of an operand computed from `names`: "weight" when one
    is a weight, "input" when one needs a gradient, None when none does."""
    if any(n not in g.active and g.param_of.get(n) for n in names):
        return "weight"
    return "input" if any(n in g.grad for n in names) else None


def pass_flops(g: G, node: Any) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) FLOPs of the node at the first batch size."""
    back = {"input": 0.0, "weight": 0.0}
    total = 0.0
    for p in products(g, node):
        total += p.flops
        for names, share in p.operands:
            kind = _gradient(g, names)
            if kind is not None:
                back[kind] += share * p.flops
    return total, back["input"], back["weight"]
