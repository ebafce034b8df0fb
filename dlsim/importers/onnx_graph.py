"""Import an ONNX graph as dlsim nodes, without torch.

Shapes come from onnx's shape inference (``onnx.shape_inference.infer_shapes`` with data
propagation), run with the batch dimension of the one graph input set to 2 and to 3
(`dlsim.importers.onnx_shapes`): a dimension that changes holds the samples (it grows by its
per-sample factor), so each tensor's per-sample shape is its shape with that factor taken out, as
for torch.export's symbolic batch. Tensors whose shape inference leaves unknown (a reshape target
computed at run time) take the shapes onnx's reference evaluator (``onnx.reference``) computes at
the same two batch sizes.

Operators map onto the same dlsim operators as the torch importer (`dlsim.importers.onnx_ops`); any
other becomes a ``generic`` layer: its forward FLOPs by the counting conventions of PyTorch's FLOP
counter (matrix products and convolutions, 2 per multiply-accumulate; Einsum as torch.einsum
contracts it), its bytes the sizes of its inputs and outputs (`dlsim.importers.onnx_flops`). ONNX
holds no backward graph, so a generic layer's backward is taken as the standard rule of its class:
a matrix-class operator runs one product of its size per operand that needs a gradient, on the
weight-gradient pass for an operand computed from weights (so that a first layer, whose input needs
no gradient, keeps its ∇w); an element-wise one reads the output gradient and its inputs and writes
the input gradients. A Loop, If or Scan is priced from its subgraphs (`dlsim.importers.onnx_flow`);
what a subgraph reads from the graph around it counts as the node's inputs. Which initializers are
parameters ONNX does not say: `dlsim.importers.onnx_weights` leaves out those that cannot be trained
and those the user names as buffers, and the report names the ones it could not tell. Nodes that
depend on no graph input (weights, constants, shape arithmetic) are folded into their consumers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from dlsim.errors import SpecError
from dlsim.importers.graph import Node
from dlsim.importers.onnx_flops import pass_flops
from dlsim.importers.onnx_flow import FLOW
from dlsim.importers.onnx_flow import cost as flow_cost
from dlsim.importers.onnx_node import reads
from dlsim.importers.onnx_ops import MAP, RECURRENT, check_recurrent
from dlsim.importers.onnx_shapes import BATCHES, per_sample, run, shapes_at
from dlsim.importers.onnx_weights import trainable, unsure
from dlsim.spec.model import INPUT

_ELEMENT_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}
_SHAPE_OPS = {"Shape", "Size"}


@dataclass
class OnnxGraph:
    nodes: list[Node]
    input_entry: dict
    dtype: str
    params: int
    batch: int
    notes: list[str] = field(default_factory=list)
    sources: list[Path] = field(default_factory=list)  # the ONNX file and its external data files


def _load(path: Path) -> tuple[Any, list[Path]]:
    """The checked model at `path` and the external data files it read."""
    try:
        import onnx
    except ModuleNotFoundError:
        raise SpecError("importing ONNX needs onnx (pip install onnx, or the 'onnx' extra)") from None
    if path.is_dir():
        raise SpecError("is a directory, not an ONNX file", path=path)
    if not path.is_file():
        raise SpecError("no such file", path=path)
    try:
        model = onnx.load(str(path), load_external_data=False)
        external = external_files(model, path)
        if external:
            onnx.load_external_data_for_model(model, str(path.parent))
        onnx.checker.check_model(model)
    except Exception as exc:  # noqa: BLE001 - onnx raises its own kinds for a bad file
        raise SpecError(f"not a valid ONNX model ({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})",
                        path=path) from None
    return model, external


def _tensors(graph: Any) -> Iterable[Any]:
    """Every tensor a graph holds: initializers and tensor attributes, its subgraphs' included."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _tensors(a.g)
            for sub in a.graphs:
                yield from _tensors(sub)


def external_files(model: Any, path: Path) -> list[Path]:
    """The files beside `path` that hold the model's external tensor data (read with it: inputs too)."""
    found = []
    for t in _tensors(model.graph):
        if t.data_location == 1:  # TensorProto.EXTERNAL
            found += [path.parent / e.value for e in t.external_data if e.key == "location"]
    return sorted(set(found))


def _check_rank(x: Any, path: Path) -> None:
    """A dlsim input is batch-first with a per-sample shape: rank 2 or more (a declared shape only)."""
    t = x.type.tensor_type
    if t.HasField("shape") and len(t.shape.dim) < 2:
        dims = [d.dim_value or d.dim_param or "?" for d in t.shape.dim]
        raise SpecError(f"the graph input {x.name!r} has shape {dims}: it has no batch dimension (dlsim imports a "
                        f"batch-first input of rank 2 or more, (batch, ...))", path=path)


