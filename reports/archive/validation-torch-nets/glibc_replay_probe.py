"""Does replaying a network's allocations through glibc reproduce its page faults? (issue 15; only in part.)

A diagnosis, not a benchmark. It served one question: can the default process's fresh pages per step be
predicted per network from the network's own allocation sequence, instead of the probes' median share α?
For each network, in fresh processes:

* **measured**: the minor faults per step of its plain loop (fused Adam, 5 warm-up steps, 20 counted),
  four processes;
* **tensor trace**: every allocation PyTorch's CPU allocator makes from the module's construction to the
  end of 11 steps, with its pointer (torch.profiler's allocation events), replayed three times, each in a
  new process that has imported torch, through this host's glibc (posix_memalign(64), written in full;
  each free paired with its allocation by pointer); faults per step over the last 6 steps;
* ``--whole`` (needs gcc): every malloc, calloc, realloc, aligned allocation and free of the process over
  the same span, recorded by an LD_PRELOAD interposer (`malloc_trace/record.c`), replayed by
  `malloc_trace/replay.c` three times with the tensors alone and three times whole.

Findings (2026-11-24, session 11): reports/validation-torch-nets-notes.md ("Replaying a network's own
allocations").

Usage: flock -s /tmp/w/cpu.lock python reports/archive/validation-torch-nets/glibc_replay_probe.py [--whole] [NAME ...]
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests"), str(ROOT)]
MIB = 2**20
WARMUP, STEPS, MEASURED = 5, 6, 20
TRACE_C = Path(__file__).with_name("malloc_trace")


def build(name: str):
    """The plain loop of a validated network or of a loop-probe network."""
    import torch

    from dlsim.calibrate import loop_probe
    from dlsim.calibrate.compute_ops import make_optimizer
    from dlsim.plain_loop import PlainLoop, make_batch
    torch.manual_seed(0)
    if name in loop_probe.PROBES:
        shape, batch = loop_probe.PROBES[name]
        return PlainLoop(loop_probe.probe_network(name), torch.randn(batch, *shape), "adam", make_optimizer)
    import torchnets
    from validate_torch_nets import NETWORKS
    cls, shape, tokens, vocab, batch = NETWORKS[name]
    return PlainLoop(getattr(torchnets, cls)(), make_batch(shape, batch, tokens, vocab), "adam", make_optimizer)


def measure(name: str) -> float:
    """Fresh MiB per step of the network's own loop in this process."""
    loop = build(name)
    for _ in range(WARMUP):
        loop.step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(MEASURED):
        loop.step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * resource.getpagesize() / MEASURED / MIB


def tensor_trace(name: str) -> dict:
    """(time, pointer, bytes) of every CPU-allocator event (bytes < 0: a free) from construction on, and the
    step boundaries."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile
    bounds, events = [], []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loop = build(name)
        for _ in range(WARMUP + STEPS):
            bounds.append(time.time_ns())
            loop.step()
        bounds.append(time.time_ns())

    def walk(node) -> None:  # noqa: ANN001
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.ptr, node.extra_fields.alloc_size))
        for child in node.children:
            walk(child)
    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    return {"events": sorted(events), "start": bounds[WARMUP]}


def replay_tensor_trace(trace: dict) -> float:
    """Fresh MiB per step over the last `STEPS` steps of `trace` replayed through this process's glibc."""
    import torch  # noqa: F401 - the allocator state a training process starts from
    libc = ctypes.CDLL("libc.so.6")
    libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    live, counted_from = {}, None
    for t, ptr, size in trace["events"]:
        if counted_from is None and t >= trace["start"]:
            counted_from = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        if size > 0:
            p = ctypes.c_void_p()
            libc.posix_memalign(ctypes.byref(p), 64, size)
            libc.memset(p, 1, size)
            live[ptr] = p
        elif ptr in live:
            libc.free(live.pop(ptr))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - (counted_from or 0)
    return faults * resource.getpagesize() / STEPS / MIB


def record_whole(name: str, lib: str, path: str) -> None:
    """In this process (started with `lib` preloaded): the whole malloc trace of `name`'s construction and
    steps, with a mark before each step."""
    hooks = ctypes.CDLL(None)
    hooks.mtr_start()
    loop = build(name)
    for i in range(WARMUP + STEPS):
        hooks.mtr_mark(ctypes.c_size_t(i))
        loop.step()
    hooks.mtr_mark(ctypes.c_size_t(WARMUP + STEPS))
    hooks.mtr_stop(path.encode())


def replay_whole(lib: str, path: str, kinds: int) -> float:
    import torch  # noqa: F401
    out = (ctypes.c_double * STEPS)()
    replay = ctypes.CDLL(lib).replay
    replay.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    replay(path.encode(), 1 << 40, WARMUP, WARMUP + STEPS, out, kinds)
    return statistics.mean(out)


def in_fresh_process(*args: str, env: dict | None = None) -> object:
    run = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})})
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    whole = "--whole" in sys.argv
    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not names:
        from validate_torch_nets import NETWORKS
        from dlsim.calibrate.loop_probe import HEAP_PROBES
        names = [*NETWORKS, *HEAP_PROBES]
    work = Path(tempfile.mkdtemp(prefix="glibc-replay-"))
    if whole:
        for src in ("record", "replay"):
            subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(TRACE_C / f"{src}.c"), "-o",
                            str(work / f"lib{src}.so")], check=True)
    for name in names:
        row = {"network": name, "measured": [round(in_fresh_process("--measure", name), 2) for _ in range(4)]}
        trace = work / f"{name}.json"
        trace.write_text(json.dumps(in_fresh_process("--trace", name)))
        row["tensor_trace"] = [round(in_fresh_process("--replay", str(trace)), 2) for _ in range(3)]
        if whole:
            path = str(work / f"{name}.bin")
            subprocess.run([sys.executable, __file__, "--record-whole", name, str(work / "librecord.so"), path],
                           check=True, capture_output=True, env={**os.environ, "LD_PRELOAD": str(work / "librecord.so")})
            for kinds, key in ((0, "whole_trace_tensors_only"), (3, "whole_trace")):
                row[key] = [round(in_fresh_process("--replay-whole", str(work / "libreplay.so"), path, str(kinds)), 2)
                            for _ in range(3)]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    mode, rest = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if mode == "--measure":
        print(json.dumps(measure(rest[0])))
    elif mode == "--trace":
        print(json.dumps(tensor_trace(rest[0])))
    elif mode == "--replay":
        print(json.dumps(replay_tensor_trace(json.loads(Path(rest[0]).read_text()))))
    elif mode == "--record-whole":
        record_whole(*rest)
    elif mode == "--replay-whole":
        print(json.dumps(replay_whole(rest[0], rest[1], int(rest[2]))))
    else:
        main()
