"""Timing real training iterations of a dlsim model in PyTorch, end to end and per layer.

An iteration is what a training loop runs: ``zero_grad(set_to_none=True)``, forward (the
`dlsim.validate.torch_model` module, loss included), ``loss.backward()`` and ``optimizer.step()``
built by `make_optimizer(name, parameters) -> (optimizer, implementation)` (the API passes the
calibration's, so that the step validated is the step calibrated). After `warmup` iterations (allocator,
oneDNN primitive caches, cuDNN autotuning), `repeats` iterations are timed with the device
synchronised at the phase boundaries; `MeasuredIteration` summarises them by their median (or,
on a busy machine, their minimum) per phase and in total.

Per-layer times come from separate iterations with hooks on every layer module (forward
pre/post hooks; full backward pre/post hooks, which fire when the gradient of the layer's output
arrives and when its input gradient is done): the hooks add autograd nodes and Python calls, so
the end-to-end numbers are taken without them. A layer's backward time is the span between its
two backward hooks, which is ∇x + ∇w of that layer (and, for the first layer of a branch, the
gradient accumulation PyTorch performs where its input fans out).

torch is imported inside the functions only.
"""

from __future__ import annotations

import math
import statistics
from contextlib import nullcontext
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from dlsim.errors import SpecError
from dlsim.hostmem import faulted_bytes
from dlsim.progress import PHASE_RUNNING
from dlsim.spec.model import Model
from dlsim.validate.torch_model import build_torch_model, example_batch, module_key, torch_dtype

@dataclass(frozen=True)
class MeasuredIteration:
    """Timed iterations: (forward, backward, optimizer) seconds of each, per-layer (forward, backward)
    samples from the hooked iterations; summarised by a statistic ("median" or "min")."""

    samples: tuple[tuple[float, float, float], ...]
    layer_samples: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    threads: int = 0
    optimizer_impl: str = ""
    faulted_bytes_per_step: float | None = None
    """Minor page faults x page size per timed iteration (None where not counted)."""

    @property
    def iteration_samples(self) -> tuple[float, ...]:
        return tuple(sum(p) for p in self.samples)

    def phases(self, statistic: str = "median") -> dict[str, float]:
        """forward, backward, optimizer and iteration seconds (each summarised on its own)."""
        pick = min if statistic == "min" else statistics.median
        out = {name: pick(p[i] for p in self.samples) for i, name in enumerate(("forward", "backward", "optimizer"))}
        out["iteration"] = pick(self.iteration_samples)
        return out

    def layers(self, statistic: str = "median") -> dict[str, tuple[float, float]]:
        pick = min if statistic == "min" else statistics.median
        return {name: (pick(v[0] for v in vs), pick(v[1] for v in vs)) for name, vs in self.layer_samples.items() if vs}

    @property
    def spread(self) -> float:
        """(max − min) / median of the timed iterations."""
        s = self.iteration_samples
        mid = statistics.median(s) if s else 0.0
        return (max(s) - min(s)) / mid if mid > 0 else 0.0


def _hooks(net: Any, model: Model, clock: Callable[[], float], sync: Callable[[], None],
           marks: dict[str, dict[str, float]]) -> list[Any]:
    """Hooks writing each layer's forward start/end ("f0", "f1") and backward start/end ("b0", "b1")
    of the current iteration into `marks`. The backward end is the later of the full backward hook
    and the gradient accumulation of the layer's own (unshared) parameters: for a layer whose input
    needs no gradient the backward hook fires before its ∇w is done."""
    owners: dict[int, list[str]] = {}
    for layer in model.layers:
        for p in net.layers[module_key(layer.name)].parameters():
            owners.setdefault(id(p), []).append(layer.name)
    handles = []
    for layer in model.layers:
        module, name = net.layers[module_key(layer.name)], layer.name
        def stamp(key: str, name: str = name, latest: bool = False) -> Callable[..., None]:
            def hook(*_args: Any) -> None:
                sync()
                now = clock()
                m = marks.setdefault(name, {})
                m[key] = max(now, m.get(key, now)) if latest else now
            return hook
        handles += [module.register_forward_pre_hook(stamp("f0")), module.register_forward_hook(stamp("f1")),
                    module.register_full_backward_pre_hook(stamp("b0")),
                    module.register_full_backward_hook(stamp("b1", latest=True))]
        for p in module.parameters():
            if p.requires_grad and len(set(owners[id(p)])) == 1:
                handles.append(p.register_post_accumulate_grad_hook(stamp("b1", latest=True)))
    return handles


