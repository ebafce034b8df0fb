"""A user's own PyTorch module trained in a plain loop, timed as its user runs it.

One step is what a training script writes (`dlsim.plain_loop.PlainLoop`)::

    opt.zero_grad(set_to_none=True); out = net(x); loss = F.cross_entropy(out.reshape(-1, C), y)
    loss.backward(); opt.step()

The loss is cross-entropy over the output's last dimension C (classes of a classifier, vocabulary of a
language model; an output of any other layout is trained the same way, every position a sample),
with random targets. The optimizer is PyTorch's, built by the caller's `make_optimizer` (the API passes
the calibration's, so the step validated is the step calibrated). Nothing in the process is tuned: no
mallopt, the allocator as it comes, unless the caller's `prepare` puts it in another regime first.

`run_loop` runs in a process of its own (`time_in_worker`: spawned, so nothing of the caller's heap,
threads or imports is inherited) and returns per-step (forward + loss, backward, optimizer) seconds
and, from `profile_steps` steps under ``torch.profiler``, the self time of every ATen operator per
step, grouped onto dlsim operator kinds (`op_kind`).

torch is imported inside the functions only.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Sequence

from dlsim.fresh_process import call_in_fresh_process
from dlsim.hostmem import faulted_bytes
from dlsim.plain_loop import PlainLoop, float_dtype_of, make_batch
from dlsim.torch_profiling import quiet_fd2

KINDS = ("convolution", "matmul", "attention", "normalization", "recurrent", "embedding", "loss", "optimizer",
         "memory-bound")
"""Operator kinds the per-operator comparison uses, each both a set of dlsim layer types and of ATen ops."""

_LAYER_KIND = {"conv2d": "convolution", "conv1d": "convolution", "conv_transpose2d": "convolution",
               "linear": "matmul", "matmul": "matmul", "sdpa": "attention", "attention": "attention",
               "batchnorm": "normalization", "layernorm": "normalization", "groupnorm": "normalization",
               "rmsnorm": "normalization", "lrn": "normalization", "lstm": "recurrent", "gru": "recurrent",
               "rnn": "recurrent", "embedding": "embedding", "cross_entropy": "loss"}
_ATEN_KIND = (("convolution", "convolution"), ("conv", "convolution"), ("scaled_dot_product", "attention"),
              ("flash_attention", "attention"), ("addmm", "matmul"), ("bmm", "matmul"), ("aten::mm", "matmul"),
              ("matmul", "matmul"), ("linear", "matmul"), ("batch_norm", "normalization"),
              ("layer_norm", "normalization"), ("group_norm", "normalization"), ("rms_norm", "normalization"),
              ("lstm", "recurrent"), ("gru", "recurrent"), ("rnn", "recurrent"), ("embedding", "embedding"),
              ("nll_loss", "loss"), ("log_softmax", "loss"), ("cross_entropy", "loss"), ("_fused_adam", "optimizer"),
              ("_fused_sgd", "optimizer"), ("_foreach", "optimizer"))


def layer_kind(layer_type: str) -> str:
    """The operator kind of a dlsim layer type (anything else is memory-bound, generic included)."""
    return _LAYER_KIND.get(layer_type, "memory-bound")


def op_kind(aten_name: str) -> str:
    """The operator kind of an ATen operator name as the profiler reports it (``aten::addmm``)."""
    name = aten_name.lower()
    for key, kind in _ATEN_KIND:
        if key in name:
            return kind
    return "memory-bound"


def op_times(loop: PlainLoop, steps: int) -> dict[str, float]:
    """Seconds per step of `loop` by operator kind: ATen self CPU times of `steps` profiled steps."""
    from torch.profiler import ProfilerActivity, profile

    with quiet_fd2(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            loop.step()
    out = {k: 0.0 for k in KINDS}
    for ev in prof.key_averages():
        if ev.key.startswith("aten::") or ev.key.startswith("Optimizer"):
            kind = "optimizer" if ev.key.startswith("Optimizer") else op_kind(ev.key)
            out[kind] += ev.self_cpu_time_total * 1e-6 / steps
    return out


def run_loop(factory: str, input_shape: Sequence[int], batch: int, *, loader: Callable[[str], Any],
             make_optimizer: Callable[[str, Any], tuple[Any, str]], prepare: Callable[[], Any] | None = None,
             tokens: bool = False, vocab: int = 2, optimizer: str = "adam", warmup: int = 3, steps: int = 10,
             profile_steps: int = 3, min_seconds: float = 0.0) -> dict[str, Any]:
    """Run `prepare()` (threads, allocator regime), build the module `loader(factory)` gives (``FILE.py:NAME``),
    time `steps` plain steps after `warmup` (and more until `min_seconds` of timed steps), then
    `profile_steps` profiled ones; a plain record. The callables are module-level functions (or partials of
    them), so that a spawned worker can receive them."""
    import torch
    if prepare is not None:
        prepare()
    torch.manual_seed(0)
    module = loader(factory)
    x = make_batch(input_shape, batch, tokens, vocab, dtype=float_dtype_of(module))
    loop = PlainLoop(module, x, optimizer, make_optimizer)
    for _ in range(warmup):
        loop.step()
    samples, begin = [], time.perf_counter()
    faults = faulted_bytes()
    while len(samples) < steps or time.perf_counter() - begin < min_seconds:
        samples.append(loop.step())
    faulted = (faulted_bytes() - faults) / len(samples)
    ops = op_times(loop, profile_steps) if profile_steps else {}
    return {"samples": samples, "ops": ops, "threads": loop.threads, "optimizer_impl": loop.impl,
            "parameters": sum(p.numel() for p in loop.net.parameters()), "faulted_bytes_per_step": faulted}


def time_in_worker(factory: str, input_shape: Sequence[int], batch: int, **kwargs: Any) -> dict[str, Any]:
    """`run_loop` in a spawned process of its own (a fresh process, as a training job is)."""
    return call_in_fresh_process(functools.partial(run_loop, **kwargs), factory, list(input_shape), batch,
                                 what=f"timing {factory}")
