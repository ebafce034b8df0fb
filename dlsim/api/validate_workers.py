"""Each model's training iterations in its own process, stepped in turn from the caller.

Why: a training job runs one model in one process. Timing several models inside one process (the
round robin of `dlsim.validate.compute_iteration.interleaved_iterations`) leaves every model's
tensors, optimizer state and freed-but-retained heap in the process, and the small models then run
in a state no real job has: measured on the 2-core EPYC, LeNet-5 (batch 64) took 25.6 ms per
iteration beside one other model and 28.5 ms beside all eight other zoo models, with the same
round robin and statistic (reports/validation-cpu.md). A `WorkerRunner` keeps the round robin —
slow drift of a shared machine still falls on all models alike — but each model lives in a spawned
process of its own; the caller only sends "step" and receives the worker's own timings, so the
messaging is outside every timed span.

torch is imported inside the worker only.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any, Mapping

from dlsim.errors import DlsimError


def _serve(conn: Any, spec: str, overrides: dict, batch: int, device: str, optimizer: str, attention: str,
           threads: int | None, retain_memory: bool) -> None:
    """The worker: build the model, then answer ("step",), ("layers", repeats) and ("close",)."""
    try:
        from dlsim.io.model_yaml import load_model
        model = load_model(spec, overrides or None)
        from dlsim.calibrate.compute_ops import make_optimizer
        from dlsim.calibrate.compute_timer import set_threads, warm_allocator
        from dlsim.validate.compute_iteration import IterationRunner
        set_threads(threads)
        if retain_memory:
            warm_allocator()
        run = IterationRunner(model, batch, make_optimizer, device=device, dtype=model.dtype, optimizer=optimizer,
                              attention=attention)
        conn.send(("ready", run.threads, run.impl))
    except Exception as exc:  # reported to the caller as one line
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        msg = conn.recv()
        try:
            if msg[0] == "step":
                conn.send(("ok", run.step()))
            elif msg[0] == "layers":
                conn.send(("ok", run.layer_spans(msg[1])))
            else:
                conn.send(("ok", None))
                return
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class WorkerRunner:
    """`IterationRunner`'s interface (`step`, `layer_spans`, `threads`, `impl`) over a spawned process.

    The worker loads the model again from `model.source` (a zoo model's or a YAML file's path) with
    `overrides`, so a model built in memory only cannot be isolated."""

    def __init__(self, model: Any, batch: int, *, overrides: Mapping[str, Any] | None = None, device: str = "cpu",
                 optimizer: str = "adam", attention: str = "math", threads: int | None = None,
                 retain_memory: bool = True):
        if not model.source:
            raise DlsimError(f"model {model.name!r} has no source file to load in a worker process; "
                             "time it in this process instead")
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, str(model.source), dict(overrides or {}), batch, device,
                                                      optimizer, attention, threads, retain_memory), daemon=True)
        self._proc.start()
        child.close()
        self.model = model
        ready = self._receive()
        self.threads, self.impl = ready[1], ready[2]

    def _receive(self) -> Any:
        try:
            reply = self._conn.recv()
        except EOFError:
            raise DlsimError(f"the worker timing {self.model.name} stopped (exit code {self._proc.exitcode})") from None
        if reply[0] == "error":
            self.close()
            raise DlsimError(f"the worker timing {self.model.name} failed: {reply[1]}")
        return reply

    def _ask(self, *msg: Any) -> Any:
        self._conn.send(msg)
        return self._receive()[1]

    def step(self) -> tuple[float, float, float]:
        return tuple(self._ask("step"))

    def layer_spans(self, repeats: int) -> Mapping[str, list[tuple[float, float]]]:
        return self._ask("layers", repeats)

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(("close",))
                self._conn.recv()
            except (EOFError, BrokenPipeError, OSError):
                pass
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
        self._conn.close()
