"""What a fresh allocation costs a training step in a default (glibc) process: seconds per byte.

glibc's malloc serves a request above its mmap threshold with a fresh anonymous mapping and returns
it with munmap when freed (glibc malloc/malloc.c, sysmalloc and munmap_chunk). The threshold starts
at 128 KiB and rises to the size of each freed mapped chunk, up to DEFAULT_MMAP_THRESHOLD_MAX =
4·1024·1024·sizeof(long) = 32 MiB on 64-bit (malloc.c, "dynamic mmap threshold"); so in a training
loop's steady state every tensor above 32 MiB is a new mapping every step, and the first write to
each of its 4 KiB pages takes a page fault (the kernel zeroes the page and maps it). PyTorch's CPU
allocator (c10::alloc_cpu, posix_memalign) goes through the same malloc.

`fresh_memory_cost(threads)` measures that cost the way a step pays it: an anonymous mapping of
`nbytes` (Python's mmap: the same mmap(2) call glibc makes), written once by PyTorch with `threads`
intra-op threads (faults taken in parallel, as in a kernel writing its output), unmapped; minus
the same write to a buffer already mapped. The difference per byte, the minimum over `repeats`
(noise only adds time), at two sizes (64 and 256 MiB, above the 32 MiB threshold), is the rate:

    fresh_s_per_byte(t) = min over repeats [t(mmap + write + munmap) − t(write, mapped)] / nbytes

torch is imported inside the functions only.
"""

from __future__ import annotations

import mmap
import time
from typing import Any, Callable

from dlsim.fresh_process import call_in_fresh_process
from dlsim.units import MIB

PROBE_BYTES = (64 * MIB, 256 * MIB)
QUANTITY = "fresh_memory_s_per_byte_t{threads}"
HOW = ("anonymous mmap of {sizes} MiB written once by torch fill_ with {threads} threads, then munmap, minus "
       "the same write to a mapped buffer; per byte, min of {repeats} (glibc serves tensors above its mmap "
       "threshold, at most 32 MiB, this way every step)")


def _write_fresh(nbytes: int) -> None:
    import torch
    buf = mmap.mmap(-1, nbytes)
    t = torch.frombuffer(buf, dtype=torch.float32)
    t.fill_(1.0)
    del t
    buf.close()


def fresh_memory_cost(threads: int, repeats: int = 5, sizes: tuple[int, ...] = PROBE_BYTES,
                      clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per byte of a fresh mapping written once with `threads` threads (see the module docstring)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rates = []
        for nbytes in sizes:
            mapped = torch.empty(int(nbytes) // 4)
            mapped.fill_(0.0)
            _write_fresh(int(nbytes))  # warm-up
            best = float("inf")
            for _ in range(repeats):
                start = clock()
                mapped.fill_(1.0)
                warm = clock() - start
                start = clock()
                _write_fresh(int(nbytes))
                best = min(best, (clock() - start - warm) / nbytes)
            del mapped
            rates.append(max(best, 0.0))
    finally:
        torch.set_num_threads(before)
    return min(rates)


def fresh_memory_in_fresh_process(threads: int, repeats: int = 5) -> float:
    """`fresh_memory_cost` with `threads` threads, measured in a process of its own.

    Changing PyTorch's thread count in the calibrating process and back leaves some kernels slower for
    the rest of that process: CPU flash attention ran 1.6x slower after ``set_num_threads(1)`` then
    ``(2)`` (torch 2.13, 2-core EPYC, 2026-11-24), and every table row timed afterwards carried it."""
    return call_in_fresh_process(fresh_memory_cost, threads, repeats, what=f"the fresh-memory probe ({threads} threads)")


def fresh_memory_row(threads: int, value: float, repeats: int = 5, origin: str = "") -> dict[str, str]:
    """The device.csv row (quantity, value, unit, how) of the fresh-memory rate with `threads` threads;
    `origin` is appended to its ``how``."""
    how = HOW.format(sizes=" and ".join(str(int(s // MIB)) for s in PROBE_BYTES), threads=threads, repeats=repeats)
    return {"quantity": QUANTITY.format(threads=threads), "value": f"{value:.9g}", "unit": "s/byte",
            "how": how + (f"; {origin}" if origin else "")}


def fresh_memory_rows(max_threads: int, repeats: int = 5) -> list[dict[str, str]]:
    """device.csv rows: the fresh-memory rate for 1 … `max_threads` threads, each measured in a process of
    its own (`fresh_memory_in_fresh_process`)."""
    return [fresh_memory_row(t, fresh_memory_in_fresh_process(t, repeats), repeats) for t in range(1, max_threads + 1)]


def allocator_in_use(environ: Any = None, maps: str | None = None) -> str:
    """The allocator of this process: "jemalloc" / "tcmalloc" / "mimalloc" when one is preloaded or mapped,
    else "glibc"."""
    import os
    environ = os.environ if environ is None else environ
    if maps is None:
        try:
            with open("/proc/self/maps") as handle:
                maps = handle.read()
        except OSError:
            maps = ""
    text = environ.get("LD_PRELOAD", "") + "\n" + maps
    for name in ("jemalloc", "tcmalloc", "mimalloc"):
        if f"lib{name}" in text:
            return name
    return "glibc"
