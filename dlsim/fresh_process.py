"""Run one function in a new process of its own and bring back its result or its error as one line.

A training step's allocator state (glibc's heap and thresholds) depends on everything the process did
before, so a measurement that stands for a training job runs in a process that did nothing else: a
new interpreter (``spawn``), with its own hash seed and heap history, as a training job starts.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any, Callable

from dlsim.errors import DlsimError


def _call(conn: Any, fn: Callable[..., Any], args: tuple) -> None:
    try:
        conn.send(("ok", fn(*args)))
    except Exception as exc:  # reported to the caller as one line
        conn.send(("error", f"{type(exc).__name__}: {exc}".splitlines()[0]))


def call_in_fresh_process(fn: Callable[..., Any], *args: Any, what: str, timeout_s: float | None = None,
                          daemon: bool = True) -> Any:
    """``fn(*args)`` (a module-level function, picklable arguments) in a fresh process; `what` names the
    work in errors ("timing net.py:Net"). Raises DlsimError with one line when it fails, stops or
    runs past `timeout_s` (the process is then killed at once). `daemon` False lets the process start
    processes of its own (``torch.compile``'s compiler workers); it is still stopped when it ends late."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_call, args=(child, fn, args), daemon=daemon)
    proc.start()
    child.close()
    late = False
    try:
        if timeout_s is not None and not parent.poll(timeout_s):
            late = True
            raise DlsimError(f"{what} did not finish in {timeout_s:.0f} s")
        status, payload = parent.recv()
    except EOFError:
        raise DlsimError(f"the process {what} stopped (exit code {proc.exitcode})") from None
    finally:
        if late:  # stopped at once: the caller's time is up
            proc.kill()
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
    if status == "error":
        raise DlsimError(f"{what} failed: {payload}")
    return payload
