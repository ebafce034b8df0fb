"""Timing a PyTorch kernel properly: device checks, all threads, warm-up, blocks, medians, synchronisation.

`KernelTimer.time(fn)` runs `fn` once to warm up (allocations, oneDNN primitive creation, cuDNN
autotuning), once more to size a block, then `repeats` blocks of `calls` back-to-back calls, each
block at least `min_block_s` long so that the clock's resolution and Python's per-call cost do not
dominate tiny kernels. On CUDA the device is synchronised before and after every block (a kernel
launch returns before the kernel ends), or, with ``events=True``, each block is timed between two CUDA
events on the stream (`dlsim.calibrate.cuda_calls.EventBlockTimer`). The result is the median time per call over the blocks
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
    """Use `threads` intra-op threads (None: keep PyTorch's default, one per core); the count in use.

    PyTorch's thread count is set only when it changes: any ``torch.set_num_threads`` call, even to the
    count already in use, left CPU flash attention 1.6-1.7x slower for the rest of the process (torch
    2.13, 2-core EPYC, 2026-11-24: 244 against 142 µs forward)."""
    import torch
    if threads is not None:
        if threads < 1:
            raise DlsimError(f"threads must be positive, got {threads}")
        if threads != torch.get_num_threads():
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
# glibc <malloc.h> mallopt parameters (malloc/malloc.h): M_TRIM_THRESHOLD -1, M_MMAP_MAX -4
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
INT_MAX = 2**31 - 1


def retain_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory in the process (no mmap for large blocks, no trimming
    of the heap top), as a training framework's caching allocator does; True when applied.

    Why: with glibc's defaults a block above the dynamic mmap threshold (at most 32 MiB,
    DEFAULT_MMAP_THRESHOLD_MAX on 64-bit, glibc malloc/malloc.c) is a fresh mapping on every
    allocation, and free memory at the heap top beyond the trim threshold (twice the mmap
    threshold) is returned to the kernel; either way the next iteration pays a page fault per 4 KiB
    page on first touch. Measured on this project's machine (reports/validation-cpu.md): VGG-16 at
    batch 2 took 265k minor faults and 1.97 s per iteration with the defaults, 96k and 1.21 s
    (faults of the warm-up iterations included) with memory retained, about 4.5 µs per fault: a
    cost of the C allocator, not of any kernel. PyTorch's own CUDA caching allocator retains
    freed blocks for the same reason, and PyTorch's CPU performance tuning guide recommends a
    retaining allocator (jemalloc, tcmalloc) for training. Calibration and validation both run
    in this regime, so kernel tables and measured iterations describe the same process state.
    ``mallopt(M_MMAP_MAX, 0)`` serves every block from the heap; ``mallopt(M_TRIM_THRESHOLD,
    INT_MAX)`` stops trimming. No effect (False) where the C library is not glibc.
    """
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, INT_MAX))


def warm_allocator() -> bool:
    """Put the C allocator in the state a training process reaches after its first iteration:
    freed memory retained (`retain_freed_memory`), and one large block allocated, touched and
    freed so that the heap already holds pages. Returns whether retention applies (glibc).
    Harmless with other allocators.
    """
    import torch
    retained = retain_freed_memory()
    block = torch.empty(int(GLIBC_MMAP_THRESHOLD_MAX - MIB) // 4)
    block.fill_(0.0)
    del block
    return retained


def cache_flusher(device: str) -> Callable[[], None]:
    """A function that evicts the device's caches by rewriting a buffer twice their size."""
    import torch
    buf = torch.zeros(2 * last_level_cache_bytes(device) // 4, device=device)
    return lambda: buf.add_(1.0)


class KernelTimer:
    """Times callables on one device (see the module docstring)."""

    def __init__(self, device: str = "cpu", *, repeats: int = 5, min_block_s: float = 0.01,
                 long_kernel_s: float = 0.25, clock: Callable[[], float] = time.perf_counter,
                 flush: Callable[[], Any] | None = None, statistic: str = "median", events: bool = False,
                 block_timer: Callable[[Callable[[], Any], int], float] | None = None):
        if statistic not in STATISTICS:
            raise DlsimError(f"unknown statistic {statistic!r} (use {' or '.join(STATISTICS)})")
        self.device, self.repeats, self.min_block_s, self.long_kernel_s = device, repeats, min_block_s, long_kernel_s
        self.statistic = statistic
        self.sync = synchronizer(device)
        self.clock, self.flush = clock, flush
        if block_timer is None and events and device == "cuda":
            from dlsim.calibrate.cuda_calls import EventBlockTimer
            block_timer = EventBlockTimer()
        self.block_timer = block_timer
        """Times one block instead of the host clock (CUDA events), or None."""

    @property
    def method(self) -> str:
        """How a block is timed, in words (for meta.yaml and reports)."""
        return "CUDA events around each block" if self.block_timer is not None else \
            ("host clock, device synchronised before and after each block" if self.device == "cuda" else "host clock")

    def _block(self, fn: Callable[[], Any], calls: int) -> float:
        if self.block_timer is not None:
            return self.block_timer(fn, calls)
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
