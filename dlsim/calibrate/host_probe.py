"""Which host a CPU profile was measured on, and how fast that host is, in about a second.

`host_identity()` reads the CPU model, its instruction-set flags and the logical CPU count from
Linux's /proc/cpuinfo (the same fields lscpu prints). `reference_speeds(threads)` times two
reference kernels through PyTorch:

* GEMM: ``torch.mm(a, b, out=c)`` on 1024 x 1024 fp32 matrices, 2·1024³ FLOP per call;
* stream: ``torch.add(a, b, out=c)`` on 3 x 2^24 fp32 elements (3 x 64 MiB, beyond the last-level
  cache of the machines these profiles describe), 2 reads + 1 write counted (STREAM's "add",
  J. D. McCalpin, "Memory Bandwidth and Machine Balance in Current High Performance Computers",
  IEEE TCCA Newsletter, 1995).

Each is called for `WARMUP_S` seconds (at least twice) to warm up and then for `TIMED_S` seconds (at
least `calls` times); the fastest call gives the speed (the
noise of a shared machine only adds time, so the minimum is the undisturbed speed). The record
`host_record()` is what ``meta.yaml``'s ``host:`` block holds; `compare_hosts` says whether two
records describe the same host and, when not, the speed ratio current / recorded.

torch is imported inside the functions only.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from dlsim.units import GBYTE_PER_S, GFLOPS
from dlsim.calibrate.compute_timer import last_level_cache_bytes, set_threads

GEMM_N = 1024
STREAM_ELEMENTS = 2**24
ISA_FLAG = re.compile(r"^(avx\w*|amx\w*|fma\w*|sse4\w*|f16c|bmi2|vnni\w*|sha_ni|vaes|vpclmulqdq)$")
"""The instruction-set flags BLAS and oneDNN kernels dispatch on (listed in the record; all flags are hashed)."""


def host_identity(cpuinfo: str | None = None) -> dict[str, Any]:
    """CPU model, ISA flags (dispatch-relevant ones listed, all hashed), logical CPUs, architecture."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    names = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    flag_lines = re.findall(r"^(?:flags|Features)\s*:\s*(.*)$", cpuinfo, re.M)
    flags = sorted(set(flag_lines[0].split())) if flag_lines else []
    return {"cpu": names[0].strip() if names else (platform.processor() or "cpu"),
            "logical_cpus": len(names) or (os.cpu_count() or 1), "machine": platform.machine(),
            "isa_flags": [f for f in flags if ISA_FLAG.match(f)],
            "flags_sha1": hashlib.sha1(" ".join(flags).encode()).hexdigest()[:12]}


WARMUP_S = 0.2
TIMED_S = 0.7
"""Seconds of untimed calls first, then of timed calls (at least `calls`): on the project's shared 2-core
machine a 1024^3 GEMM runs at 11.7 ms for most calls of a second but at 32 ms for stretches of half a
second (other processes; measured), so the fastest call of a short burst can miss the machine's speed."""


def _fastest(fn: Callable[[], Any], calls: int, clock: Callable[[], float]) -> float:
    begin = clock()
    for i in range(10**6):
        fn()
        if i >= 1 and clock() - begin >= WARMUP_S:
            break
    best, begin, i = float("inf"), clock(), 0
    while i < calls or clock() - begin < TIMED_S:
        start = clock()
        fn()
        best = min(best, clock() - start)
        i += 1
    return max(best, 1e-9)


