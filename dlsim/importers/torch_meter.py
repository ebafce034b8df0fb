"""What one PyTorch operator really runs: FLOPs and bytes of its kernels, forward and backward.

`Meter` is a dispatch mode that sees every ATen kernel PyTorch runs (forward, and backward under
autograd) and adds up, per kernel, the FLOPs PyTorch's FLOP counter assigns it
(`torch.utils.flop_counter`, matrix-class work: matmuls, convolutions, attention) and the bytes of
every tensor it reads and writes (views and allocations move none). `flop_registry` is the counter's
table plus its own scaled-dot-product-attention formulas registered for the fused CPU kernel
(``_scaled_dot_product_flash_attention_for_cpu`` and its backward), which the counter leaves out
in torch 2.13, and a convolution backward whose weight-gradient term counts a grouped convolution's
channel pairs (the counter's counts all C_in x C_out pairs: a depthwise convolution's ∇w C times
too high); `counter()` is a `FlopCounterMode` with the same table. `measure_op` runs one
operator of a captured graph on the values it saw and reports its forward, input-gradient and
weight-gradient costs. torch is imported here only, and only when called.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from dlsim.torch_profiling import AllocationMeter

# kernels that allocate or re-label a tensor without reading or writing its elements
_NO_DATA = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias",
            "lift_fresh", "lift_fresh_copy", "sym_size", "sym_numel", "sym_stride", "_local_scalar_dense",
            "_unsafe_view"}  # _unsafe_view: a view of a fresh tensor (reshape's last step), not flagged as a view


def _corrections() -> dict:
    """Formulas (over shapes, as `FlopCounterMode`'s custom mappings take them) that replace or complete
    PyTorch's: the CPU attention kernels (the counter's own SDPA counts) and a group-aware convolution
    backward."""
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten

    def conv_backward(grad_out, x, w, bias, stride, padding, dilation, transposed, output_padding, groups,
                      output_mask, out_shape=None, **kwargs):  # noqa: ANN001, ANN202
        """∇x as the transposed convolution of ∇y with w (the counter's own term); ∇w as the convolution of
        x with ∇y over the channel pairs of each of the `groups` groups: 1/groups of the counter's term,
        which pairs all C_in x C_out channels."""
        def t(shape):  # noqa: ANN001, ANN202
            return [shape[1], shape[0], *shape[2:]]
        total = 0
        if output_mask[0]:
            total += fc.conv_flop_count(grad_out, w, out_shape[0], not transposed)
        if output_mask[1]:
            pair = (t(grad_out), t(x)) if transposed else (t(x), t(grad_out))
            total += fc.conv_flop_count(*pair, t(out_shape[1]), transposed=False) // int(groups)
        return total

    def sdpa(q, k, v, *args, out_shape=None, **kwargs):  # noqa: ANN001, ANN202
        return fc.sdpa_flop_count(q, k, v)

    def sdpa_backward(grad_out, q, k, v, *args, out_shape=None, **kwargs):  # noqa: ANN001, ANN202
        return fc.sdpa_backward_flop_count(grad_out, q, k, v)

    extra = {aten.convolution_backward: conv_backward}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        extra[aten._scaled_dot_product_flash_attention_for_cpu] = sdpa
        extra[aten._scaled_dot_product_flash_attention_for_cpu_backward] = sdpa_backward
    return extra


def flop_registry() -> dict:
    """PyTorch's FLOP formulas per operator with `_corrections` (all taking tensors and ``out_val``)."""
    from torch.utils import flop_counter as fc

    return {**fc.flop_registry, **{k: fc.shape_wrapper(v) for k, v in _corrections().items()}}


def counter() -> Any:
    """A `torch.utils.flop_counter.FlopCounterMode` (no display) with `_corrections`."""
    from torch.utils import flop_counter as fc

    return fc.FlopCounterMode(display=False, custom_mapping=_corrections())


def make_meter() -> Any:
    """A fresh `Meter` (a TorchDispatchMode) with `flops`, `bytes` and `kernels` at zero."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    registry = {getattr(k, "_overloadpacket", k): v for k, v in flop_registry().items()}

    class Meter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.flops, self.bytes, self.kernels = 0.0, 0.0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            packet = func._overloadpacket
            rule = registry.get(packet)
            if rule is not None:
                self.flops += float(rule(*args, **kwargs, out_val=out))
            name = packet.__name__
            if not func.is_view and name not in _NO_DATA:
                seen: set[int] = set()
                for t in tree_flatten((args, kwargs, out))[0]:
                    if isinstance(t, torch.Tensor) and id(t) not in seen:
                        seen.add(id(t))
                        self.bytes += t.numel() * t.element_size()
                self.kernels += 1
            return out

    return Meter()


@contextmanager
def dispatch_counter(owner: dict | None = None, meter: AllocationMeter | None = None) -> Iterator[Any]:
    """A dispatch mode counting the ATen operators run inside it (`count`); with `owner` (autograd node ->
    name), also per name the operators run while the autograd engine executes one of its nodes
    (`by_owner`; the engine's own operators outside any node are not attributed), each tagged for
    `meter` as that name's backward work."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0
            self.by_owner: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            self.count += 1
            if owner is not None:
                name = owner.get(torch._C._current_autograd_node())
                if name is not None:
                    self.by_owner[name] = self.by_owner.get(name, 0) + 1
                    if meter is not None:
                        with meter.tag(name, 1):
                            return func(*args, **(kwargs or {}))
            return func(*args, **(kwargs or {}))

    with Counter() as counter:
        yield counter


@dataclass(frozen=True)
class OpCost:
    """Totals for the whole example batch: forward, input gradients (∇x), weight gradients (∇w)."""

    flops: float = 0.0
    bytes: float = 0.0
    grad_flops: float = 0.0
    grad_bytes: float = 0.0
    wgrad_flops: float = 0.0
    wgrad_bytes: float = 0.0


def measure_op(fn: Callable, args: Sequence, kwargs: dict, weights: Sequence[bool], *, backward: bool = True) -> OpCost:
    """Run ``fn(*args, **kwargs)`` as the captured graph ran it and meter it.

    Tensors in `args`/`kwargs` (flattened) carry the ``requires_grad`` they had in the captured run;
    `weights` says, per flattened tensor, whether it is a parameter (or computed from parameters
    only). Input gradients are the backward towards the other tensors; weight gradients what the
    backward towards the parameters adds. Each run starts from fresh copies (in-place operators).
    """
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    flat, spec = tree_flatten((list(args), dict(kwargs)))
    tensor_at = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]
    is_weight = dict(zip(tensor_at, weights))

    def run(meter: Any | None, grad_of: str) -> tuple[Any, list]:
        leaves, values = [], list(flat)
        for i in tensor_at:
            v = flat[i]
            want = v.requires_grad and v.is_floating_point() and (
                grad_of == "all" or (grad_of == "data") != is_weight[i])
            leaf = v.detach().requires_grad_(want)
            values[i] = leaf.clone() if want else v.detach().clone()
            if want:
                leaves.append(leaf)
        a, k = tree_unflatten(values, spec)
        if meter is None:
            return fn(*a, **k), leaves
        with meter:
            return fn(*a, **k), leaves

    fwd = make_meter()
    with torch.no_grad() if not backward else torch.enable_grad():
        out, _ = run(fwd, "all")
    result = {"flops": fwd.flops, "bytes": fwd.bytes}
    if backward:
        totals = {}
        for which in ("data", "all"):
            out, leaves = run(None, which)
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            if not leaves or not outs:
                totals[which] = (0.0, 0.0)
                continue
            grads = [torch.randn_like(t) for t in outs]
            meter = make_meter()
            with meter:
                torch.autograd.grad(outs, leaves, grads, allow_unused=True)
            totals[which] = (meter.flops, meter.bytes)
        result["grad_flops"], result["grad_bytes"] = totals["data"]
        result["wgrad_flops"] = max(totals["all"][0] - totals["data"][0], 0.0)
        result["wgrad_bytes"] = max(totals["all"][1] - totals["data"][1], 0.0)
    return OpCost(**result)
