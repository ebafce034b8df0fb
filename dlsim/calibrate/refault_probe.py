"""The share of a training step's allocated bytes a default (glibc) process faults in again: α.

Below glibc's 32 MiB mmap ceiling a step's tensors come from the heap, which glibc trims when a free
leaves more than its trim threshold free at the top and grows again when the next tensors need the
room; the regrown pages fault afresh (`dlsim.cost.allocation`). How much is trimmed in a given step
depends on the exact order and size of every allocation in the process, the interpreter's and the
libraries' included, and changes from process to process; so the probe measures its expectation on
networks of its own, none of the validated ones:

    α_i = (minor page faults per step · page size) / (bytes the step requests above 1032 B)

for each probe network i in a fresh process as it comes (PyTorch's plain loop, fused Adam, 5 warm-up
steps, then ``getrusage`` minor faults over 20 steps; the requested bytes from one step under
`dlsim.importers.torch_meter.allocation_meter`), two processes per network. α is the median of the
α_i, and the record lists every α_i (their spread is the uncertainty of the fault share of a
prediction). The probe networks: an MLP (512-2048-2048-10, batch 128), a CNN (three 3×3
convolutions with batch norm, 32×32 images, batch 16), a transformer encoder layer (d 128, 4 heads,
64 tokens, batch 16) and a 1-D convolution stack (8 channels × 1024 samples, batch 32).
torch is imported inside the functions only.
"""

from __future__ import annotations

import resource
import statistics
from typing import Any

from dlsim.cost.allocation import REFAULT_QUANTITY as QUANTITY
from dlsim.fresh_process import call_in_fresh_process

WARMUP, STEPS, ROUNDS = 5, 20, 2
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


def measure_in_this_process(name: str) -> tuple[float, float]:
    """(bytes faulted in per step, bytes requested per step) of probe `name` trained in this process."""
    import torch

    from dlsim.calibrate.compute_ops import make_optimizer
    from dlsim.importers.torch_meter import allocation_meter
    from dlsim.validate.torch_loop import PlainLoop

    shape, batch = PROBES[name]
    torch.manual_seed(0)
    loop = PlainLoop(probe_network(name), torch.randn(batch, *shape), "adam", make_optimizer)
    for _ in range(WARMUP):
        loop.step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(STEPS):
        loop.step()
    faulted = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * resource.getpagesize() / STEPS
    with allocation_meter() as meter, meter.tag("step", 0):
        loop.step()
    return faulted, meter.bytes.get("step", [0.0])[0]


def refault_fractions(rounds: int = ROUNDS, probes: tuple[str, ...] = tuple(PROBES)) -> dict[str, list[float]]:
    """Probe name -> α_i of each fresh process (see the module docstring)."""
    out: dict[str, list[float]] = {name: [] for name in probes}
    for _ in range(rounds):
        for name in probes:
            # forked from a server that imported torch and nothing else: the allocator as a training process
            # finds it after ``import torch``, without paying the import for each probe
            faulted, requested = call_in_fresh_process(measure_in_this_process, name, what=f"the refault probe {name}",
                                                       context="forkserver", preload=("torch", __name__),
                                                       timeout_s=300)
            out[name].append(faulted / requested if requested > 0 else 0.0)
    return out


def refault_rows(rounds: int = ROUNDS, probes: tuple[str, ...] = tuple(PROBES)) -> list[dict[str, str]]:
    """The device.csv row (quantity, value, unit, how): the median α over the probe processes."""
    fractions = refault_fractions(rounds, probes)
    values = [v for vs in fractions.values() for v in vs]
    listed = "; ".join(f"{name} " + ", ".join(f"{v:.3f}" for v in vs) for name, vs in fractions.items())
    how = (f"minor page faults x page size per step / bytes requested per step (> 1032 B), plain loop with fused "
           f"Adam in fresh default processes, {WARMUP} warm-up + {STEPS} counted steps; median over {len(values)} "
           f"processes of {len(fractions)} probe networks ({listed})")
    return [{"quantity": QUANTITY, "value": f"{statistics.median(values):.6g}", "unit": "fraction", "how": how}]
