"""Timing a PyTorch kernel properly: device checks, all threads, warm-up, blocks, medians, synchronisation.

`KernelTimer.time(fn)` runs `fn` once to warm up (allocations, oneDNN primitive creation, cuDNN
autotuning), once more to size a block, then `repeats` blocks of `calls` back-to-back calls, each
block at least `min_block_s` long so that the clock's resolution and Python's per-call cost do not
dominate tiny kernels. On CUDA the device is synchronised before and after every block (a kernel
launch returns before the kernel ends). The result is the median time per call over the blocks
and the interquartile range: medians resist the bursts of other processes on a shared machine.
On a machine that other processes keep busy the noise is one-sided (interference only adds time)
and the minimum (``statistic="min"``) estimates the undisturbed time better; a comparison must then
use the minimum on both sides.

With a cache flusher (`cache_flusher`), every timed call is instead preceded, outside the timing,
by rewriting a buffer twice the size of the last-level cache, so no operand is cached when the
kernel starts: in a training step other layers run between two calls of a kernel.

The thread count is set explicitly (``torch.set_num_threads``): `torch.utils.benchmark.Timer`
defaults to one thread, which on this project's 2-core machine halves GEMM throughput
(ecosystem.md §3). torch is imported inside the functions only.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from dlsim.errors import DlsimError
from dlsim.units import KIB, MIB

DEVICES = ("cpu", "cuda")


STATISTICS = ("median", "min")


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median and minimum over the blocks, the interquartile range, blocks, calls
    per block, and `seconds`, the statistic the timer was asked for."""

    median_s: float
    iqr_s: float
    repeats: int
    calls: int
    min_s: float = 0.0
    statistic: str = "median"

    @property
    def seconds(self) -> float:
        return self.min_s if self.statistic == "min" else self.median_s


def check_device(device: str) -> Any:
    """The `torch.device` for "cpu" or "cuda", or a one-line error when it cannot be used here."""
    if device not in DEVICES:
        raise DlsimError(f"unknown device {device!r} (use {' or '.join(DEVICES)})")
    try:
        import torch
    except ImportError:
        raise DlsimError("calibration and validation need PyTorch: pip install torch") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise DlsimError("--device cuda: PyTorch sees no CUDA device here (torch.cuda.is_available() is False)")
    return torch.device(device)


def synchronizer(device: str) -> Callable[[], None]:
    """A function that waits until every kernel queued on `device` has finished."""
    if device == "cuda":
        import torch
        return torch.cuda.synchronize
    return lambda: None


def set_threads(threads: int | None) -> int:
    """Use `threads` intra-op threads (None: keep PyTorch's default, one per core); the count in use."""
    import torch
    if threads is not None:
        if threads < 1:
            raise DlsimError(f"threads must be positive, got {threads}")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def last_level_cache_bytes(device: str) -> int:
    """The largest cache of the device: CPU from Linux sysfs, CUDA from the device properties
    (32 MiB when it cannot be read)."""
    default = int(32 * MIB)
    if device == "cuda":
        import torch
        return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", default) or default)
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip().upper()
        scale = {"K": KIB, "M": MIB}.get(text[-1:], 1)
        try:
            sizes.append(int(float(text.rstrip("KM")) * scale))
        except ValueError:
            continue
    return max(sizes) if sizes else default


GLIBC_MMAP_THRESHOLD_MAX = 32 * MIB


def warm_allocator() -> None:
    """Put the C allocator in the state a training process reaches after its first iteration.

    glibc's malloc serves large blocks with mmap, and every fresh mapping is paid for in page
    faults on first touch (expensive in a virtual machine: on this project's machine a 12.8 MB
    convolution output cost up to 15 ms of faults on top of a 10 ms kernel, and the time of the
    same call swung between the two). Freeing an mmapped block raises the dynamic mmap threshold
    to its size, up to 32 MiB (glibc malloc/malloc.c, DEFAULT_MMAP_THRESHOLD_MAX on 64-bit), after
    which such blocks come from the reused heap, as they do in a training loop that frees and
    reallocates the same activations every iteration. Allocating and freeing one block just under
    that size does the same here. Harmless with other allocators.
    """
    import torch
    block = torch.empty(int(GLIBC_MMAP_THRESHOLD_MAX - MIB) // 4)
    block.fill_(0.0)
    del block


def cache_flusher(device: str) -> Callable[[], None]:
    """A function that evicts the device's caches by rewriting a buffer twice their size."""
    import torch
    buf = torch.zeros(2 * last_level_cache_bytes(device) // 4, device=device)
    return lambda: buf.add_(1.0)


class KernelTimer:
    """Times callables on one device (see the module docstring)."""

    def __init__(self, device: str = "cpu", *, repeats: int = 5, min_block_s: float = 0.01,
                 long_kernel_s: float = 0.25, clock: Callable[[], float] = time.perf_counter,
                 flush: Callable[[], Any] | None = None, statistic: str = "median"):
        if statistic not in STATISTICS:
            raise DlsimError(f"unknown statistic {statistic!r} (use {' or '.join(STATISTICS)})")
        self.device, self.repeats, self.min_block_s, self.long_kernel_s = device, repeats, min_block_s, long_kernel_s
        self.statistic = statistic
        self.sync = synchronizer(device)
        self.clock, self.flush = clock, flush

    def _block(self, fn: Callable[[], Any], calls: int) -> float:
        self.sync()
        start = self.clock()
        for _ in range(calls):
            fn()
        self.sync()
        return (self.clock() - start) / calls

    def time(self, fn: Callable[[], Any]) -> Timing:
        """Time per call of `fn` (after a warm-up call and a sizing call)."""
        self._block(fn, 1)
        first = max(self._block(fn, 1), 1e-9)
        calls = max(1, math.ceil(self.min_block_s / first)) if self.flush is None else 1
        repeats = self.repeats if first < self.long_kernel_s else max(3, self.repeats // 2)
        samples = []
        for _ in range(repeats):
            if self.flush is not None:
                self.flush()
            samples.append(self._block(fn, calls))
        samples.sort()
        q = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
        return Timing(statistics.median(samples), q[2] - q[0], repeats, calls, samples[0], self.statistic)
