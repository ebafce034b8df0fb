"""Which initializers of an ONNX graph are the network's trainable parameters.

ONNX does not say, and torch.onnx.export writes a registered buffer exactly as a parameter: an
initializer under its state-dict name. (A module whose (16, 8) matrix is a buffer and the same
module with an nn.Parameter export to byte-identical files: TorchScript exporter, torch 2.13,
training mode, with or without ``keep_initializers_as_inputs``.) So no rule can tell the two apart
from the file alone; this one leaves out what cannot be trained, takes the names the user gives,
and says what it could not tell:

1. Only a floating-point initializer can be a parameter.
2. One no gradient reaches is not trained: every path from it to a graph output passes through an
   operator or operand without a derivative (a comparison, a shape, indices, Where's condition, a
   cast to an integer type, a normalization's running statistics; `_differentiable`). A subgraph's
   references to the graph around it are taken as differentiable.
3. One holding a non-finite value (an additive mask of −inf) is not trained.
4. The initializers the user names as buffers (``--buffers``; for a module at hand, the names of
   its ``named_buffers()``) are not parameters.

Every other floating-point initializer is a parameter. `unsure` names those read only outside the
operands where frameworks put weights (a convolution's, Gemm's or recurrent node's weights and
biases, a normalization's scale and bias, also as the product and sum applied to its output (the
exporter's GroupNorm), Gather's table, nn.Linear's form: a MatMul operand through a Transpose and
the term added to that MatMul), which could be buffers all the same; the import report lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from dlsim.errors import SpecError
from dlsim.importers.onnx_node import attrs, reads

FLOATS = (1, 10, 11, 16)  # float, float16, double, bfloat16
STATISTICS = {"BatchNormalization": (3, 4)}  # operands the operator defines as running statistics

_NO_DERIVATIVE = {"Shape", "Size", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And",
                  "Or", "Xor", "ArgMax", "ArgMin", "NonZero", "Floor", "Ceil", "Round", "Sign", "IsNaN", "IsInf",
                  "ConstantOfShape", "Range", "EyeLike", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
                  "Multinomial"}
_DATA_OPERANDS = {"Where": (1, 2), "Gather": (0,), "GatherElements": (0,), "GatherND": (0,), "Scatter": (0, 2),
                  "ScatterElements": (0, 2), "ScatterND": (0, 2), "Slice": (0,), "Reshape": (0,), "Expand": (0,),
                  "Tile": (0,), "Pad": (0,), "Resize": (0,), "Upsample": (0,), "TopK": (0,), "Squeeze": (0,),
                  "Unsqueeze": (0,), "Split": (0,), "CumSum": (0,), "Trilu": (0,), "Dropout": (0,),
                  "BatchNormalization": (0, 1, 2), "OneHot": (2,)}
_NORMS = {"BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization"}
_WEIGHT_OPERANDS = {"Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "BatchNormalization": (1, 2),
                    "LayerNormalization": (1, 2), "InstanceNormalization": (1, 2), "GroupNormalization": (1, 2),
                    "LSTM": (1, 2, 3, 7), "GRU": (1, 2, 3), "RNN": (1, 2, 3), "Gather": (0,)}


def _differentiable(node: Any) -> list[str]:
    """The tensors a node reads that its outputs' gradient flows back into."""
    op = node.op_type
    if op in _NO_DERIVATIVE or (op == "Cast" and int(attrs(node)["to"]) not in FLOATS):
        return []
    slots = _DATA_OPERANDS.get(op) or ((0,) if op.startswith("Reduce") else None)
    own = list(node.input) if slots is None else [node.input[i] for i in slots if i < len(node.input)]
    return own + reads(node)[len(node.input):]  # and its subgraphs' outer references


def _reached(graph: Any) -> set[str]:
    """Tensors some graph output depends on through derivatives (nodes are topologically sorted)."""
    reached = {o.name for o in graph.output}
    for node in reversed(graph.node):
        if any(o in reached for o in node.output if o):
            reached.update(_differentiable(node))
    return reached


@dataclass(frozen=True)
class Weights:
    """The parameters of a graph, and the other floating-point initializers by why they are not."""

    params: frozenset[str]
    constants: dict[str, str]  # name -> "statistics", "no gradient", "non-finite" or "--buffers"


def trainable(model: Any, consts: dict[str, Any], buffers: Iterable[str] = (), path: object = None) -> Weights:
    """The trainable initializers of `model` (at `path`; `consts`: their values), `buffers` named by the user."""
    import numpy as np

    inits = {i.name: i for i in model.graph.initializer}
    named = set(buffers)
    missing = sorted(named - set(inits))
    if missing:
        raise SpecError(f"the graph has no initializer {missing[0]!r}", path=path, field="--buffers")
    statistics = {n.input[i] for n in model.graph.node for i in STATISTICS.get(n.op_type, ()) if i < len(n.input)}
    reached = _reached(model.graph)
    constants: dict[str, str] = {}
    for name, init in inits.items():
        if init.data_type not in FLOATS:
            continue
        if name in named:
            constants[name] = "--buffers"
        elif name in statistics:
            constants[name] = "statistics"
        elif name not in reached:
            constants[name] = "no gradient"
        elif not np.isfinite(consts[name]).all():
            constants[name] = "non-finite"
    params = frozenset(n for n, i in inits.items() if i.data_type in FLOATS and n not in constants)
    return Weights(params, constants)


def _weight_operands(node: Any, producer: dict[str, Any]) -> list[str]:
    """The operands of `node` where frameworks put weights."""
    def made_by(name: str, op: str) -> bool:
        return name in producer and producer[name].op_type == op

    def normalized(name: str) -> bool:  # a normalization's output, reshaped or scaled
        made = producer.get(name)
        if made is None or made.op_type not in ("Reshape", "Mul"):
            return made is not None and made.op_type in _NORMS
        return any(normalized(i) for i in made.input)

    if node.op_type == "MatMul":  # nn.Linear's form: x · Transpose(W) ...
        return [i for i in node.input if made_by(i, "Transpose")]
    if node.op_type == "Add" and any(made_by(i, "MatMul") for i in node.input):  # ... + b
        return [i for i in node.input if not made_by(i, "MatMul")]
    if node.op_type in ("Mul", "Add") and any(normalized(i) for i in node.input):  # the exporter's GroupNorm affine
        return [i for i in node.input if not normalized(i)]
    return [node.input[i] for i in _WEIGHT_OPERANDS.get(node.op_type, ()) if i < len(node.input)]


def unsure(model: Any, params: frozenset[str], param_of: dict[str, set[str]]) -> list[str]:
    """The parameters read only outside a weight operand (`param_of`: tensor -> the initializers it is
    computed from), which could be buffers."""
    producer = {o: n for n in model.graph.node for o in n.output}
    sure = set().union(*(param_of.get(name, set()) for node in model.graph.node
                         for name in _weight_operands(node, producer)))
    return sorted(params - sure)
