"""An imported operator graph as a dlsim description: layers, grouped in blocks by the module tree.

Both importers (`torch_export`, `onnx_graph`) produce `Node`s, one per dlsim layer, in a
topological order, each with the module path it came from (``layer1.0.conv1``). `assemble` turns
them into a description (the dict `dlsim.io.model_yaml` reads): the nodes of one instance of a
module in a list or sequence (``layer1.0``, ``blocks.3``), or of one top-level submodule, become a
block; instances whose blocks read the same and follow one another become one call with
``repeat``, so that the expanded layer names are the module paths (``layer1.1.conv1``). `to_yaml`
writes it with one line per layer. Nothing here imports torch or onnx.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import yaml

from dlsim.errors import ShapeError
from dlsim.spec.model import INPUT
from dlsim.spec.ops import OPS, infer


@dataclass
class Node:
    """One layer of an imported graph: `entry` is the dlsim layer without name and inputs (``type`` and
    attributes); `inputs` name other nodes or ``input``; `scope` is the dotted module path the operator
    ran in ('' at the top); `cls` the class of the module instance that owns it; `source` the source
    operator (``aten.conv2d``, ``Conv``)."""

    id: str
    entry: dict
    inputs: list[str]
    scope: str = ""
    cls: str = ""
    source: str = ""
    tied_to: str | None = field(default=None)


def shape_fits(kind: str, attrs: dict, ins: list, out: tuple) -> bool:
    """Whether dlsim's shape rule for operator `kind` with `attrs` gives the imported per-sample output
    shape `out` from the input shapes `ins` (a mapping that does not is not used)."""
    op = OPS[kind]
    try:
        got, _ = infer(op, {**op.attrs, **attrs}, ins, "check")
    except (ShapeError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return False
    return tuple(got) == tuple(out)


def _clean(text: str) -> str:
    text = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_") or "op"
    return text + "_" if text == INPUT else text


def _instance(scope: str) -> tuple[str, str, str] | None:
    """(instance path, container path, index) of the module instance a scope belongs to: the path up to
    its first numeric component (``layer1.0`` of ``layer1.0.conv1``), else its first component."""
    if not scope:
        return None
    parts = scope.split(".")
    for i, part in enumerate(parts):
        if part.isdigit() and i > 0:
            return ".".join(parts[:i + 1]), ".".join(parts[:i]), part
    return parts[0], parts[0], ""


def instance_path(scope: str) -> str:
    """The module instance a scope belongs to (``layer1.0`` of ``layer1.0.conv1``; '' at the top)."""
    key = _instance(scope)
    return key[0] if key else ""


def _short(node: Node) -> str:
    kind = node.entry["type"]
    if kind != "generic":
        return kind
    return _clean(node.source.rsplit(".", 1)[-1].split("[")[0]).lower()


def _local_names(nodes: list[Node], prefix: str) -> dict[str, str]:
    """A readable unique name per node: its module path below `prefix` (``conv1``) when it is the only
    real operator of that module, that path and its operator otherwise (``self_attn_linear``)."""
    def rel(node: Node) -> str:
        scope = node.scope[len(prefix):].lstrip(".") if prefix and node.scope.startswith(prefix) else node.scope
        return _clean(scope) if scope else ""
    counts: dict[str, int] = {}
    for node in nodes:
        counts[rel(node)] = counts.get(rel(node), 0) + 1
    names: dict[str, str] = {}
    used: set[str] = set()
    for node in nodes:
        r = rel(node)
        base = r if r and counts[r] == 1 else (f"{r}_{_short(node)}" if r else _short(node))
        name, k = base, 2
        while name in used:
            name, k = f"{base}_{k}", k + 1
        used.add(name)
        names[node.id] = name
    return names


@dataclass
class _Group:
    nodes: list[Node]
    key: tuple[str, str, str] | None  # instance, container, index


def _groups(nodes: list[Node]) -> list[_Group]:
    """Consecutive runs of nodes of one module instance (a run of two or more becomes a block)."""
    out: list[_Group] = []
    for node in nodes:
        key = _instance(node.scope)
        if out and key is not None and out[-1].key == key:
            out[-1].nodes.append(node)
        else:
            out.append(_Group([node], key))
    flat: list[_Group] = []
    for g in out:
        if g.key is not None and len(g.nodes) < 2:
            flat.append(_Group(g.nodes, None))
        else:
            flat.append(g)
    return flat


def _layer(node: Node, name: str, inputs: list[str], previous: str) -> dict:
    entry: dict = {"name": name, **node.entry}
    if inputs != [previous]:
        entry["inputs"] = inputs
    return entry


def assemble(name: str, dtype: str, input_entry: dict, nodes: list[Node], *, description: str = "") -> dict:
    """A dlsim description (a dict for `to_yaml`) of `nodes`, blocks per module instance."""
    groups = _groups(nodes)
    top_names = _local_names([g.nodes[0] for g in groups if g.key is None], "")
    expanded: dict[str, str] = {INPUT: INPUT}   # node id -> the layer name once blocks are expanded
    blocks: dict[str, list[dict]] = {}
    bodies: dict[str, str] = {}                 # body text -> block name
    layers: list[dict] = []
    used_top: set[str] = set(top_names.values())
    previous = INPUT
    pending: list[tuple[_Group, str, dict[str, str], str, str]] = []  # group, block, local names, input, last id

    def flush() -> None:
        nonlocal previous
        run = pending[:]
        pending.clear()
        if not run:
            return
        first, bname, _, main, _ = run[0]
        instance, container, index = first.key  # type: ignore[misc]
        call = _clean(instance) if len(run) == 1 else _clean(container if index == "0" else f"{container}_{index}")
        base, k = call, 2
        while call in used_top:
            call, k = f"{base}_{k}", k + 1
        used_top.add(call)
        entry: dict = {"name": call, "block": bname}
        if len(run) > 1:
            entry["repeat"] = len(run)
        if expanded[main] != previous:
            entry["inputs"] = [expanded[main]]
        layers.append(entry)
        for i, (g, _, names, _, _) in enumerate(run):
            for node in g.nodes:
                expanded[node.id] = f"{call}.{i}.{names[node.id]}" if len(run) > 1 else f"{call}.{names[node.id]}"
        previous = expanded[run[-1][4]]

    for g in groups:
        if g.key is None:
            flush()
            node = g.nodes[0]
            lname = top_names[node.id]
            entry = _layer(node, lname, [expanded[s] for s in node.inputs], previous)
            if node.tied_to:
                entry["tied_to"] = expanded[node.tied_to]
            layers.append(entry)
            expanded[node.id] = previous = lname
            continue
        ids = {n.id for n in g.nodes}
        outside = [s for n in g.nodes for s in n.inputs if s not in ids]
        main = outside[0] if outside else INPUT
        names = _local_names(g.nodes, g.key[0])
        # an outside reference whose name is also a local name would resolve to the local one: rename the local
        clash = {expanded.get(s) for s in outside if s != main} & set(names.values())
        for nid, local in list(names.items()):
            while local in clash or (local in names.values() and list(names.values()).count(local) > 1):
                local += "_"
            names[nid] = local
        body: list[dict] = []
        prev_local = INPUT
        for node in g.nodes:
            inputs = [names[s] if s in ids else (INPUT if s == main else expanded[s]) for s in node.inputs]
            entry = _layer(node, names[node.id], inputs, prev_local)
            if node.tied_to:
                entry["tied_to"] = names.get(node.tied_to) or expanded[node.tied_to]
            body.append(entry)
            prev_local = names[node.id]
        text = json.dumps(body, sort_keys=True)
        if text in bodies:
            bname = bodies[text]
        else:
            base = _clean(g.nodes[0].cls or g.key[1]) or "block"
            bname, k = base, 2
            while bname in blocks:
                bname, k = f"{base}_{k}", k + 1
            blocks[bname] = body
            bodies[text] = bname
        chained = (pending and pending[-1][1] == bname and pending[-1][4] == main
                   and pending[-1][0].key[1] == g.key[1] and g.key[2].isdigit()
                   and pending[-1][0].key[2].isdigit() and int(g.key[2]) == int(pending[-1][0].key[2]) + 1)
        if not chained:
            flush()
        pending.append((g, bname, names, main, g.nodes[-1].id))
    flush()
    out: dict = {"name": name}
    if description:
        out["description"] = description
    out["dtype"] = dtype
    out["input"] = input_entry
    if blocks:
        out["blocks"] = blocks
    out["layers"] = layers
    return out


def _flow(item: dict) -> str:
    return yaml.safe_dump(item, sort_keys=False, default_flow_style=True, width=10**6).strip()


def to_yaml(description: dict, header: str = "") -> str:
    """YAML text with one line per layer (flow style), as the zoo files are written."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    head = {k: v for k, v in description.items() if k not in ("blocks", "layers")}
    lines.append(yaml.safe_dump(head, sort_keys=False, default_flow_style=None, width=10**6).rstrip())
    if description.get("blocks"):
        lines.append("blocks:")
        for bname, body in description["blocks"].items():
            lines.append(f"  {bname}:")
            lines.extend(f"    - {_flow(layer)}" for layer in body)
    lines.append("layers:")
    lines.extend(f"  - {_flow(layer)}" for layer in description["layers"])
    return "\n".join(lines) + "\n"
