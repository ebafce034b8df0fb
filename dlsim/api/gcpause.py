"""Python's cyclic garbage collector paused while one prediction runs.

A prediction allocates a great many small objects that all live until it ends (tasks, events,
schedule steps, estimates); every few hundred allocations the collector's youngest generation scans
them, and its older generations rescan the survivors, which is work proportional to what is alive,
repeated while nothing can be freed yet. Measured on a 2,048-point slice of the sweep benchmark's
grid (`benchmarks/bench_sweep.py`), serially: 15-25% of the CPU time of event simulations and
about 10% of analytic estimates went to it. Reference counting still frees everything acyclic at
once; the cycles a prediction leaves (simulation processes and the events that resume them) are
collected after it, at the collector's next turn.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def paused_gc(fn: F) -> F:
    """`fn` run with the cyclic collector disabled, restored as it was afterwards (also on error;
    nested calls leave it paused until the outermost returns)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()

    return run  # type: ignore[return-value]
