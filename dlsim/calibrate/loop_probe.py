"""What a plain training loop in a default process pays beyond its kernels' table times, measured on
probe networks of the calibration's own (none of the validated ones).

**α, the heap's re-faulted share.** Below glibc's 32 MiB mmap ceiling a step's tensors come from the
heap, which glibc trims when a free leaves more than its trim threshold free at the top and grows
again when the next tensors need the room; the regrown pages fault afresh (`dlsim.cost.allocation`).
How much is trimmed in a given step depends on the exact order and size of every allocation in the
process, the interpreter's and the libraries' included, and changes from process to process (with the
interpreter's hash seed, for one); so the probe measures its expectation over independent processes,
each a new interpreter (``spawn``) as a training job is, never forks of one server, whose children
share its heap and seed and repeat one draw:

    α_i = (minor page faults per step · page size) / (bytes the step requests above 1032 B)

**h and h_fit, the optimizer step's in-loop extra.** The optimizer's operands (state, weights) and the
host's objects were last used a whole step ago: a step whose footprint F (bytes requested per step plus
weights, gradients and Adam's state) overflows the last-level cache C finds them evicted, one that fits
finds them cached (`dlsim.cost.hostops`). Either way the loop pays more than the matching table time,
as the host code runs colder after a backward than back to back:

    h_i     = median in-loop ``opt.step()`` time − median ``opt.step()`` time after a cache flush   (F_i > C)
    h_fit_i = median in-loop ``opt.step()`` time − median back-to-back ``opt.step()`` time          (F_i <= C)

Each comes from the probe networks i of its regime, trained in a new process as it comes (PyTorch's
plain loop, fused Adam, 5 warm-up steps, then ``getrusage`` minor faults and the loop's phase times over
20 steps; the requested bytes from one step under `dlsim.torch_profiling.allocation_meter`; then 20
optimizer steps each after a cache flush, as the calibration's cold tables time kernels, and 20 back to
back, as its warm tables do), four processes per network. α, h and h_fit are the medians over the
processes, and the records list every value (their spread is the uncertainty of those shares of a
prediction). α comes from the four networks whose steps request tens of MiB, enough for glibc's trims
to matter: an MLP (512-2048-2048-10, batch 128), a CNN (three 3×3 convolutions with batch norm, 32×32
images, batch 16), a transformer encoder layer (d 128, 4 heads, 64 tokens, batch 16) and a 1-D
convolution stack (8 channels × 1024 samples, batch 32), whose footprints (49-111 MiB here) overflow a
32 MiB cache. Three small ones whose footprints fit it (2-8 MiB) measure h_fit only: an MLP
(256-512-512-10, batch 32), a CNN (two 3×3 convolutions, 16×16 images, batch 8) and an encoder layer
(d 64, 2 heads, 16 tokens, batch 8). torch is imported inside the functions only.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from dlsim.cost.allocation import REFAULT_QUANTITY as REFAULT
from dlsim.cost.hostops import OPTIMIZER_FIT_QUANTITY as OPTIMIZER_FIT, OPTIMIZER_QUANTITY as OPTIMIZER
from dlsim.cost.memory import state_bytes_per_param
from dlsim.fresh_process import call_in_fresh_process
from dlsim.hostmem import faulted_bytes

QUANTITIES = (REFAULT, OPTIMIZER, OPTIMIZER_FIT)
WARMUP, STEPS, ROUNDS = 5, 20, 4
PROBES = {"mlp": ([512], 128), "cnn": ([3, 32, 32], 16), "encoder": ([64, 128], 16), "conv1d": ([8, 1024], 32),
          "mlp_small": ([256], 32), "cnn_small": ([3, 16, 16], 8), "encoder_small": ([16, 64], 8)}
HEAP_PROBES = ("mlp", "cnn", "encoder", "conv1d")
"""The probes α is measured on (steps of tens of MiB); they measure h too where their steps overflow the cache."""
FIT_PROBES = ("mlp_small", "cnn_small", "encoder_small")
"""The small probes (steps of a few MiB): h_fit only."""


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
    if name == "mlp_small":
        return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    if name == "cnn_small":
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                             nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU(), MeanOver((2, 3)), nn.Linear(32, 10))
    if name == "encoder_small":
        return nn.Sequential(nn.TransformerEncoderLayer(64, 2, 128, batch_first=True), MeanOver((1,)),
                             nn.Linear(64, 10))
    raise ValueError(f"unknown probe network {name!r}")


def measure_in_this_process(name: str) -> dict[str, float]:
    """Probe `name` trained in this process: bytes faulted in and requested per step, the step's footprint
    (requested + weights, gradients and Adam state), and the optimizer step's median seconds in the loop,
    after a cache flush and back to back."""
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
    before = faulted_bytes()
    in_loop = [loop.step()[2] for _ in range(STEPS)]
    faulted = (faulted_bytes() - before) / STEPS
    with allocation_meter() as meter, meter.tag("step", 0):
        loop.step()
    flushed = KernelTimer("cpu", repeats=STEPS, flush=cache_flusher("cpu")).time(loop.opt.step).seconds
    back_to_back = KernelTimer("cpu", repeats=STEPS).time(loop.opt.step).seconds
    requested = meter.bytes.get("step", [0.0])[0]
    params = sum(p.numel() for p in loop.net.parameters())
    return {"faulted": faulted, "requested": requested,
            "footprint": requested + params * state_bytes_per_param("fp32", "adam").total,
            "optimizer_in_loop_s": statistics.median(in_loop), "optimizer_flushed_s": flushed,
            "optimizer_back_to_back_s": back_to_back}


def probe_run(name: str) -> dict[str, float]:
    """One fresh process (a new interpreter) training probe `name`: `measure_in_this_process`'s record."""
    return call_in_fresh_process(measure_in_this_process, name, what=f"the loop probe {name}", timeout_s=300)


