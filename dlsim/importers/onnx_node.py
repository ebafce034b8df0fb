"""Reading one ONNX node: its attributes."""

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
