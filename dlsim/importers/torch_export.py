"""Capture a PyTorch module at the operator level with `torch.export` and map it onto dlsim layers.

The module is exported in training mode (dropout and batch statistics as in a training step) with a
dynamic batch dimension, so that every tensor's shape says which dimension holds the samples
(``16*s0`` rows of a flattened (batch x 16) matrix): a layer's per-sample shape is its shape with
the batch factor taken out. The captured ATen graph is run once on the example input, so that every
operator's real inputs are known, with ``requires_grad`` as training has it.

Each operator maps onto a dlsim operator where one describes it (`dlsim.importers.torch_ops`: convolutions, linear
and matrix products, attention, normalisations, activations, pooling, embedding, recurrent
layers, residual adds, concatenation, views); the mapping is checked by dlsim's own shape rules
against the captured shape and falls back otherwise. Any other operator becomes a ``generic``
layer carrying what PyTorch really runs for it (`dlsim.importers.torch_meter.measure_op`: FLOPs by
PyTorch's FLOP counter, bytes of every tensor its kernels touch, forward, ∇x and ∇w), per sample.
Operators that do not depend on the input (on weights or constants only) are folded into their
consumers; their parameters are counted there. torch is imported lazily.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import operator
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

from dlsim.errors import SpecError
from dlsim.importers.torch_meter import dispatch_counter
from dlsim.torch_profiling import allocation_meter
from dlsim.importers.graph import Node
from dlsim.importers.torch_ops import MAPPERS
from dlsim.spec.model import INPUT


@dataclass
class Captured:
    """The result of a capture: dlsim nodes, the input entry, parameters, and what fell back."""

    nodes: list[Node]
    input_entry: dict
    dtype: str
    params: int
    batch: int
    dynamic: bool
    folded: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)
    unmeasured: list[str] = field(default_factory=list)


_DATA_DEPENDENT = ("data-dependent", "data dependent", "GuardOnDataDependent", "control flow", "unbacked")


def _export_error(exc: BaseException) -> SpecError:
    text = " ".join(str(exc).split())
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if any(key.lower() in text.lower() for key in _DATA_DEPENDENT):
        return SpecError(f"torch.export cannot capture the module: data-dependent control flow or shapes "
                         f"({type(exc).__name__}: {first[:160]})")
    return SpecError(f"torch.export cannot capture the module ({type(exc).__name__}: {first[:200]})")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torch.export logs graphs and warnings of its own on failures; the user gets one line from us."""
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(before)


def export_module(module: Any, example: tuple) -> tuple[Any, bool]:
    """`torch.export.export` in training mode with a dynamic batch (dimension 0 of each tensor input);
    (exported program, whether the batch stayed symbolic)."""
    import torch

    was_training = module.training
    module.train()
    try:
        dims = tuple({0: torch.export.Dim.AUTO} if isinstance(x, torch.Tensor) and x.dim() else None for x in example)
        try:
            with _quiet():
                ep = torch.export.export(module, example, dynamic_shapes=dims)
        except Exception as exc:  # torch raises many kinds; one line names the reason
            raise _export_error(exc) from None
    finally:
        module.train(was_training)
    user = [s for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    node = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == user[0].arg.name)
    first = node.meta["val"].shape[0]
    return ep, isinstance(first, torch.SymInt) and bool(getattr(first.node.expr, "free_symbols", ()))


