"""Does replaying a step's own allocations through glibc reproduce its page faults? (issue 15; no.)

A diagnosis, not a benchmark: it served one question, whether the default process's fresh pages could
be predicted from the exact sequence of tensor allocations (what PyTorch's CPU allocator hands out in
one plain-loop step, recorded with torch.profiler's memory events) by replaying that sequence through
the real glibc of this host (posix_memalign(64), memset, free via ctypes, in a fresh process that has
imported torch), against the minor faults the network's own loop takes. Findings:
reports/validation-torch-nets-notes.md ("Why the heap share is an expectation").

Usage: flock -s /tmp/w/cpu.lock python benchmarks/probes/glibc_replay_probe.py [NAME ...]
"""

from __future__ import annotations

import ctypes
import json
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests"), str(ROOT)]
MIB = 2**20
REPLAYS = 12


def record(name: str) -> dict:
    """One step's allocation events (bytes > 0: allocation, < 0: free, with addresses) and the minor
    faults per step of the loop itself (5 warm-up steps, 20 counted)."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    import torchnets
    from dlsim.calibrate.compute_ops import make_optimizer
    from validate_torch_nets import NETWORKS
    cls, shape, tokens, vocab, batch = NETWORKS[name]
    torch.manual_seed(0)
    net = getattr(torchnets, cls)().train()
    x = torch.randint(0, vocab, (batch, *shape)) if tokens else torch.randn(batch, *shape)
    with torch.no_grad():
        out = net(x)
    target = torch.randint(0, out.shape[-1], out.shape[:-1])
    opt, _ = make_optimizer("adam", net.parameters())

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x).reshape(-1, out.shape[-1]), target.reshape(-1)).backward()
        opt.step()

    for _ in range(5):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [(e.nbytes(), e.start_ns()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    # addresses: the profiler's FunctionEvents do not carry them; pair each free with the latest live
    # allocation of the same size (the order within a size class is all the replay needs)
    return {"network": name, "loop_fresh_mib": faults * resource.getpagesize() / MIB,
            "events": [b for b, _ in sorted(events, key=lambda e: e[1])]}


def replay(sizes: list[int]) -> list[float]:
    """Fresh MiB per replay of the step through this process's glibc."""
    import torch  # noqa: F401 - the allocator state a training process starts from
    libc = ctypes.CDLL("libc.so.6")
    libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    out = []
    live: dict[int, list] = {}
    for _ in range(REPLAYS):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for b in sizes:
            if b > 0:
                p = ctypes.c_void_p()
                libc.posix_memalign(ctypes.byref(p), 64, b)
                libc.memset(p, 1, b)
                live.setdefault(b, []).append(p)
            elif live.get(-b):
                libc.free(live[-b].pop())
        out.append(round((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * resource.getpagesize() / MIB, 2))
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["--record"]:
        print(json.dumps(record(sys.argv[2])))
    elif sys.argv[1:2] == ["--replay"]:
        print(json.dumps(replay(json.loads(sys.stdin.read()))))
    else:
        from validate_torch_nets import NETWORKS
        for name in sys.argv[1:] or list(NETWORKS):
            rec = json.loads(subprocess.run([sys.executable, __file__, "--record", name], check=True,
                                            capture_output=True, text=True).stdout.splitlines()[-1])
            fresh = json.loads(subprocess.run([sys.executable, __file__, "--replay"], input=json.dumps(rec["events"]),
                                              check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            print(json.dumps({"network": name, "loop_fresh_mib_per_step": round(rec["loop_fresh_mib"], 2),
                              "replay_fresh_mib_per_step": fresh[2:]}))
