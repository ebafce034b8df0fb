"""Do glibc's trim and mmap thresholds decide a network's fresh pages per step? (issue 15; session 13: yes,
and they are reached by a path that differs from process to process.)

A diagnosis, not a benchmark. It served one question: can the default process's fresh pages per step
be predicted per network from a feature of its step, or do they follow glibc's dynamic thresholds?

* ``features`` (default): per network, in three spawned processes, the minor faults per plain-loop step
  (fused Adam, 5 warm-up steps, 20 counted), and from one step under torch.profiler's memory events:
  bytes requested above 1032 B (R), their count, the largest (L), glibc's trim threshold if L set it
  (T = 2 min(L, 32 MiB)), and the swing D of live bytes within the step (max - min of the running sum
  of allocations and frees);
* ``--pinned``: the same network with both thresholds fixed before torch loads (``mallopt``:
  M_MMAP_THRESHOLD = X, M_TRIM_THRESHOLD = 2X, which also stops glibc from moving them), X from 128 KiB
  to 16 MiB, three processes each.

Findings: reports/validation-torch-nets-notes.md ("Session 13").

Usage: flock -x /tmp/w/cpu.lock python reports/archive/validation-torch-nets/heap_threshold_probe.py [--pinned] NAME ...
(names: the ten of tests/torchnets.py, the eight of tests/heldout_torchnets.py, the loop probe's)
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
MIB = 2**20
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
PINNED = (128 << 10, 1 << 20, 2 << 20, (4 << 20) + 8192, 8 << 20, 16 << 20)


def network(name: str):
    """(module, example batch) of a network of the two test sets or of the loop probe."""
    import torch

    from dlsim.calibrate.loop_probe import PROBES, probe_network
    from dlsim.plain_loop import make_batch
    torch.manual_seed(0)
    if name in PROBES:
        shape, batch = PROBES[name]
        return probe_network(name), torch.randn(batch, *shape)
    for rel in ("tests/heldout_torchnets.py",):
        path = ROOT / rel
        if not path.exists():
            continue
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if name in module.NETWORKS:
            cls, shape, tokens, vocab, batch = module.NETWORKS[name]
            return getattr(module, cls)(), make_batch(shape, batch, tokens, vocab)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torchnets
    from validate_torch_nets import NETWORKS
    cls, shape, tokens, vocab, batch = NETWORKS[name]
    return getattr(torchnets, cls)(), make_batch(shape, batch, tokens, vocab)


def faulted_per_step(loop) -> float:  # noqa: ANN001
    from dlsim.hostmem import faulted_bytes
    for _ in range(5):
        loop.step()
    before = faulted_bytes()
    for _ in range(20):
        loop.step()
    return (faulted_bytes() - before) / 20


def measure(name: str, pinned: int) -> dict:
    if pinned:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, pinned)
        libc.mallopt(M_TRIM_THRESHOLD, 2 * pinned)
    from torch.profiler import ProfilerActivity, profile

    from dlsim.calibrate.compute_ops import make_optimizer
    from dlsim.plain_loop import PlainLoop
    loop = PlainLoop(*network(name), "adam", make_optimizer)
    faulted = faulted_per_step(loop)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loop.step()
    events = [e.nbytes() for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and abs(e.nbytes()) > 1032]
    live, running = 0, [0]
    for nbytes in events:
        live += nbytes
        running.append(live)
    allocations = [b for b in events if b > 0]
    return {"faulted": faulted, "requested": sum(allocations), "count": len(allocations),
            "largest": max(allocations, default=0), "swing": max(running) - min(running)}


def in_fresh_process(name: str, pinned: int = 0) -> dict:
    out = subprocess.run([sys.executable, __file__, "--one", name, str(pinned)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    pinned = "--pinned" in sys.argv
    for name in [a for a in sys.argv[1:] if not a.startswith("--")]:
        if pinned:
            for x in PINNED:
                runs = [in_fresh_process(name, x) for _ in range(3)]
                print(json.dumps({"network": name, "mmap_threshold_kib": x >> 10, "trim_threshold_kib": 2 * x >> 10,
                                  "fresh_mib_per_step": [round(r["faulted"] / MIB, 2) for r in runs]}), flush=True)
            continue
        runs = [in_fresh_process(name) for _ in range(3)]
        first = runs[0]
        trim = 2 * min(first["largest"], 32 * MIB)
        print(json.dumps({"network": name, "requested_mib": round(first["requested"] / MIB, 1),
                          "allocations": first["count"], "largest_mib": round(first["largest"] / MIB, 2),
                          "trim_threshold_mib": round(trim / MIB, 1), "swing_mib": round(first["swing"] / MIB, 1),
                          "fresh_mib_per_step": [round(r["faulted"] / MIB, 2) for r in runs]}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(measure(sys.argv[2], int(sys.argv[3]))))
    else:
        main()