def reference_speeds(threads: int | None = None, calls: int = 10,
                     clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """The reference GEMM's FLOP/s and the stream kernel's bytes/s on this host (see the module docstring),
    with `threads` intra-op threads (None: PyTorch's current count)."""
    import torch
    before = torch.get_num_threads()
    set_threads(threads)  # only when it changes (see set_threads)
    try:
        a, b = torch.rand(GEMM_N, GEMM_N), torch.rand(GEMM_N, GEMM_N)
        c = torch.empty(GEMM_N, GEMM_N)
        gemm_s = _fastest(lambda: torch.mm(a, b, out=c), calls, clock)
        x, y = torch.rand(STREAM_ELEMENTS), torch.rand(STREAM_ELEMENTS)
        z = torch.empty(STREAM_ELEMENTS)
        stream_s = _fastest(lambda: torch.add(x, y, out=z), calls, clock)
        used = torch.get_num_threads()
    finally:
        set_threads(before)
    return {"threads": used, "gemm_flops_per_s": 2.0 * GEMM_N**3 / gemm_s,
            "stream_bytes_per_s": 3.0 * 4 * STREAM_ELEMENTS / stream_s}


REFERENCE_METHOD = (f"fastest call of {TIMED_S} s (at least 10 calls) after {WARMUP_S} s of warm-up calls: "
                    f"torch.mm {GEMM_N}^3 fp32 (2 n^3 FLOP), "
                    f"torch.add(a, b, out=c) on 3 x {STREAM_ELEMENTS} fp32 (3 x 4 bytes per element)")


def host_record(threads: int | None = None,
                speeds: Callable[[int | None], Mapping[str, float]] = reference_speeds) -> dict[str, Any]:
    """The ``host:`` block of a profile's meta.yaml: identity, reference speeds (GFLOP/s, GB/s), date."""
    s = speeds(threads)
    return {**host_identity(), "threads": int(s["threads"]),
            "reference": {"gemm_gflop_per_s": round(s["gemm_flops_per_s"] / GFLOPS, 2),
                          "stream_gbyte_per_s": round(s["stream_bytes_per_s"] / GBYTE_PER_S, 2),
                          "method": REFERENCE_METHOD},
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


IDENTITY_KEYS = ("cpu", "logical_cpus", "flags_sha1")


def software_versions() -> dict[str, str]:
    """The software a probe's result depends on: Python, the C library (its allocator and page handling),
    the kernel release (page faults), torch and dlsim (read from their installed metadata: torch is not
    imported)."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "absent"
    libc, libc_version = platform.libc_ver()
    return {"python": platform.python_version(), "libc": f"{libc} {libc_version}".strip(),
            "kernel": platform.release(), "torch": version("torch"), "dlsim": version("dlsim")}


def host_key(cpuinfo: str | None = None) -> dict[str, Any]:
    """What makes a probe result this host's: identity (`host_identity` less the listed flags, whose hash is
    kept), the last-level cache and `software_versions` (the key of `dlsim.io.host_cache.HostCache`)."""
    ident = host_identity(cpuinfo)
    return {**{k: ident[k] for k in ("cpu", "logical_cpus", "machine", "flags_sha1")},
            "last_level_cache_bytes": last_level_cache_bytes("cpu"), **software_versions()}


@dataclass(frozen=True)
class HostComparison:
    """Whether the recorded host is this one; the differing identity fields; current / recorded speeds."""

    same: bool
    differences: tuple[str, ...]
    gemm_ratio: float | None = None
    stream_ratio: float | None = None

    def line(self, profile: str, recorded: Mapping[str, Any]) -> str:
        """One line for a warning (empty when the host is the same)."""
        if self.same:
            return ""
        speed = ""
        if self.gemm_ratio is not None and self.stream_ratio is not None:
            speed = (f"; this host runs the reference GEMM at {self.gemm_ratio:.2f}x and the stream kernel at "
                     f"{self.stream_ratio:.2f}x the recorded speed, so predictions may be off by about that much")
        return (f"profile {profile} was measured on another host ({recorded.get('cpu')}, "
                f"{recorded.get('logical_cpus')} CPUs; differs in {', '.join(self.differences)}){speed}; "
                f"recalibrate with dlsim calibrate compute")


def compare_hosts(recorded: Mapping[str, Any], current: Mapping[str, Any] | None = None,
                  speeds: Callable[[int | None], Mapping[str, float]] | None = reference_speeds) -> HostComparison:
    """Compare a recorded ``host:`` block with this host (`current`: `host_identity()` by default).
    The reference kernels are timed here (with the recorded thread count) only when the identities differ."""
    current = host_identity() if current is None else current
    diff = tuple(k for k in IDENTITY_KEYS if k in recorded and recorded.get(k) != current.get(k))
    if not diff:
        return HostComparison(True, ())
    ref = recorded.get("reference") or {}
    if speeds is None or not ref.get("gemm_gflop_per_s") or not ref.get("stream_gbyte_per_s"):
        return HostComparison(False, diff)
    s = speeds(int(recorded["threads"]) if recorded.get("threads") else None)
    return HostComparison(False, diff, s["gemm_flops_per_s"] / (float(ref["gemm_gflop_per_s"]) * GFLOPS),
                          s["stream_bytes_per_s"] / (float(ref["stream_gbyte_per_s"]) * GBYTE_PER_S))
