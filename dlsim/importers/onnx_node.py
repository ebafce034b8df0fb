"""Reading one ONNX node: its attributes, and the tensors it reads, its subgraphs' included.

A Loop, If or Scan node holds its body as graph attributes; a body may read any tensor of the
scopes around it by name (ONNX IR, "Names Within a Graph": outer-scope values are visible in
nested subgraphs) without listing it among the node's inputs. `reads` adds those outer references
to the node's own inputs, so that the node depends on them as on its inputs.
"""

from __future__ import annotations

from typing import Any


def attrs(node: Any) -> dict:
    """The node's attributes by name (strings as str, subgraphs as GraphProto)."""
    import onnx

    out = {}
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        out[a.name] = value.decode() if isinstance(value, bytes) else value
    return out


def subgraphs(node: Any) -> list[Any]:
    """The graphs a node holds as attributes (a Loop's or Scan's body, an If's two branches)."""
    import onnx

    out = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def outer_reads(graph: Any) -> list[str]:
    """Tensors a (sub)graph reads that it does not define: its references to the scopes around it."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    out: list[str] = []
    for node in graph.node:
        for name in reads(node):
            if name and name not in defined and name not in out:
                out.append(name)
        defined.update(o for o in node.output if o)
    return out


def reads(node: Any) -> list[str]:
    """The tensors a node reads: its inputs ('' for an omitted optional one), then the outer references of
    its subgraphs that are not among them."""
    out = list(node.input)
    for name in (n for g in subgraphs(node) for n in outer_reads(g)):
        if name not in out:
            out.append(name)
    return out
