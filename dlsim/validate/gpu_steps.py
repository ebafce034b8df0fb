"""Real training steps of one `StepCase`, eager or compiled, each in a fresh process that a budget can stop.

`train_steps` runs in a spawned process of its own (`dlsim.fresh_process.call_in_fresh_process`): it
loads the zoo model (`load`, the API's loader), prepares it as the case says
(`dlsim.validate.gpu_suite.prepared_model`) and trains it with `IterationRunner` (zero_grad, forward and
loss under autocast where the case says, backward, the calibration's optimizer step; the device
synchronised at the phase boundaries): `warmup` steps, the first of which compiles when `compiled` (its
time is recorded as ``first_step_s``), then at least `steps` timed steps and at least `min_seconds` of
them. A process per measurement means a compiled graph, the CUDA caching allocator and cuDNN's
autotuning start afresh, as in a training job, and a run past its time (a compilation that does not end)
is stopped without losing anything measured before. `step_record` turns what the process returns into
the record the report reads: per phase and per step the median over the timed steps, their spread.

torch is imported inside the functions only.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

from dlsim.errors import DlsimError
from dlsim.fresh_process import call_in_fresh_process
from dlsim.spec.model import Model
from dlsim.validate.compute_iteration import IterationRunner, MeasuredIteration
from dlsim.validate.gpu_suite import StepCase, prepared_model

MODES = ("eager", "compiled")
MIN_START_S = 5.0
"""A measurement is not started with less time left than this (a process takes seconds to start)."""
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
"""``torch.compile`` backends: inductor (generated Triton/C++ kernels, the default), aot_eager (the traced
forward and backward graphs run by eager kernels), eager (Dynamo's capture only)."""


def _graph_breaks() -> int | None:
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return int(sum(counters["graph_break"].values()))


def train_steps(case: StepCase, compiled: bool, *, load: Callable[[str, dict[str, Any]], Model],
                make_optimizer: Callable[[str, Any], tuple[Any, str]], device: str, compile_backend: str,
                warmup: int, steps: int, min_seconds: float, threads: int | None = None) -> dict[str, Any]:
    """Train `case` (see the module docstring); a plain record of what was measured."""
    import torch
    if threads is not None and threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    model = prepared_model(load(case.model, case.override_map), case, device)
    cuda = device == "cuda"
    run = IterationRunner(model, case.batch, make_optimizer, device=device, dtype=case.params_dtype,
                          attention=case.attention, amp=case.amp, compile_backend=compile_backend if compiled else None)
    begin = time.perf_counter()
    first = sum(run.step())
    for _ in range(max(warmup - 1, 0)):
        run.step()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    samples: list[tuple[float, float, float]] = []
    timed = time.perf_counter()
    while len(samples) < steps or time.perf_counter() - timed < min_seconds:
        samples.append(run.step())
    return {"samples": samples, "first_step_s": first, "warmup_s": timed - begin,
            "params": sum(p.numel() for p in run.net.parameters()), "optimizer_impl": run.impl,
            "threads": run.threads, "peak_memory_bytes": float(torch.cuda.max_memory_allocated()) if cuda else None,
            "graph_breaks": _graph_breaks() if compiled else None, "torch": str(torch.__version__),
            "model": model.name, "input_shape": list(model.input_shape)}


def step_record(case: StepCase, mode: str, measured: dict[str, Any]) -> dict[str, Any]:
    """The report's record of one measured case: medians per phase and per step over the timed steps."""
    it = MeasuredIteration(tuple(tuple(s) for s in measured["samples"]), {}, measured["threads"],
                           measured["optimizer_impl"])
    phases = it.phases("median")
    return {"kind": "step", "case": case.key, "mode": mode, "status": "measured", **case.to_dict(),
            "step_s": phases["iteration"], "forward_s": phases["forward"], "backward_s": phases["backward"],
            "optimizer_s": phases["optimizer"], "spread": it.spread, "timed_steps": len(it.samples),
            "step_samples_s": list(it.iteration_samples),
            **{k: measured[k] for k in ("first_step_s", "warmup_s", "params", "optimizer_impl", "threads",
                                        "peak_memory_bytes", "graph_breaks", "torch", "input_shape")}}


def measure_case(case: StepCase, mode: str, timeout_s: float, **kwargs: Any) -> dict[str, Any]:
    """`train_steps` of `case` in `mode` in a fresh process stopped after `timeout_s`; the step record, or a
    record with status ``failed`` or ``cut`` (out of time) and the reason in one line."""
    if mode not in MODES:
        raise DlsimError(f"unknown mode {mode!r} (use {' or '.join(MODES)})")
    base = {"kind": "step", "case": case.key, "mode": mode, **case.to_dict()}
    if timeout_s < MIN_START_S:
        return {**base, "status": "cut", "reason": f"not started: {max(timeout_s, 0.0):.0f} s left in the budget"}
    start = time.perf_counter()
    try:
        measured = call_in_fresh_process(functools.partial(train_steps, **kwargs), case, mode == "compiled",
                                         what=f"training {case.key} ({mode})", timeout_s=timeout_s, daemon=False)
    except DlsimError as exc:
        timed_out = time.perf_counter() - start >= timeout_s
        return {**base, "status": "cut" if timed_out else "failed", "reason": str(exc),
                "seconds": time.perf_counter() - start}
    return {**step_record(case, mode, measured), "seconds": time.perf_counter() - start}
