"""Two helpers for running PyTorch under its profiler quietly and reading what the CPU allocator did.

`quiet_fd2` keeps the profiler's own C++ lines off the user's terminal; `allocation_meter` profiles the
CPU allocator while tagged work runs and adds up, per tag, the bytes requested above glibc's per-size
caches (`dlsim.cost.allocation.SMALL_REQUEST_BYTES`). The importer measures each captured layer's
allocations with it; the calibration's loop probe a probe network's whole step. torch is imported
inside the functions only.
"""

from __future__ import annotations

import bisect
import os
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from dlsim.cost.allocation import SMALL_REQUEST_BYTES


@contextmanager
def quiet_fd2() -> Iterator[None]:
    """The profiler's C++ side writes lines of its own on file descriptor 2 (start, stop, blocks freed that
    it did not see allocated): they are not the user's business."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


ALLOCATION_TAG = "dlsim-alloc|"


class AllocationMeter:
    """Bytes PyTorch's CPU allocator hands out while tagged work runs (`allocation_meter`)."""

    def __init__(self) -> None:
        self.bytes: dict[str, list[float]] = {}

    def tag(self, name: str, pass_index: int) -> Any:
        """A context marking work done for `name` in pass 0 (forward) or 1 (backward)."""
        from torch.profiler import record_function
        return record_function(f"{ALLOCATION_TAG}{pass_index}|{name}")

    def add_events(self, events: Sequence[Any]) -> None:
        """Attribute each allocation above `SMALL_REQUEST_BYTES` to the tagged range it happened in."""
        ranges = sorted((e.start_ns(), e.end_ns(), e.name()) for e in events if e.name().startswith(ALLOCATION_TAG))
        starts = [r[0] for r in ranges]
        for e in events:
            if e.name() != "[memory]" or e.nbytes() <= SMALL_REQUEST_BYTES:
                continue
            i = bisect.bisect_right(starts, e.start_ns()) - 1
            if i < 0 or ranges[i][1] < e.start_ns():
                continue
            _, index, name = ranges[i][2].split("|", 2)
            self.bytes.setdefault(name, [0.0, 0.0])[int(index)] += e.nbytes()


@contextmanager
def allocation_meter() -> Iterator[AllocationMeter]:
    """Profile the CPU allocator (torch.profiler with ``profile_memory``) while the block runs; on exit
    `AllocationMeter.bytes` holds, per tagged name, [forward, backward] bytes requested above glibc's
    per-size caches (`dlsim.cost.allocation.SMALL_REQUEST_BYTES`), kernel workspaces included; empty
    where the profiler cannot start."""
    from torch.profiler import ProfilerActivity, profile
    meter = AllocationMeter()
    with quiet_fd2():
        try:
            prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True).__enter__()
        except Exception:  # noqa: BLE001 - no profiler here: nothing measured, the layer model prices allocations
            prof = None
        try:
            yield meter
        finally:
            if prof is not None:
                prof.__exit__(None, None, None)
    if prof is not None:
        meter.add_events(prof.profiler.kineto_results.events())
