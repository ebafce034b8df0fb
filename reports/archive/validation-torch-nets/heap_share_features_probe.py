"""Does anything in a step's allocations predict the share of them a default process re-faults? (issue 15;
session 10; no.)

A diagnosis, not a benchmark: it served one question, whether the heap re-fault share α of
`dlsim.cost.allocation` could be predicted per network from the sizes of what one step allocates
(their total, count, mean and largest), instead of the calibration's median over probe networks.
For each network, in four spawned processes (each a new interpreter, as a training job starts): a
plain loop with fused Adam, 5 warm-up steps, minor faults over 20 steps, and one step's allocations
above 1032 B recorded with torch.profiler's memory events. Findings:
reports/validation-torch-nets-notes.md ("Results").

Usage: flock -x /tmp/w/cpu.lock python reports/archive/validation-torch-nets/heap_share_features_probe.py [NAME ...]
(names: the loop probe's, the extra networks below, or those of benchmarks/validate_torch_nets.py)
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests"), str(ROOT)]
PROCESSES = 4


def extra_networks() -> dict:
    """Networks of the probes' kinds beyond the loop probe's own: name -> (module, input shape, batch)."""
    import torch.nn as nn
    return {
        "mlp_w1024_b256": (nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                                         nn.Linear(1024, 10)), [256], 256),
        "mlp_w512_b512": (nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                        nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)), [512], 512),
        "deep_mlp": (nn.Sequential(*[m for _ in range(12) for m in (nn.Linear(256, 256), nn.LayerNorm(256), nn.GELU())],
                                   nn.Linear(256, 10)), [256], 128),
        "conv1d_wide": (nn.Sequential(nn.Conv1d(8, 64, 5, padding=2), nn.ReLU(), nn.Conv1d(64, 64, 5, padding=2),
                                      nn.ReLU(), nn.Conv1d(64, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 512, 10)),
                        [8, 512], 32),
    }


def measure(name: str) -> dict:
    """Bytes faulted per step, and one step's allocations above 1032 B: total, count, largest."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from dlsim.calibrate.compute_ops import make_optimizer
    from dlsim.calibrate.loop_probe import PROBES, probe_network
    from dlsim.cost.allocation import SMALL_REQUEST_BYTES
    from dlsim.plain_loop import PlainLoop, make_batch
    torch.manual_seed(0)
    extra = extra_networks()
    if name in PROBES:
        shape, batch = PROBES[name]
        net, x = probe_network(name), torch.randn(batch, *shape)
    elif name in extra:
        net, shape, batch = extra[name]
        x = torch.randn(batch, *shape)
    else:
        import torchnets
        from validate_torch_nets import NETWORKS
        cls, shape, tokens, vocab, batch = NETWORKS[name]
        net, x = getattr(torchnets, cls)(), make_batch(shape, batch, tokens, vocab)
    loop = PlainLoop(net, x, "adam", make_optimizer)
    for _ in range(5):
        loop.step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        loop.step()
    faulted = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * resource.getpagesize() / 20
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loop.step()
    sizes = [e.nbytes() for e in prof.profiler.kineto_results.events()
             if e.name() == "[memory]" and e.nbytes() > SMALL_REQUEST_BYTES]
    return {"faulted": faulted, "requested": sum(sizes), "allocations": len(sizes), "largest": max(sizes, default=0)}


def main() -> None:
    from dlsim.calibrate.loop_probe import HEAP_PROBES
    for name in sys.argv[1:] or [*HEAP_PROBES, "mlp_w1024_b256", "mlp_w512_b512", "deep_mlp", "conv1d_wide"]:
        runs = []
        for _ in range(PROCESSES):
            out = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        shares = [r["faulted"] / r["requested"] for r in runs if r["requested"] > 0]
        first = runs[0]
        print(json.dumps({"network": name, "requested_mib": round(first["requested"] / 2**20, 1),
                          "allocations": first["allocations"],
                          "mean_mib": round(first["requested"] / max(1, first["allocations"]) / 2**20, 2),
                          "largest_mib": round(first["largest"] / 2**20, 1),
                          "share_per_process": [round(s, 3) for s in shares],
                          "median_share": round(statistics.median(shares), 3) if shares else None}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(measure(sys.argv[2])))
    else:
        main()
