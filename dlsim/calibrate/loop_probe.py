"""What a plain training loop in a default process pays beyond its kernels' table times, measured on
probe networks of the calibration's own (none of the validated ones).

**α, the heap's re-faulted share.** Below glibc's 32 MiB mmap ceiling a step's tensors come from the
heap, which glibc trims when a free leaves more than its trim threshold free at the top and grows
again when the next tensors need the room; the regrown pages fault afresh (`dlsim.cost.allocation`).
How much is trimmed in a given step depends on the exact order and size of every allocation in the
process, the interpreter's and the libraries' included, and changes from process to process; so the
probe measures its expectation:

    α_i = (minor page faults per step · page size) / (bytes the step requests above 1032 B)

**h, the optimizer step's in-loop extra.** The optimizer's operands (state, weights) were last touched a
whole step ago, so in the loop the step runs at least as slow as its flushed-cache timing; and slower
still, by a time that hardly depends on its size (the intra-op threads have gone idle during the
backward's tail):

    h_i = median in-loop ``opt.step()`` time − median ``opt.step()`` time after a cache flush

Both come from each probe network i trained in a fresh process as it comes (PyTorch's plain loop,
fused Adam, 5 warm-up steps, then ``getrusage`` minor faults and the loop's phase times over 20 steps;
the requested bytes from one step under `dlsim.torch_profiling.allocation_meter`; then 20
optimizer steps each after a cache flush, as the calibration's cold tables time kernels), four
processes per network. α and h are the medians over the processes, and the records list every value
(their spread is the uncertainty of those shares of a prediction). The probe networks: an MLP
(512-2048-2048-10, batch 128), a CNN (three 3×3 convolutions with batch norm, 32×32 images, batch
16), a transformer encoder layer (d 128, 4 heads, 64 tokens, batch 16) and a 1-D convolution stack
(8 channels × 1024 samples, batch 32). torch is imported inside the functions only.
"""

from __future__ import annotations

import os
import resource
import statistics
from typing import Any

from dlsim.calibrate.health import add_helper_cpu
from dlsim.cost.allocation import REFAULT_QUANTITY as REFAULT
from dlsim.cost.hostops import OPTIMIZER_QUANTITY as OPTIMIZER
from dlsim.fresh_process import call_in_fresh_process

QUANTITIES = (REFAULT, OPTIMIZER)
WARMUP, STEPS, ROUNDS = 5, 20, 4
PROBES = {"mlp": ([512], 128), "cnn": ([3, 32, 32], 16), "encoder": ([64, 128], 16), "conv1d": ([8, 1024], 32)}


def probe_network(name: str) -> Any:
    """The probe network `name` of `PROBES` (a torch module classifying into 10 classes)."""
    import torch.nn as nn

    class MeanOver(nn.Module):
        def __init__(self, dims: tuple[int, ...]) -> None:
            super().__init__()
            self.dims = dims

        def forward(self, x: Any) -> Any:
            return x.mean(self.dims)

    if name == "mlp":
        return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Dropout(0.1),
                             nn.Linear(2048, 10))
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                             nn.Conv2d(32, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
                             nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                             MeanOver((2, 3)), nn.Linear(64, 10))
    if name == "encoder":
        return nn.Sequential(nn.TransformerEncoderLayer(128, 4, 512, batch_first=True), MeanOver((1,)),
                             nn.Linear(128, 10))
    if name == "conv1d":
        return nn.Sequential(nn.Conv1d(8, 32, 5, padding=2), nn.ReLU(), nn.Conv1d(32, 32, 5, padding=2), nn.GELU(),
                             nn.Conv1d(32, 16, 3, padding=1), MeanOver((2,)), nn.Linear(16, 10))
    raise ValueError(f"unknown probe network {name!r}")


def measure_in_this_process(name: str) -> dict[str, float]:
    """Probe `name` trained in this process: bytes faulted in and requested per step, and the optimizer
    step's median seconds in the loop and after a cache flush."""
    import torch

    from dlsim.calibrate.compute_ops import make_optimizer
    from dlsim.calibrate.compute_timer import KernelTimer, cache_flusher
    from dlsim.plain_loop import PlainLoop
    from dlsim.torch_profiling import allocation_meter

    shape, batch = PROBES[name]
    torch.manual_seed(0)
    loop = PlainLoop(probe_network(name), torch.randn(batch, *shape), "adam", make_optimizer)
    for _ in range(WARMUP):
        loop.step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    in_loop = [loop.step()[2] for _ in range(STEPS)]
    faulted = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * resource.getpagesize() / STEPS
    with allocation_meter() as meter, meter.tag("step", 0):
        loop.step()
    flushed = KernelTimer("cpu", repeats=STEPS, flush=cache_flusher("cpu")).time(loop.opt.step).seconds
    cpu = os.times()
    return {"faulted": faulted, "requested": meter.bytes.get("step", [0.0])[0],
            "optimizer_in_loop_s": statistics.median(in_loop), "optimizer_flushed_s": flushed,
            "cpu_s": cpu.user + cpu.system}


def probe_values(rounds: int = ROUNDS, probes: tuple[str, ...] = tuple(PROBES)) -> dict[str, dict[str, list[float]]]:
    """Per quantity (α: `REFAULT`, h: `OPTIMIZER`), probe name -> its value in each fresh process."""
    out: dict[str, dict[str, list[float]]] = {REFAULT: {n: [] for n in probes}, OPTIMIZER: {n: [] for n in probes}}
    for _ in range(rounds):
        for name in probes:
            # forked from a server that imported torch and nothing else: the allocator as a training process
            # finds it after ``import torch``, without paying the import for each probe
            run = call_in_fresh_process(measure_in_this_process, name, what=f"the loop probe {name}",
                                        context="forkserver", preload=("torch", __name__), timeout_s=300)
            add_helper_cpu(run["cpu_s"])  # the forkserver reaps it: ours, not another user's load
            out[REFAULT][name].append(run["faulted"] / run["requested"] if run["requested"] > 0 else 0.0)
            out[OPTIMIZER][name].append(max(0.0, run["optimizer_in_loop_s"] - run["optimizer_flushed_s"]))
    return out


def loop_probe_rows(rounds: int = ROUNDS, probes: tuple[str, ...] = tuple(PROBES)) -> list[dict[str, str]]:
    """The device.csv rows (quantity, value, unit, how): the medians of α and h over the probe processes."""
    what = {REFAULT: ("fraction", "minor page faults x page size per step / bytes requested per step (> 1032 B)"),
            OPTIMIZER: ("s", "median in-loop opt.step() time - median opt.step() time after a cache flush")}
    rows = []
    for quantity, per_probe in probe_values(rounds, probes).items():
        values = [v for vs in per_probe.values() for v in vs]
        unit, definition = what[quantity]
        shown = (lambda v: f"{v * 1e6:.0f} us") if unit == "s" else (lambda v: f"{v:.3f}")
        listed = "; ".join(f"{name} " + ", ".join(shown(v) for v in vs) for name, vs in per_probe.items())
        how = (f"{definition}, plain loop with fused Adam in fresh default processes, {WARMUP} warm-up + {STEPS} counted "
               f"steps; median over {len(values)} processes of {len(per_probe)} probe networks ({listed})")
        rows.append({"quantity": quantity, "value": f"{statistics.median(values):.6g}", "unit": unit, "how": how})
    return rows
