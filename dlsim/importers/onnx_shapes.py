"""Tensor shapes of an ONNX graph at a given batch size, its subgraphs' included, without torch.

`shapes_at` runs onnx's shape inference (``onnx.shape_inference.infer_shapes`` with data
propagation) with the batch dimension of the graph input set to the batch size. The body of a Loop
or Scan is inferred again on its own, its inputs given the shapes of the outer tensors they hold (a
loop-carried value keeps its shape across iterations; onnx's own Loop inference drops those
shapes, since they may change) and its outer references given theirs. `run` computes values with
onnx's reference evaluator (``onnx.reference``) on a random input; `per_sample` takes the batch out
of a shape seen at two batch sizes.
"""

from __future__ import annotations

from typing import Any

from dlsim.errors import SpecError
from dlsim.importers.onnx_node import attrs, outer_reads, subgraphs

BATCHES = (2, 3)
Shapes = dict[str, "list[int] | None"]


def _with_batch(model: Any, batch: int) -> Any:
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name for i in m.graph.initializer}
    for inp in m.graph.input:
        if inp.name not in inits and inp.type.tensor_type.shape.dim:
            d = inp.type.tensor_type.shape.dim[0]
            d.ClearField("dim_param")
            d.dim_value = batch
    del m.graph.value_info[:]
    for out in m.graph.output:
        out.type.tensor_type.ClearField("shape")
    for sub in _graphs(m.graph)[1:]:  # a body's declared shapes name the exporter's batch: inferred anew
        del sub.value_info[:]
        for value in [*sub.input, *sub.output]:
            value.type.tensor_type.ClearField("shape")
    return m


def shapes_at(model: Any, batches: tuple[int, ...]) -> tuple[list[Shapes], dict[str, int], int]:
    """Shapes of every tensor at each batch size (None: unknown), element types, and how many of the
    graph's tensors took their shapes from the reference evaluator (shape inference left them unknown)."""
    found = []
    types: dict[str, int] = {}
    for b in batches:
        shapes, types = _shapes(model, b)
        found.append(shapes)
    produced = {o for node in model.graph.node for o in node.output if o}
    unknown = sorted(n for n in produced if any(s.get(n) is None for s in found))
    if unknown:
        for b, shapes in zip(batches, found):
            shapes.update(_evaluate(model, b, unknown))
    return found, types, len(unknown)


def _shapes(model: Any, batch: int) -> tuple[Shapes, dict[str, int]]:
    """Shape and element type of every tensor with the input's batch set to `batch` (None: unknown)."""
    from onnx import shape_inference

    try:
        inferred = shape_inference.infer_shapes(_with_batch(model, batch), data_prop=True)
    except Exception as exc:  # noqa: BLE001
        raise SpecError(f"onnx shape inference fails ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})") from None
    shapes: Shapes = {}
    types: dict[str, int] = {}
    _collect(inferred.graph, shapes, types)
    _infer_bodies(inferred, inferred.graph, shapes, types)
    return shapes, types


def _collect(graph: Any, shapes: Shapes, types: dict[str, int]) -> None:
    """The shapes and types an inferred graph declares for its own tensors (not its subgraphs')."""
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        t = vi.type.tensor_type
        types[vi.name] = t.elem_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] if t.HasField("shape") else None
        if shapes.get(vi.name) is None:
            shapes[vi.name] = None if dims is None or None in dims else dims
    for init in graph.initializer:
        shapes[init.name], types[init.name] = list(init.dims), init.data_type


def _held(node: Any, shapes: Shapes) -> list[list[int] | None]:
    """Shapes of the tensors a body's inputs hold: a Loop's iteration number and condition are scalars,
    its carried values those of their initial values; a Scan's states those of their initial values,
    its scanned inputs one slice (the scan axis dropped)."""
    if node.op_type == "Loop":
        return [[], [], *(shapes.get(n) for n in node.input[2:])]
    if node.op_type != "Scan":
        return []
    a = attrs(node)
    scanned = int(a["num_scan_inputs"])
    states = len(node.input) - scanned
    axes = list(a.get("scan_input_axes") or [0] * scanned)
    out = [shapes.get(n) for n in node.input[:states]]
    for name, axis in zip(node.input[states:], axes):
        shape = shapes.get(name)
        out.append(None if shape is None else shape[:axis % len(shape)] + shape[axis % len(shape) + 1:])
    return out


