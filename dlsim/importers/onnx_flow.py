"""The cost of a Loop, If or Scan node, which no dlsim operator fits, from its subgraphs.

torch.onnx.export writes some modules as control flow (nn.EmbeddingBag as a Loop over the bags).
A body reads the tensors of the scopes around it by name (`dlsim.importers.onnx_node.reads`): those
make the node depend on the input and on weights as its own inputs do. Its operators are priced as
the generic operators they are (`dlsim.importers.onnx_flops.pass_flops`, with the shapes onnx's shape
inference gives inside the body), their bytes the sizes of the tensors they read and write where
those shapes are known:

- Loop: the body's cost times the trip count M, when M is a constant or computed from shapes and
  constants only (onnx's reference evaluator gives its value; for an EmbeddingBag, the number of
  bags, which grows with the batch); otherwise (a while loop: no M, or one of 2³¹ − 1 or more, as
  exporters write it; M from the data) one iteration, and a note says so.
- Scan: the body's cost times the length of the first scanned input along its scan axis.
- If: the costlier branch (by FLOPs, then bytes), as either may run.
"""

from __future__ import annotations

from typing import Any

from dlsim.importers.onnx_flops import pass_flops
from dlsim.importers.onnx_node import attrs, reads

G = Any  # dlsim.importers.onnx_graph._Graph
FLOW = ("Loop", "If", "Scan")
NO_LIMIT = 2**31 - 1  # a trip count this large is an exporter's "no limit" (a while loop that stops on its condition)
Cost = tuple[float, float, float, float]  # forward, input-gradient, weight-gradient FLOPs; bytes moved forward


def _bind(g: G, body: Any, outer: list[str]) -> None:
    """The body's inputs hold the outer tensors `outer` ('' for none): they depend on what those depend on."""
    for inner, name in zip(body.input, outer):
        if name in g.active:
            g.active.add(inner.name)
            if name in g.grad:
                g.grad.add(inner.name)
        elif name:
            g.param_of[inner.name] = g.sources([name])


def _body(g: G, body: Any, outer: list[str]) -> Cost:
    """One run of a subgraph whose inputs hold `outer`."""
    _bind(g, body, outer)
    total = [0.0, 0.0, 0.0, 0.0]
    for node in body.node:
        inputs = reads(node)
        if g.folds(node, inputs):
            g.fold(node, inputs)
            continue
        g.activate(node, inputs)
        fwd, grad, wgrad = pass_flops(g, node) if node.op_type not in FLOW else cost(g, node)[:3]
        moved = sum(g.nbytes(i) for i in inputs if i in g.active) + sum(g.nbytes(o) for o in node.output if o)
        for k, v in enumerate((fwd, grad, wgrad, moved)):
            total[k] += v
    return total[0], total[1], total[2], total[3]


def _trips(g: G, node: Any) -> int | None:
    """Iterations of a Loop or Scan, None when they cannot be known before it runs."""
    a = attrs(node)
    if node.op_type == "Scan":
        first = node.input[len(node.input) - int(a["num_scan_inputs"])]
        axis = int((a.get("scan_input_axes") or [0])[0])
        shape = g.s2.get(first)
        return int(shape[axis]) if shape is not None else None
    import numpy as np

    m = node.input[0]
    value = g.value(m) if m and m not in g.active else None
    trips = int(np.asarray(value).reshape(-1)[0]) if value is not None else None
    return trips if trips is not None and trips < NO_LIMIT else None


def cost(g: G, node: Any) -> Cost:
    """(forward, input-gradient, weight-gradient FLOPs, bytes) of a Loop, If or Scan at the first batch size."""
    a = attrs(node)
    if node.op_type == "If":
        return max(_body(g, a["then_branch"], []), _body(g, a["else_branch"], []), key=lambda c: (c[0], c[3]))
    body = a["body"]
    outer = ["", "", *node.input[2:]] if node.op_type == "Loop" else list(node.input)
    trips = _trips(g, node)
    if trips is None:
        g.notes.append(f"{node.op_type} {node.output[0]}: its trip count is known only when it runs; priced for "
                       f"one iteration")
        trips = 1
    return tuple(trips * v for v in _body(g, body, outer))  # type: ignore[return-value]
