"""The allocator's share of a CPU training step: fresh pages for tensors above glibc's mmap threshold.

A process as it comes (glibc malloc, no tuning) maps every tensor above the mmap threshold afresh
each step and unmaps it when freed; the threshold rises with freed mapped chunks up to
DEFAULT_MMAP_THRESHOLD_MAX = 32 MiB on 64-bit (glibc malloc/malloc.c). Each such tensor costs

    t_fresh = bytes · r(threads)        for bytes > 32 MiB, else 0

where r is the measured rate (page faults, zeroing, unmapping; `dlsim.calibrate.alloc_probe`).
The kernel tables are timed with freed memory retained (no faults), so the estimate adds t_fresh
to the pass that allocates the tensor:

* forward: the layer's output (views — flatten, reshape — allocate nothing);
* backward ∇x: the gradient of each input that needs one (not the network's input; an ``add``
  passes its output gradient through);
* backward ∇w: the weight gradient (``zero_grad(set_to_none=True)`` frees it every step).

Regimes: ``default`` charges t_fresh; ``retained`` (``mallopt(M_MMAP_MAX, 0)`` and no trimming, as
calibration runs) and named allocators that keep freed pages (jemalloc, tcmalloc, mimalloc) charge
nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlsim.cost.gradflow import gradient_free
from dlsim.spec.model import INPUT, Layer, Model
from dlsim.units import DTYPE_BYTES, MIB

MMAP_THRESHOLD_MAX = 32 * MIB
REGIMES = ("default", "retained", "jemalloc", "tcmalloc", "mimalloc")
VIEWS = frozenset({"flatten", "reshape", "dropout_eval"})
PASS_THROUGH = frozenset({"add"})


@dataclass(frozen=True)
class AllocatorCost:
    """The allocator regime and, for ``default``, the measured fresh-memory rate in seconds per byte."""

    regime: str = "retained"
    seconds_per_byte: float = 0.0
    threshold_bytes: float = MMAP_THRESHOLD_MAX
    source: str = ""

    def charge(self, nbytes: float) -> float:
        """Seconds a step pays for one tensor of `nbytes` allocated afresh."""
        if self.regime != "default" or nbytes <= self.threshold_bytes:
            return 0.0
        return nbytes * self.seconds_per_byte

    def describe(self) -> str:
        if self.regime == "default":
            return (f"default (glibc: tensors above {self.threshold_bytes / MIB:.0f} MiB mapped afresh each step, "
                    f"{self.seconds_per_byte * 4096 * 1e6:.2f} us per 4 KiB page, {self.source})")
        if self.regime == "retained":
            return "retained (freed memory kept in the process: no fresh pages)"
        return f"{self.regime} (assumed to keep freed pages across steps: no fresh pages)"


def fresh_tensors(layer: Layer, batch: int, dtype: str, free: frozenset[str] = frozenset({INPUT})
                  ) -> dict[str, list[float]]:
    """Bytes of the tensors each pass of `layer` allocates (see the module docstring); `free` names the
    tensors that need no gradient (`dlsim.cost.gradflow.gradient_free`)."""
    size = DTYPE_BYTES[dtype]
    out: dict[str, list[float]] = {"forward": [], "backward_data": [], "backward_weight": []}
    if layer.type in VIEWS:
        return out
    out["forward"].append(float(batch * math.prod(layer.out_shape) * size))
    if layer.type not in PASS_THROUGH:
        out["backward_data"] = [float(batch * math.prod(s) * size) for src, s in zip(layer.inputs, layer.in_shapes)
                                if src not in free]
    if layer.params:
        out["backward_weight"].append(float(layer.params * size))
    return out


def step_charges(model: Model, batch: int, dtype: str, allocator: AllocatorCost,
                 free: frozenset[str] | None = None) -> dict[str, dict[str, float]]:
    """Per layer and pass, the seconds of fresh allocations (only non-zero entries)."""
    charges: dict[str, dict[str, float]] = {}
    if allocator.regime != "default" or allocator.seconds_per_byte <= 0:
        return charges
    free = gradient_free(model) if free is None else free
    for layer in model.layers:
        for pass_name, tensors in fresh_tensors(layer, batch, dtype, free).items():
            t = sum(allocator.charge(b) for b in tensors)
            if t > 0:
                charges.setdefault(layer.name, {})[pass_name] = t
    return charges