def _infer_bodies(model: Any, graph: Any, shapes: Shapes, types: dict[str, int]) -> None:
    """Shapes inside the subgraphs of `graph`'s nodes: each inferred on its own, its inputs and outer
    references given the shapes they hold, then its own subgraphs."""
    import onnx
    from onnx import helper, shape_inference

    for node in graph.node:
        for body in subgraphs(node):
            alone = onnx.GraphProto()
            alone.CopyFrom(body)
            for value, shape in zip(alone.input, _held(node, shapes)):
                if shape is not None:
                    value.type.CopyFrom(helper.make_tensor_type_proto(value.type.tensor_type.elem_type, shape))
            for name in outer_reads(body):
                if name in types:
                    alone.input.append(helper.make_tensor_value_info(name, types[name], shapes.get(name)))
            try:
                inferred = shape_inference.infer_shapes(helper.make_model(alone, opset_imports=model.opset_import,
                                                                          ir_version=model.ir_version), data_prop=True)
            except Exception:  # noqa: BLE001 - a body onnx cannot infer alone keeps unknown shapes (priced without them)
                continue
            _collect(inferred.graph, shapes, types)
            _infer_bodies(model, inferred.graph, shapes, types)


def _graphs(graph: Any) -> list[Any]:
    """A graph and the subgraphs of its nodes, nested ones included."""
    return [graph, *(sub for node in graph.node for g in subgraphs(node) for sub in _graphs(g))]


def _evaluate(model: Any, batch: int, names: list[str]) -> dict[str, list[int]]:
    """Shapes of `names` computed by onnx's reference evaluator on a random input of batch `batch`."""
    import numpy as np

    try:
        values = run(model, batch, names)
    except SpecError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise SpecError(f"shapes unknown after shape inference and the reference evaluator fails "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})") from None
    return {n: list(np.shape(v)) for n, v in zip(names, values)}


MAX_LOOP_ITERATIONS = 10_000
"""Loop iterations one run of the reference evaluator may take, all Loop nodes together: it runs a
loop body in Python, about a millisecond an iteration, so this keeps a run within seconds. A Loop
whose trip count (or condition) takes it further is refused, not run (a 241-byte file can ask for
10^18 iterations)."""


def _bounded_loop() -> type:
    """onnx's reference Loop, counting the iterations of every Loop of one run against
    `MAX_LOOP_ITERATIONS` (the evaluator hands the class to the subgraphs' evaluators too)."""
    from onnx.reference.ops.op_loop import Loop as ReferenceLoop

    spent = [0]

    class Loop(ReferenceLoop):  # the evaluator keys a replacement by (domain, class name)
        op_domain = ""

        def __init__(self, onnx_node: Any, run_params: Any) -> None:
            super().__init__(onnx_node, run_params)
            body = self._run_body
            name = onnx_node.output[0] if onnx_node.output else onnx_node.name

            def counted(*args: Any, **kwargs: Any) -> Any:
                spent[0] += 1
                if spent[0] > MAX_LOOP_ITERATIONS:
                    raise SpecError(f"Loop {name}: evaluating its shapes would take over {MAX_LOOP_ITERATIONS} loop "
                                    "iterations (its trip count or condition); refusing to run it")
                return body(*args, **kwargs)
            self._run_body = counted
    return Loop


def run(model: Any, batch: int, names: list[str]) -> list[Any]:
    """The values of `names` computed by onnx's reference evaluator on a random input of batch `batch`
    (its Loops bounded: `MAX_LOOP_ITERATIONS`)."""
    import numpy as np
    from onnx.reference import ReferenceEvaluator

    m = _with_batch(model, batch)
    inits = {i.name for i in m.graph.initializer}
    feeds = {}
    rng = np.random.default_rng(0)
    for inp in m.graph.input:
        if inp.name in inits:
            continue
        t = inp.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        if t.elem_type in (6, 7):
            feeds[inp.name] = rng.integers(0, 2, shape).astype(np.int64 if t.elem_type == 7 else np.int32)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    return ReferenceEvaluator(m, new_ops=[_bounded_loop()]).run(names, feeds)


def per_sample(a: list[int] | None, b: list[int] | None, static: int = 0) -> tuple[tuple[int, ...] | None, int | None]:
    """(per-sample shape, index of the batch dimension or None when folded into another) from the
    shapes at batches 2 and 3; (None, None) for a tensor that does not hold the batch. A graph whose
    batch is fixed (`static`, its size) has only `a`: the samples are taken along dimension 0."""
    if static:
        return (tuple(a[1:]), 0) if a and a[0] == static else (None, None)
    if a is None or b is None or len(a) != len(b):
        return None, None
    out, where, found = [], None, False
    for i, (x, y) in enumerate(zip(a, b)):
        if x == y:
            out.append(x)
            continue
        factor = y - x
        if found or factor <= 0 or x != factor * BATCHES[0]:
            return None, None
        found = True
        if factor == 1:
            where = i
        else:
            out.append(factor)
    return (tuple(out), where) if found else (None, None)
