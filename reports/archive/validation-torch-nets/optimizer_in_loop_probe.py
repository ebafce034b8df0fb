"""Where does the optimizer step's in-loop time go? (issue 15; session 10.)

A diagnosis, not a benchmark: it served one question, why the eager loop's ``opt.step()`` costs more
than its back-to-back and flushed-cache timings for some networks and less than its flushed-cache
timing for others. For each network (the ten validated ones and the loop probe's own), in a fresh
process per network, it times fused Adam's step three ways (in the loop after a backward; back to back;
after a cache flush) and splits each into the fused kernel (``torch._fused_adam_``, timed by a wrapper)
and the host code around it, and prints the step's footprint (bytes the step requests, from
`dlsim.torch_profiling.allocation_meter`, plus 16 bytes per parameter). Findings:
reports/validation-torch-nets-notes.md ("The optimizer step's regime").

Usage: flock -x /tmp/w/cpu.lock python reports/archive/validation-torch-nets/optimizer_in_loop_probe.py [NAME ...]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests"), str(ROOT)]
STEPS = 20


def measure(name: str) -> dict:
    """The three timings of `name`'s optimizer step, each split into kernel and host microseconds."""
    import torch

    from dlsim.calibrate.compute_ops import make_optimizer
    from dlsim.calibrate.compute_timer import cache_flusher
    from dlsim.calibrate.loop_probe import PROBES, probe_network
    from dlsim.plain_loop import PlainLoop, make_batch
    from dlsim.torch_profiling import allocation_meter
    torch.manual_seed(0)
    if name in PROBES:
        shape, batch = PROBES[name]
        net, x = probe_network(name), torch.randn(batch, *shape)
    else:
        import torchnets
        from validate_torch_nets import NETWORKS
        cls, shape, tokens, vocab, batch = NETWORKS[name]
        net, x = getattr(torchnets, cls)(), make_batch(shape, batch, tokens, vocab)
    kernel: list[float] = []
    fused = torch._fused_adam_

    def timed_fused(*args, **kwargs):
        t = time.perf_counter()
        out = fused(*args, **kwargs)
        kernel.append(time.perf_counter() - t)
        return out
    torch._fused_adam_ = timed_fused
    loop = PlainLoop(net, x, "adam", make_optimizer)
    for _ in range(5):
        loop.step()
    flush = cache_flusher("cpu")

    def alone(before=None) -> float:
        if before is not None:
            before()
        t = time.perf_counter()
        loop.opt.step()
        return time.perf_counter() - t

    out = {}
    for way, once in (("in_loop", lambda: loop.step()[2]), ("back_to_back", alone), ("flushed", lambda: alone(flush))):
        totals, kernels = [], []
        for _ in range(STEPS):
            kernel.clear()
            totals.append(once())
            kernels.append(sum(kernel))
        total, k = statistics.median(totals) * 1e6, statistics.median(kernels) * 1e6
        out[way] = {"total_us": round(total), "kernel_us": round(k), "host_us": round(total - k)}
    with allocation_meter() as meter, meter.tag("step", 0):
        loop.step()
    params = sum(p.numel() for p in net.parameters())
    out["footprint_mib"] = round((meter.bytes.get("step", [0.0])[0] + 16 * params) / 2**20, 1)
    out["tensors"] = len(list(net.parameters()))
    return out


def main() -> None:
    from validate_torch_nets import NETWORKS

    from dlsim.calibrate.loop_probe import PROBES
    names = sys.argv[1:] or [*PROBES, *NETWORKS]
    for name in names:
        run = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True, check=True)
        print(json.dumps({"network": name, **json.loads(run.stdout.strip().splitlines()[-1])}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(measure(sys.argv[2])))
    else:
        main()
