"""Minor page faults per plain-loop training step of the ten validation networks (issue 15).

A diagnosis, not a benchmark: it served one question, whether the steps the torch validation
under-predicts fault pages in the default process for tensors below glibc's 32 MiB mmap ceiling
(which dlsim charges nothing). Each network (benchmarks/validate_torch_nets.py's NETWORKS: batch,
input) trains with Adam in a fresh process as it comes: 5 warm-up steps, then 20 steps counted with
getrusage(RUSAGE_SELF).ru_minflt. Findings: reports/validation-torch-nets-notes.md.

Usage: flock -x /tmp/w/cpu.lock python reports/archive/validation-torch-nets/torch_nets_faults_probe.py [NAME ...]
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torchnets  # noqa: E402
from validate_torch_nets import NETWORKS  # noqa: E402

WARMUP, STEPS, PAGE = 5, 20, 4096


def probe(name: str) -> dict:
    cls, shape, tokens, vocab, batch = NETWORKS[name]
    torch.manual_seed(0)
    model = getattr(torchnets, cls)()
    x = torch.randint(0, vocab, (batch, *shape)) if tokens else torch.randn(batch, *shape)
    opt = torch.optim.Adam(model.parameters())

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = model(x)
        if tokens:
            target = torch.randint(0, vocab, out.shape[:-1])
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
        else:
            out = out.reshape(out.shape[0], out.shape[1], -1).mean(-1) if out.dim() > 2 else out
            loss = F.cross_entropy(out, torch.randint(0, out.shape[-1], (batch,)))
        loss.backward()
        opt.step()

    for _ in range(WARMUP):
        step()
    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    for _ in range(STEPS):
        step()
    f1, t1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    faults = (f1 - f0) / STEPS
    return {"network": name, "faults_per_step": round(faults), "mib_per_step": round(faults * PAGE / 2**20, 2),
            "step_ms": round(1e3 * (t1 - t0) / STEPS, 2)}


if __name__ == "__main__":
    names = sys.argv[1:] or list(NETWORKS)
    if len(names) == 1:
        print(json.dumps(probe(names[0])))
    else:  # a fresh process per network: glibc's thresholds carry over from one network to the next
        import subprocess
        rows = [json.loads(subprocess.run([sys.executable, __file__, n], check=True, capture_output=True,
                                          text=True).stdout) for n in names]
        print(json.dumps(rows, indent=1))