class _Graph:
    """State of one import."""

    def __init__(self, model: Any, path: Path, buffers: Iterable[str] = ()):
        import onnx.numpy_helper as nh

        self.model, self.path = model, path
        g = model.graph
        self.inits = {i.name: i for i in g.initializer}
        self.consts: dict[str, Any] = {n: nh.to_array(i) for n, i in self.inits.items()}
        for node in g.node:
            if node.op_type == "Constant" and node.attribute:
                import onnx
                value = onnx.helper.get_attribute_value(node.attribute[0])
                self.consts[node.output[0]] = nh.to_array(value) if hasattr(value, "dims") else value
        inputs = [i for i in g.input if i.name not in self.inits]
        if len(inputs) != 1:
            raise SpecError(f"a dlsim model has one input; the graph has {len(inputs)}", path=path)
        self.input = inputs[0].name
        _check_rank(inputs[0], path)
        self.notes: list[str] = []
        self.batch, self.static = BATCHES[0], 0
        try:
            self.s2, self.s3 = self._shapes_at(model, BATCHES)
        except SpecError:  # a graph exported with a fixed batch cannot run at another one
            dims = inputs[0].type.tensor_type.shape.dim
            fixed = dims[0].dim_value if dims and dims[0].HasField("dim_value") and dims[0].dim_value > 1 else 0
            if not fixed:
                raise
            self.batch = self.static = fixed
            self.s2, _ = self._shapes_at(model, (fixed,))
            self.s3 = {}
            self.notes.append(f"the graph's batch is fixed at {fixed}: per-sample shapes taken along dimension 0")
        self.active: set[str] = {self.input}
        self.grad: set[str] = set()  # tensors that depend on the input and on a weight: they need a gradient
        self.weights = trainable(model, self.consts, buffers, path)
        self.param_of: dict[str, set[str]] = {n: {n} for n in self.weights.params}
        self.folded = 0
        self.owner: dict[str, str] = {}
        self.alias: dict[str, str] = {self.input: INPUT}
        self.nodes: list[Node] = []
        consumers: dict[str, list] = {}
        for node in g.node:
            for i in node.input:
                consumers.setdefault(i, []).append(node)
        self.bias_after: dict[str, tuple[str, str]] = {}  # MatMul output -> (Add output, bias initializer)
        for node in g.node:
            users = consumers.get(node.output[0], []) if node.op_type == "MatMul" else []
            if len(users) == 1 and users[0].op_type == "Add":
                other = [i for i in users[0].input if i != node.output[0]]
                if len(other) == 1 and other[0] in self.weights.params and len(self.inits[other[0]].dims) == 1:
                    self.bias_after[node.output[0]] = (users[0].output[0], other[0])
        self.fused: dict[str, str] = {}  # Add output -> the MatMul output whose linear layer took its bias

    def _shapes_at(self, model: Any, batches: tuple[int, ...]) -> tuple[dict, dict]:
        """Shapes of every tensor at each batch size (shape inference, the reference evaluator for the rest)."""
        found, self.types, evaluated = shapes_at(model, batches)
        if evaluated:
            self.notes.append(f"{evaluated} tensor shapes left unknown by shape inference taken from onnx's "
                              f"reference evaluator")
        return found[0], (found[1] if len(found) > 1 else {})

    def split(self, name: str) -> tuple[tuple[int, ...] | None, int | None]:
        return per_sample(self.s2.get(name), self.s3.get(name), self.static)

    def shape(self, name: str) -> tuple[int, ...]:
        """Per-sample shape (flat elements / batch when the batch is mixed into a dimension)."""
        shape, _ = self.split(name)
        if shape is not None:
            return shape
        a = self.s2.get(name)
        numel = math.prod(a) if a is not None else 0
        return (numel // self.batch,) if numel >= self.batch and numel % self.batch == 0 else ()

    def axis(self, name: str, dim: int) -> int | None:
        shape, where = self.split(name)
        if shape is None:
            return None
        rank = len(self.s2[name])
        dim %= rank
        if where is None:
            return dim
        return None if dim == where else dim - (dim > where)

    def nbytes(self, name: str) -> int:
        a = self.s2.get(name)
        return math.prod(a) * _ELEMENT_BYTES.get(self.types.get(name, 1), 4) if a is not None else 0

    def const(self, name: str) -> Any:
        return self.consts.get(name)

    def value(self, name: str) -> Any:
        """The value of a tensor computed from constants and shapes only: a constant's, else the one onnx's
        reference evaluator computes at the first batch size (None when it fails)."""
        if name in self.consts:
            return self.consts[name]
        try:
            return run(self.model, self.batch, [name])[0]
        except Exception:  # noqa: BLE001 - the evaluator raises its own kinds; the caller prices without it
            return None

    def folds(self, node: Any, inputs: list[str]) -> bool:
        """Whether a node reading `inputs` is folded into its consumers: a shape, or a node that depends on
        no graph input."""
        return node.op_type in _SHAPE_OPS or not any(i in self.active for i in inputs if i)

    def sources(self, names: Any) -> set[str]:
        """The weights the tensors `names` are computed from ('' names an omitted input)."""
        return set().union(*(self.param_of.get(n, set()) for n in names if n))

    def fold(self, node: Any, inputs: list[str]) -> None:
        """A node that depends on no graph input: its outputs are computed from its inputs' weights."""
        for o in node.output:
            if o:
                self.param_of[o] = self.sources(inputs)

    def activate(self, node: Any, inputs: list[str]) -> None:
        """A node that depends on the graph input: its outputs do, and need a gradient when it reads a
        weight or a tensor that needs one."""
        outs = [o for o in node.output if o]
        self.active.update(outs)
        if self.sources(i for i in inputs if i not in self.active) or any(i in self.grad for i in inputs):
            self.grad.update(outs)

    def claim(self, names: set[str], node_id: str) -> int:
        fresh = [p for p in sorted(names) if p not in self.owner]
        for p in fresh:
            self.owner[p] = node_id
        return sum(int(math.prod(self.inits[p].dims)) for p in fresh)


def read_onnx(path: str | Path, *, batch: int | None = None, buffers: Iterable[str] = ()) -> OnnxGraph:
    """The dlsim nodes of the ONNX model at `path` (one batch-first input); `buffers` names initializers
    that are buffers, not parameters (`dlsim.importers.onnx_weights`)."""
    path = Path(path)
    model, external = _load(path)
    g = _Graph(model, path, buffers)
    consumed = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    for node in model.graph.node:
        _add(g, node, consumed)
    params = sum(int(math.prod(g.inits[n].dims)) for n in g.weights.params)
    notes = [*g.notes, *_weight_notes(g, model)]
    if g.folded:
        notes.append(f"{g.folded} operators on weights, constants or shapes only folded into their consumers")
    return OnnxGraph(g.nodes, _input_entry(g, model, path), _dtype(g), params, batch or g.batch, notes,
                     [path, *external])


def _input_entry(g: _Graph, model: Any, path: Path) -> dict:
    """The description's ``input``: per-sample shape, or the length of a sequence of token ids."""
    x = next(i for i in model.graph.input if i.name == g.input)
    x_shape = g.shape(g.input)
    if x.type.tensor_type.elem_type in (6, 7):
        if len(x_shape) != 1:
            raise SpecError(f"integer inputs are token ids of shape (batch, L); got per-sample {list(x_shape)}", path=path)
        return {"tokens": int(x_shape[0])}
    return {"shape": [int(d) for d in x_shape]}


def _dtype(g: _Graph) -> str:
    """The most frequent floating-point type of the initializers (fp32 when there are none)."""
    floats = [i.data_type for i in g.inits.values() if i.data_type in (1, 10, 16)]
    return {1: "fp32", 10: "fp16", 16: "bf16"}[max(set(floats), key=floats.count)] if floats else "fp32"


def _listed(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _weight_notes(g: _Graph, model: Any) -> list[str]:
    """What the report says of the initializers: those not counted as parameters (running statistics
    aside, which ONNX's operators define as such), and those counted that could be buffers."""
    why = {"no gradient": "no gradient reaches", "non-finite": "non-finite values", "--buffers": "named by --buffers"}
    notes = []
    for reason, label in why.items():
        names = sorted(n for n, r in g.weights.constants.items() if r == reason)
        if names:
            notes.append(f"initializers not counted as parameters ({label}): {_listed(names)}")
    doubtful = unsure(model, g.weights.params, g.param_of)
    if doubtful:
        sizes = [f"{n} ({int(math.prod(g.inits[n].dims)):,})" for n in doubtful]
        notes.append(f"ONNX does not mark buffers: counted as parameters, read only outside a weight operand: "
                     f"{_listed(sizes)}; name those that are buffers with --buffers")
    return notes


def _add(g: _Graph, node: Any, consumed: set[str]) -> None:
    """Fold `node` into its consumers (it depends on no graph input), or add the dlsim layers it maps onto,
    or a generic layer."""
    outs, inputs = [o for o in node.output if o], reads(node)
    if g.folds(node, inputs):
        g.fold(node, inputs)
        g.folded += node.op_type != "Constant"
        return
    g.activate(node, inputs)
    if node.op_type in RECURRENT:
        check_recurrent(g, node)  # malformed inputs are refused, not priced as a generic layer
    if outs[0] in g.fused:  # a bias add folded into the linear layer before it
        g.alias[outs[0]] = g.alias[g.fused[outs[0]]]
        return
    nid, scope = outs[0], _scope(node.name)
    in_ids = [g.alias[i] for i in inputs if i in g.active and i in g.alias]
    ins = [g.shape(i) for i in node.input if i in g.active and i in g.alias]
    out = g.shape(outs[0])
    sources = g.sources(inputs)
    mapper = MAP.get(node.op_type)
    mapped = mapper(g, node, ins, out) if mapper is not None else None
    if mapped is None:
        g.nodes.append(Node(nid, _generic(g, node, inputs, nid, out), in_ids or [INPUT], scope, "", node.op_type))
        for o in outs:
            g.alias[o] = nid
        return
    for suffix, entry, local in mapped:
        lid = nid + suffix
        inputs = in_ids if local is None else [nid + s if s.startswith("_") else s for s in local]
        tied = entry.pop("tied_to", None)
        if entry["type"] != "reshape":
            bias = g.bias_after.get(outs[0], (None, None))
            g.claim(sources | ({bias[1]} if bias[0] in g.fused else set()), lid)
        g.nodes.append(Node(lid, entry, inputs, scope, "", node.op_type, tied))
    g.alias[outs[0]] = nid
    for i, o in enumerate(outs[1:], 1):  # further outputs (an LSTM's last states) as views of the layer
        if o in consumed:
            g.nodes.append(Node(o, {"type": "generic", "op": f"{node.op_type}[{i}]", "shape": list(g.shape(o))},
                                [nid], scope, "", f"{node.op_type}[{i}]"))
            g.alias[o] = o


def _generic(g: _Graph, node: Any, inputs: list[str], nid: str, out: tuple[int, ...]) -> dict:
    """The generic layer of a node no dlsim operator fits, reading `inputs` (a subgraph's outer references
    included): its matrix products' FLOPs per pass (`dlsim.importers.onnx_flops.pass_flops`; a Loop's,
    If's or Scan's from its subgraphs, `dlsim.importers.onnx_flow`), and bytes: forward reads the inputs
    that depend on the network's input and writes the outputs (a subgraph's operators, when they move
    more); the input gradient reads the output gradient and those inputs and writes their gradients;
    the weight gradient (a node computed from weights) reads the output gradient and those inputs and
    writes the weights' gradients. Per sample: at the first batch size, divided by it."""
    sources = g.sources(inputs)
    nparams = g.claim(sources, nid)
    fwd, grad, wgrad, inside = flow_cost(g, node) if node.op_type in FLOW else (*pass_flops(g, node), 0.0)
    acts = sum(g.nbytes(i) for i in inputs if i in g.active)
    outs = sum(g.nbytes(o) for o in node.output if o)
    weights = sum(g.nbytes(p) for p in sources)
    moved = max(acts + outs, inside)
    entry = {"type": "generic", "op": node.op_type, "shape": list(out), "params": nparams}
    for key, value in (("flops", fwd), ("bytes", moved), ("grad_flops", grad), ("grad_bytes", moved + acts),
                       ("wgrad_flops", wgrad), ("wgrad_bytes", outs + acts + weights if sources else 0)):
        if value:
            entry[key] = float(f"{value / g.batch:.6g}")
    return entry


def _scope(name: str) -> str:
    """Module path from an exporter's node name (``/layer1/layer1.0/conv1/Conv`` -> ``layer1.0.conv1``)."""
    parts = [p for p in name.split("/") if p][:-1]
    path = ""
    for part in parts:
        head = part.rsplit(".", 1)[0] if "." in part else None
        if path and part.startswith(path + "."):  # a path from the root (``layer1.0`` under ``layer1``)
            path = part
        elif head and (path == head or path.endswith("." + head)):  # an item under its container's name
            path = path[:len(path) - len(head)] + part
        else:
            path = f"{path}.{part}" if path else part
    return path
