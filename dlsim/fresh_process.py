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


def call_in_fresh_process(fn: Callable[..., Any], *args: Any, what: str, timeout_s: float | None = None) -> Any:
    """``fn(*args)`` (a module-level function, picklable arguments) in a fresh process; `what` names the
    work in errors ("timing net.py:Net"). Raises DlsimError with one line when it fails, stops or
    runs past `timeout_s`."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_call, args=(child, fn, args), daemon=True)
    proc.start()
    child.close()
    try:
        if timeout_s is not None and not parent.poll(timeout_s):
            raise DlsimError(f"{what} did not finish in {timeout_s:.0f} s")
        status, payload = parent.recv()
    except EOFError:
        raise DlsimError(f"the process {what} stopped (exit code {proc.exitcode})") from None
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    if status == "error":
        raise DlsimError(f"{what} failed: {payload}")
    return payload