def values_from_runs(runs: Mapping[str, Sequence[Mapping[str, float]]],
                     cache_bytes: float) -> dict[str, dict[str, list[float]]]:
    """Per quantity (α: `REFAULT`, h: `OPTIMIZER`, h_fit: `OPTIMIZER_FIT`), probe name -> its value in each
    of its fresh processes `runs[name]` (a probe adds to h or h_fit as its footprint overflows or fits a
    last-level cache of `cache_bytes`; α from the `HEAP_PROBES` only)."""
    out: dict[str, dict[str, list[float]]] = {q: {} for q in QUANTITIES}
    for name, records in runs.items():
        for run in records:
            if name in HEAP_PROBES:
                share = run["faulted"] / run["requested"] if run["requested"] > 0 else 0.0
                out[REFAULT].setdefault(name, []).append(share)
            fits = run["footprint"] <= cache_bytes
            table = run["optimizer_back_to_back_s" if fits else "optimizer_flushed_s"]
            out[OPTIMIZER_FIT if fits else OPTIMIZER].setdefault(name, []).append(
                max(0.0, run["optimizer_in_loop_s"] - table))
    return out


def probe_values(rounds: int = ROUNDS, probes: tuple[str, ...] = tuple(PROBES)) -> dict[str, dict[str, list[float]]]:
    """`values_from_runs` of `rounds` fresh processes of each of `probes`, measured now (round robin: each
    round runs every probe once) against this host's last-level cache."""
    from dlsim.calibrate.compute_timer import last_level_cache_bytes
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in probes}
    for _ in range(rounds):
        for name in probes:
            runs[name].append(probe_run(name))
    return values_from_runs(runs, last_level_cache_bytes("cpu"))


WHAT = {REFAULT: ("fraction", "minor page faults x page size per step / bytes requested per step (> 1032 B)"),
        OPTIMIZER: ("s", "median in-loop opt.step() time - median opt.step() time after a cache flush, probes "
                         "whose step footprint overflows the last-level cache"),
        OPTIMIZER_FIT: ("s", "median in-loop opt.step() time - median back-to-back opt.step() time, probes "
                             "whose step footprint fits the last-level cache")}


def rows_from_values(values: Mapping[str, Mapping[str, Sequence[float]]], origin: str = "") -> list[dict[str, str]]:
    """The device.csv rows (quantity, value, unit, how): the medians of α, h and h_fit over the probe
    processes (a quantity no probe measured has no row); `origin` is appended to each row's ``how``."""
    rows = []
    for quantity, per_probe in values.items():
        vals = [v for vs in per_probe.values() for v in vs]
        if not vals:
            continue
        unit, definition = WHAT[quantity]
        shown = (lambda v: f"{v * 1e6:.0f} us") if unit == "s" else (lambda v: f"{v:.3f}")
        listed = "; ".join(f"{name} " + ", ".join(shown(v) for v in vs) for name, vs in per_probe.items())
        how = (f"{definition}, plain loop with fused Adam in fresh default processes, {WARMUP} warm-up + {STEPS} counted "
               f"steps; median over {len(vals)} processes of {len(per_probe)} probe networks ({listed})"
               + (f"; {origin}" if origin else ""))
        rows.append({"quantity": quantity, "value": f"{statistics.median(vals):.6g}", "unit": unit, "how": how})
    return rows


def loop_probe_rows(rounds: int = ROUNDS, probes: tuple[str, ...] = tuple(PROBES)) -> list[dict[str, str]]:
    """`rows_from_values` of `probe_values` measured now."""
    return rows_from_values(probe_values(rounds, probes))