class IterationRunner:
    """One model built in PyTorch with its batch and optimizer, ready to run timed training steps
    (several runners can live side by side and be stepped in turn: `interleaved_iterations`).

    `amp` (a dlsim dtype name, e.g. "bf16") runs the forward pass and the loss under ``torch.autocast``
    with the parameters kept in `dtype` (automatic mixed precision); a model whose convolutions are
    ``memory_format: channels_last`` gets its image input in channels-last layout too; `compile_backend`
    ("inductor", "aot_eager", "eager") wraps the module in ``torch.compile`` (the first steps compile)."""

    def __init__(self, model: Model, batch: int, make_optimizer: Callable[[str, Any], tuple[Any, str]], *,
                 device: str = "cpu", dtype: str = "fp32", optimizer: str = "adam", attention: str = "math",
                 seed: int = 0, amp: str | None = None, compile_backend: str | None = None):
        import torch
        torch.manual_seed(seed)
        dev = torch.device(device)
        self.model = model
        self.sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        self.clock = time.perf_counter
        self.net = build_torch_model(model, device=dev, dtype=dtype, attention=attention).train()
        self.x, self.target = example_batch(model, batch, device=dev, dtype=dtype, seed=seed)
        if self.target is None:
            raise SpecError("validation trains the model: it needs a cross_entropy loss layer", path=model.source)
        if self.x.dim() == 4 and any(layer.attrs.get("memory_format") == "channels_last" for layer in model.layers):
            self.x = self.x.contiguous(memory_format=torch.channels_last)
        self.opt, self.impl = make_optimizer(optimizer, self.net.parameters())
        self.threads = torch.get_num_threads()
        self.autocast = (lambda: torch.autocast(dev.type, dtype=torch_dtype(amp))) if amp else nullcontext
        self.forward = torch.compile(self.net, backend=compile_backend) if compile_backend else self.net

    def step(self) -> tuple[float, float, float]:
        """One training step: (forward, backward, optimizer) seconds."""
        sync, clock = self.sync, self.clock
        sync()
        t0 = clock()
        self.opt.zero_grad(set_to_none=True)
        with self.autocast():
            loss = self.forward(self.x, self.target)
        sync()
        t1 = clock()
        loss.backward()
        sync()
        t2 = clock()
        self.opt.step()
        sync()
        return t1 - t0, t2 - t1, clock() - t2

    def layer_spans(self, repeats: int) -> dict[str, list[tuple[float, float]]]:
        """Per-layer (forward, backward) seconds of `repeats` hooked steps (after one hooked warm-up)."""
        marks: dict[str, dict[str, float]] = {}
        spans: dict[str, list[tuple[float, float]]] = {layer.name: [] for layer in self.model.layers}
        handles = _hooks(self.net, self.model, self.clock, self.sync, marks)
        try:
            with warnings.catch_warnings():  # layers fed by the input: handled by the parameter hooks
                warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
                for i in range(repeats + 1):  # the first iteration with hooks is a warm-up
                    marks.clear()
                    self.step()
                    for name, m in marks.items():
                        if i > 0:
                            spans[name].append((m.get("f1", 0.0) - m.get("f0", 0.0),
                                                m["b1"] - m["b0"] if "b0" in m and "b1" in m else 0.0))
        finally:
            for h in handles:
                h.remove()
        return spans


def measure_iteration(model: Model, batch: int, make_optimizer: Callable[[str, Any], tuple[Any, str]], *,
                      device: str = "cpu", dtype: str = "fp32", optimizer: str = "adam", warmup: int = 2,
                      repeats: int = 5, per_layer: bool = True, attention: str = "math", seed: int = 0,
                      progress: Callable[[int, int, str, str], None] | None = None) -> MeasuredIteration:
    """Time training iterations of `model` (see the module docstring). `progress(done, total, what, PHASE_RUNNING)`
    is called between steps, never inside one (the faulted bytes are counted around each timed step alone)."""
    def say(done: int, total: int, what: str) -> None:
        if progress:
            progress(done, total, what, PHASE_RUNNING)
    hooked = repeats + 1 if per_layer else 0
    total = warmup + repeats + hooked
    say(0, total, f"building {model.name} in PyTorch")
    run = IterationRunner(model, batch, make_optimizer, device=device, dtype=dtype, optimizer=optimizer,
                          attention=attention, seed=seed)
    for i in range(warmup):
        say(i, total, f"warm-up step {i + 1}/{warmup}")
        run.step()
    phases, faulted = [], 0
    for i in range(repeats):
        say(warmup + i, total, f"timed step {i + 1}/{repeats}")
        before = faulted_bytes()
        phases.append(run.step())
        faulted += faulted_bytes() - before
    if per_layer:
        say(warmup + repeats, total, f"per-layer steps (hooked, {hooked})")
    spans = run.layer_spans(repeats) if per_layer else {}
    say(total, total, "measured")
    return MeasuredIteration(tuple(phases), spans, run.threads, run.impl, faulted / repeats)


def interleaved_iterations(runners: list[IterationRunner], rounds: int, *, min_round_s: float = 0.3,
                           warmup: int = 1, per_layer_repeats: int = 0,
                           progress: Callable[[int, int], None] | None = None) -> list[MeasuredIteration]:
    """Time several models in round robin, so that slow drift of the machine (other processes
    starting and stopping) falls on all of them alike instead of on whichever ran at that moment.

    Each round runs, for every runner in turn, `warmup` untimed steps (the previous model left the
    caches and the allocator in its own state) and then timed steps: at least two, and enough that
    the model's timed steps of one round last `min_round_s` (short models get more samples). After
    all rounds, `per_layer_repeats` hooked steps per model give the per-layer times."""
    samples: list[list[tuple[float, float, float]]] = [[] for _ in runners]
    per_round = []
    for run in runners:  # first touch (allocator, primitive caches) and sizing
        run.step()
        first = max(sum(run.step()), 1e-6)
        per_round.append(max(2, math.ceil(min_round_s / first)))
    for r in range(rounds):
        for i, run in enumerate(runners):
            for _ in range(warmup):
                run.step()
            samples[i] += [run.step() for _ in range(per_round[i])]
        if progress:
            progress(r + 1, rounds)
    return [MeasuredIteration(tuple(samples[i]), run.layer_spans(per_layer_repeats) if per_layer_repeats else {},
                              run.threads, run.impl) for i, run in enumerate(runners)]