class _Shapes:
    """Per-sample shapes from captured shapes: the batch factor taken out of the dimension that holds it."""

    def __init__(self, batch_expr: Any, batch: int):
        self.sym, self.batch = batch_expr, batch

    def split(self, shape: Any) -> tuple[tuple[int, ...] | None, int | None]:
        """(per-sample shape, index of the batch dimension or None when it was folded into another);
        (None, None) when the tensor does not hold the batch (weights, constants) or mixes it."""
        import torch

        out, where, found = [], None, False
        for i, d in enumerate(shape):
            if isinstance(d, torch.SymInt):
                expr = d.node.expr
                if self.sym is not None and self.sym in expr.free_symbols:
                    factor = expr / self.sym
                    if found or factor.free_symbols or not factor.is_integer:
                        return None, None
                    found = True
                    if int(factor) == 1:
                        where = i
                    else:
                        out.append(int(factor))
                    continue
                out.append(int(d.node.hint) if d.node.hint is not None else int(d))
            else:
                out.append(int(d))
        if self.sym is None and out and out[0] == self.batch:  # static capture: samples along dimension 0
            return tuple(out[1:]), 0
        return (tuple(out), where) if found else (None, None)

    def per_sample(self, value: Any) -> tuple[int, ...]:
        """The per-sample shape, or a flat (elements / batch,) when the batch is mixed into it (of the first
        tensor of a tuple)."""
        if not hasattr(value, "shape"):
            from torch.utils._pytree import tree_flatten
            value = next(v for v in tree_flatten(value)[0] if hasattr(v, "shape"))
        shape, _ = self.split(value.shape)
        if shape is not None:
            return shape
        numel = math.prod(int(d) for d in _concrete(value.shape))
        return (numel // self.batch,) if numel >= self.batch and numel % self.batch == 0 else ()

    def axis(self, value: Any, dim: int) -> int | None:
        """The per-sample index of dimension `dim`, None for the batch dimension or a mixed shape."""
        shape, where = self.split(value.shape)
        if shape is None:
            return None
        dim %= len(value.shape)
        if where is None:
            return dim
        return None if dim == where else dim - (dim > where)


def _symbolic_or_run(captured: Any, ran: Any) -> Any:
    """A node's captured (symbolic) value, or the value it took on the example when a size of it is
    data-dependent (an unbacked size, as of a boolean-mask select or ``nonzero``: no hint to read)."""
    import torch
    from torch.utils._pytree import tree_flatten

    unbacked = any(isinstance(d, torch.SymInt) and d.node.hint is None
                   for t in tree_flatten(captured)[0] if isinstance(t, torch.Tensor) for d in t.shape)
    return ran if unbacked and ran is not None else captured


def _concrete(shape: Any) -> list[int]:
    import torch
    return [int(d.node.hint) if isinstance(d, torch.SymInt) and d.node.hint is not None else int(d) for d in shape]


class _Context:
    """State of one capture: values seen, which nodes are activations, parameter ownership."""

    def __init__(self, ep: Any, values: dict, shapes: _Shapes, params: dict[str, Any], input_name: str):
        self.ep, self.values, self.shapes, self.params = ep, values, shapes, params
        self.meta = {n.name: _symbolic_or_run(n.meta.get("val"), values.get(n.name)) for n in ep.graph.nodes}
        self.input_name = input_name
        self.active: set[str] = {input_name}
        self.param_of: dict[str, set[str]] = {}   # folded node / parameter placeholder -> parameters it reads
        self.owner: dict[str, str] = {}            # parameter -> node id of the layer that counts it
        self.alias: dict[str, str] = {input_name: INPUT}   # torch node name -> dlsim node id
        self.nodes: list[Node] = []
        self.fallbacks: dict[str, int] = {}
        self.folded = 0
        self.unmeasured: list[str] = []
        self.canonical: dict[str, str] = {}       # a tied parameter's second name -> its first

    def claim(self, names: set[str], node_id: str) -> int:
        """Count the parameters in `names` not yet counted by an earlier layer; they belong to `node_id`."""
        fresh = [p for p in sorted(names) if p not in self.owner]
        for p in fresh:
            self.owner[p] = node_id
        return sum(self.params[p].numel() for p in fresh)


def _fx_args(node: Any) -> list:
    import torch.fx
    from torch.utils._pytree import tree_flatten
    return [a for a in tree_flatten((node.args, node.kwargs))[0] if isinstance(a, torch.fx.Node)]


def _node_params(ctx: _Context, node: Any) -> set[str]:
    out: set[str] = set()
    for a in _fx_args(node):
        out |= ctx.param_of.get(a.name, set())
    return out


def _activation_inputs(ctx: _Context, node: Any) -> list[str]:
    return [ctx.alias[a.name] for a in _fx_args(node) if a.name in ctx.active and ctx.alias.get(a.name) is not None]


def _scope(node: Any) -> tuple[str, str]:
    """(module path the operator ran in, class name of the module instance that path belongs to)."""
    from dlsim.importers.graph import instance_path

    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path = list(stack.values())[-1][0] or ""
    inst = instance_path(path)
    for p, c in stack.values():
        if p == inst:
            name = c if isinstance(c, str) else getattr(c, "__qualname__", "")
            return path, name.rsplit(".", 1)[-1]
    return path, ""


def _op_name(node: Any) -> str:
    target = node.target
    if target is operator.getitem:
        return "getitem"
    name = getattr(target, "__name__", str(target))
    packet = getattr(target, "_overloadpacket", None)
    if packet is not None:
        return f"aten.{packet.__name__}"
    return name


def _run(ep: Any, example: tuple, params: dict, counts: dict[str, list[int]] | None = None,
         allocated: dict[str, list[float]] | None = None) -> dict:
    """Every node's value on the example input (parameters as leaves that need gradients); with `counts`,
    also per node [ATen operators its forward dispatches, ATen operators its backward dispatches] (the
    backward run from every output that needs a gradient; an operator the autograd engine runs is
    attributed to the node whose forward created the autograd node running it); with `allocated`, per
    node [forward, backward] bytes the CPU allocator hands out (`dlsim.torch_profiling.allocation_meter`)."""
    import torch
    import torch.fx

    values: dict[str, Any] = {}
    args = []
    user = iter(example)
    for spec in ep.graph_signature.input_specs:
        kind = spec.kind.name
        if kind == "USER_INPUT":
            args.append(next(user))
        elif kind == "PARAMETER":
            args.append(params[spec.arg.name])
        elif spec.target in ep.state_dict:
            args.append(ep.state_dict[spec.target].detach().clone())
        else:
            args.append(ep.constants[spec.target].detach().clone() if isinstance(ep.constants[spec.target], torch.Tensor)
                        else ep.constants[spec.target])

    forward: dict[str, int] = {}
    owner: dict[Any, str] = {}  # autograd node -> the graph node whose operators created it

    with allocation_meter() if allocated is not None else contextlib.nullcontext() as meter:
        class Recorder(torch.fx.Interpreter):
            def run_node(self, n: Any) -> Any:
                with meter.tag(n.name, 0) if meter else contextlib.nullcontext(), dispatch_counter() as counter:
                    out = super().run_node(n)
                forward[n.name] = counter.count
                values[n.name] = out
                _claim_autograd_nodes(out, n.name, owner)
                return out

        out = Recorder(ep.graph_module).run(*args)
        if counts is not None or allocated is not None:
            from torch.utils._pytree import tree_flatten
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            backward: dict[str, int] = {}
            if outs:
                with dispatch_counter(owner, meter) as counter:
                    torch.autograd.backward(outs, [torch.randn_like(t) for t in outs], retain_graph=True)
                backward = counter.by_owner
            if counts is not None:
                counts.update({name: [n, backward.get(name, 0)] for name, n in forward.items()})
    if meter is not None:
        allocated.update(meter.bytes)
    return values


def _allocation_lines(ep: Any, example: tuple, params: dict, at_batch: dict[str, list[float]],
                      dynamic: bool) -> dict[str, list[float]]:
    """Per node [forward fixed, forward per sample, backward fixed, backward per sample] bytes allocated:
    from the example batch b and, when the batch is symbolic, a second run at 2b (bytes = fixed +
    per_sample · batch; weight gradients are fixed, activations scale); a static capture counts all
    of it per sample."""
    import torch
    b = int(example[0].shape[0])
    twice: dict[str, list[float]] = {}
    if dynamic:
        try:
            _run(ep, (torch.cat([example[0], example[0]]),), params, allocated=twice)
        except Exception:  # noqa: BLE001 - the example batch alone still gives a line through zero
            twice = {}
    out = {}
    for name in set(at_batch) | set(twice):
        line = []
        for k in range(2):
            one = at_batch.get(name, [0.0, 0.0])[k]
            two = twice.get(name, [0.0, 0.0])[k] if twice else 2 * one
            per = max(0.0, (two - one) / b)
            fixed = max(0.0, one - per * b)
            line += [fixed, per]
        out[name] = line
    return out


def _attach_host_work(entry: dict, unplaced: list, own: list) -> list:
    """Give a layer entry its own and the unplaced nodes' ATen operators (``host_ops``) and allocations
    (``allocated_bytes``); returns the emptied carry."""
    total = [u + v for u, v in zip(unplaced, own)]
    entry["host_ops"] = [int(total[0]), int(total[1])]
    if any(total[2:]):
        entry["allocated_bytes"] = [float(f"{v:.6g}") for v in total[2:6]]
    return [0] * 6


def _claim_autograd_nodes(out: Any, name: str, owner: dict) -> None:
    """Every autograd node reachable from `out`'s grad_fn that no earlier graph node claimed belongs to
    `name` (its backward runs on behalf of that operator; a parameter's AccumulateGrad goes to its first
    reader)."""
    from torch.utils._pytree import tree_flatten
    stack = [t.grad_fn for t in tree_flatten(out)[0] if getattr(t, "grad_fn", None) is not None]
    while stack:
        node = stack.pop()
        if node is None or node in owner:
            continue
        owner[node] = name
        stack.extend(f for f, _ in node.next_functions)


def capture(module: Any, example: tuple, *, measure: bool = True) -> Captured:
    """Export `module` on `example` (a tuple holding one batch-first tensor) and map it onto dlsim nodes."""
    import torch
    import torch.fx
    from torch.utils._pytree import tree_flatten

    from dlsim.importers.torch_meter import measure_op

    tensors = [x for x in example if isinstance(x, torch.Tensor)]
    if len(tensors) != 1 or len(example) != 1:
        raise SpecError(f"a dlsim model has one input tensor; the module was given {len(example)} inputs")
    x = tensors[0]
    if x.dim() < 2 or x.shape[0] < 2:
        raise SpecError(f"the example input needs a batch dimension of at least 2 first, got shape {list(x.shape)}")
    batch = int(x.shape[0])
    ep, dynamic = export_module(module, example)
    spec_of = {s.arg.name: s for s in ep.graph_signature.input_specs}
    params: dict[str, Any] = {}
    seen: dict[int, str] = {}
    for pname, s in spec_of.items():
        if s.kind.name == "PARAMETER":
            held = ep.state_dict[s.target]
            if id(held) in seen:  # the same tensor under a second name (tied weights): one parameter
                params[pname] = params[seen[id(held)]]
                continue
            seen[id(held)] = pname
            params[pname] = held.detach().clone().requires_grad_(True)
    input_name = next(name for name, s in spec_of.items() if s.kind.name == "USER_INPUT")
    counts: dict[str, list[int]] = {}
    allocated: dict[str, list[float]] = {}
    try:
        values = _run(ep, example, params, counts, allocated)
    except Exception as exc:  # noqa: BLE001 - the captured graph fails on its own example: one line
        raise SpecError(f"the captured graph does not run on the example input ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
    lines = _allocation_lines(ep, example, params, allocated, dynamic)
    # per node: ATen operators [forward, backward], then bytes allocated (`_allocation_lines`)
    dispatched = {name: [*counts.get(name, [0, 0]), *lines.get(name, [0.0] * 4)] for name in set(counts) | set(lines)}
    in_node = next(n for n in ep.graph.nodes if n.name == input_name)
    sym = None
    if dynamic:
        sym = next(iter(in_node.meta["val"].shape[0].node.expr.free_symbols))
    shapes = _Shapes(sym, batch)
    ctx = _Context(ep, values, shapes, params, input_name)
    ctx.canonical = {name: seen[id(ep.state_dict[spec_of[name].target])] for name in params}
    for name in params:
        ctx.param_of[name] = {ctx.canonical[name]}
    # nodes that reach an output: the backward runs through these only
    live: set[str] = set()
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    stack = [a for a in _fx_args(out_node)]
    while stack:
        n = stack.pop()
        if n.name not in live:
            live.add(n.name)
            stack.extend(_fx_args(n))

    unplaced = [0] * 6  # operators and allocations of folded nodes not yet charged to a layer
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        args = _fx_args(node)
        value = values.get(node.name)
        if not any(a.name in ctx.active for a in args):
            ctx.param_of[node.name] = _node_params(ctx, node)
            if isinstance(value, torch.Tensor):
                ctx.folded += 1
            if node.name in dispatched:  # run every step all the same (a batch norm's counter += 1): the next layer pays
                unplaced = [u + v for u, v in zip(unplaced, dispatched.pop(node.name))]
            continue
        leaves = [v for v in tree_flatten(ctx.meta[node.name])[0] if isinstance(v, torch.Tensor)]
        if not leaves:  # symbolic sizes and other non-tensor values are arguments, not layers
            continue
        ctx.active.add(node.name)
        out = shapes.per_sample(leaves[0])
        scope, cls = _scope(node)
        if node.target is operator.getitem:
            src = node.args[0]
            index = node.args[1]
            src_id = ctx.alias.get(src.name)
            if index == 0 and src_id is not None:
                ctx.alias[node.name] = src_id
                continue
        ins = [shapes.per_sample(ctx.meta[a.name]) for a in args if a.name in ctx.active and ctx.alias.get(a.name)]
        in_ids = _activation_inputs(ctx, node)
        op = _op_name(node)
        short = op.split(".", 1)[-1]
        mapper = MAPPERS.get(short)
        mapped = mapper(ctx, node, ins, out) if mapper is not None and node.target is not operator.getitem else None
        if mapped is not None:
            for suffix, entry, local_ins in mapped:
                nid = node.name + suffix
                inputs = in_ids if local_ins is None else [node.name + s if s.startswith("_") else s for s in local_ins]
                tied = entry.pop("tied_to", None)
                if entry["type"] not in ("reshape",):
                    ctx.claim(_node_params(ctx, node), nid)
                if suffix == "" and node.name in dispatched:
                    unplaced = _attach_host_work(entry, unplaced, dispatched[node.name])
                ctx.nodes.append(Node(nid, entry, inputs, scope, cls, op, tied))
            ctx.alias[node.name] = node.name
            continue
        # the generic operator: what PyTorch runs for it, per sample
        nparams = ctx.claim(_node_params(ctx, node), node.name)
        cost = None
        if measure and node.target is not operator.getitem:
            weights = []
            for a in tree_flatten((list(node.args), dict(node.kwargs)))[0]:
                held = values[a.name] if isinstance(a, torch.fx.Node) else a
                frozen = not (isinstance(a, torch.fx.Node) and a.name in ctx.active)
                weights += [frozen for t in tree_flatten(held)[0] if isinstance(t, torch.Tensor)]
            call_args, call_kwargs = _rebuild(node, values)
            try:
                cost = measure_op(node.target, call_args, call_kwargs, weights, backward=node.name in live)
            except Exception:  # noqa: BLE001 - never refuse a traced network: price it by its tensors
                cost = _by_tensors(call_args, call_kwargs, values[node.name], node.name in live)
                ctx.unmeasured.append(op)
        entry = {"type": "generic", "op": op if node.target is not operator.getitem else f"{_op_name(node.args[0])}[{node.args[1]}]",
                 "shape": list(out), "params": nparams}
        if cost is not None:
            for key in ("flops", "bytes", "grad_flops", "grad_bytes", "wgrad_flops", "wgrad_bytes"):
                v = getattr(cost, key) / batch
                if v:
                    entry[key] = float(f"{v:.6g}")
        if not in_ids:
            in_ids = [INPUT]
        if node.name in dispatched:
            unplaced = _attach_host_work(entry, unplaced, dispatched[node.name])
        ctx.nodes.append(Node(node.name, entry, in_ids, scope, cls, entry["op"]))
        ctx.alias[node.name] = node.name
        ctx.fallbacks[entry["op"]] = ctx.fallbacks.get(entry["op"], 0) + 1
    aliases = {name for name in params if ctx.canonical[name] != name}
    unowned = sorted(set(params) - set(ctx.owner) - aliases)
    if unowned:  # parameters no operator that depends on the input reads: count them on the last layer
        last = ctx.nodes[-1]
        extra = ctx.claim(set(unowned), last.id)
        if last.entry["type"] == "generic":
            last.entry["params"] += extra
        else:
            ctx.nodes.append(Node(last.id + "_unused_params", {"type": "generic", "op": "unused parameters",
                                                                "shape": list(_out_shape(last, ctx)), "params": extra},
                                  [last.id], last.scope, last.cls, "unused parameters"))
    x_shape = shapes.per_sample(ctx.meta[input_name])
    if not x.is_floating_point():
        if len(x_shape) != 1:
            raise SpecError(f"integer inputs are token ids of shape (batch, L); got shape {list(x.shape)}")
        input_entry = {"tokens": int(x_shape[0])}
    else:
        input_entry = {"shape": [int(d) for d in x_shape]}
    first_param = next(iter(params.values()), None)
    dtype = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(first_param.dtype if first_param is not None else None,
                                                                 "fp32")
    total = sum(p.numel() for name, p in params.items() if name not in aliases)
    return Captured(ctx.nodes, input_entry, dtype, total, batch, dynamic, ctx.folded, ctx.fallbacks, ctx.unmeasured)


def _by_tensors(args: list, kwargs: dict, out: Any, backward: bool) -> Any:
    """An operator that cannot be re-run alone, priced by the bytes of its inputs and outputs (read and
    written once forward; the backward reads the output gradient and the inputs and writes their
    gradients) and no FLOPs."""
    import torch
    from torch.utils._pytree import tree_flatten

    from dlsim.importers.torch_meter import OpCost

    def size(tree: Any) -> float:
        return float(sum(t.numel() * t.element_size() for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)))
    ins, outs = size((args, kwargs)), size(out)
    return OpCost(bytes=ins + outs, grad_bytes=(2 * ins + outs) if backward else 0.0)


def _out_shape(node: Node, ctx: _Context) -> tuple:
    return tuple(ctx.shapes.per_sample(ctx.meta[node.id])) if node.id in ctx.values else ()


def _rebuild(node: Any, values: dict) -> tuple[list, dict]:
    """The node's arguments with graph nodes replaced by the values they took."""
    import torch.fx
    from torch.utils._pytree import tree_map

    def sub(a: Any) -> Any:
        return values[a.name] if isinstance(a, torch.fx.Node) else a
    return list(tree_map(sub, list(node.args))), dict(tree_map(sub, dict(node.kwargs)))
