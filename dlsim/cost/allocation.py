"""The allocator's share of a CPU training step: the fresh pages a default (glibc) process faults in.

PyTorch's CPU allocator (c10::alloc_cpu, posix_memalign) goes through glibc malloc, and a process as
it comes pays page faults (the kernel zeroing and mapping 4 KiB pages) for memory glibc hands back
to the kernel and takes again (glibc malloc/malloc.c):

* **Above the mmap ceiling.** A request above DEFAULT_MMAP_THRESHOLD_MAX = 32 MiB (64-bit) that no
  free chunk holds is a fresh mapping, unmapped when freed: every page is fresh every step.
* **Below it: heap trimming.** Smaller tensors come from the heap, which glibc trims (``systrim``)
  whenever a free leaves more than the trim threshold (twice the dynamic mmap threshold) free at its
  top, and grows again (``sbrk``) when the next allocations need the room: those pages fault again.
  Which steps trim, and by how much, follows from the exact order and size of every allocation of
  the process (Python's and the libraries' too) and changes from one run to the next: the same
  network re-faulted 8 to 19.5 MiB per step in five fresh processes (reports/validation-torch-nets-notes.md).
  dlsim charges its expectation: a fraction α of the bytes the step requests,

    t_fresh = r(threads) · (Σ_{tensors > 32 MiB} bytes + α · Σ_{other requests} bytes)

  where r is the measured cost of a fresh byte (`dlsim.calibrate.alloc_probe.fresh_memory_cost`) and
  α the median fraction measured on probe networks in default processes on the same host
  (`dlsim.calibrate.loop_probe`); requests of at most SMALL_REQUEST_BYTES are left
  out (glibc's per-thread caches recycle them).

The bytes a pass requests are those PyTorch's allocator handed out for the layer's operators at
capture (``allocated_bytes``, `dlsim.spec.model.ALLOCATED_BYTES`: kernel workspaces included), else
the tensors dlsim's layer model says it allocates (`fresh_tensors`). The kernel tables are timed
with freed memory retained (no faults), so the estimate adds t_fresh to the pass that allocates.

Regimes: ``default`` charges t_fresh; ``retained`` (``mallopt`` with no mapping and no trimming, as
calibration runs) and named allocators that keep freed pages (jemalloc, tcmalloc, mimalloc) charge
nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dlsim.cost.gradflow import gradient_free, unreached_by_loss
from dlsim.spec.model import ALLOCATED_BYTES, INPUT, Layer, Model
from dlsim.units import DTYPE_BYTES, MIB

MMAP_THRESHOLD_MAX = 32 * MIB
SMALL_REQUEST_BYTES = 1032
"""glibc's tcache serves chunks up to 1032 bytes (64 size classes of 16 bytes, malloc.c
MAX_TCACHE_SIZE) from per-thread lists that recycle them: they never reach the heap's top."""
REFAULT_QUANTITY = "heap_refault_fraction"
"""The device.csv quantity holding α (`dlsim.calibrate.loop_probe`)."""
REGIMES = ("default", "retained", "jemalloc", "tcmalloc", "mimalloc")
VIEWS = frozenset({"flatten", "reshape", "dropout_eval"})
PASS_THROUGH = frozenset({"add"})
PASSES = ("forward", "backward_data", "backward_weight")


@dataclass(frozen=True)
class AllocatorCost:
    """The allocator regime and, for ``default``, the measured cost of a fresh byte (seconds) and the
    measured fraction of requested bytes that are re-faulted below the mmap ceiling."""

    regime: str = "retained"
    seconds_per_byte: float = 0.0
    refault_fraction: float = 0.0
    threshold_bytes: float = MMAP_THRESHOLD_MAX
    source: str = ""

    def charge(self, requested: float, mapped: float = 0.0) -> float:
        """Seconds a pass pays for `requested` bytes of which `mapped` are tensors above the ceiling."""
        if self.regime != "default":
            return 0.0
        below = max(0.0, requested - mapped)
        return self.seconds_per_byte * (mapped + self.refault_fraction * below)

    def describe(self) -> str:
        if self.regime == "default":
            return (f"default (glibc: a fraction {self.refault_fraction:.3f} of the bytes a step allocates "
                    f"re-faulted as the heap is trimmed and grown again, tensors above "
                    f"{self.threshold_bytes / MIB:.0f} MiB mapped afresh; "
                    f"{self.seconds_per_byte * 4096 * 1e6:.2f} us per 4 KiB page; {self.source})")
        if self.regime == "retained":
            return "retained (freed memory kept in the process: no fresh pages)"
        return f"{self.regime} (assumed to keep freed pages across steps: no fresh pages)"


def fresh_tensors(layer: Layer, batch: int, dtype: str, free: frozenset[str] = frozenset({INPUT})
                  ) -> dict[str, list[float]]:
    """Bytes of the tensors each pass of `layer` allocates in dlsim's layer model: the forward output
    (views allocate nothing); ∇x of each input that needs one (not the network's input; an ``add``
    passes its output gradient through); ∇w (``zero_grad(set_to_none=True)`` frees it every step)."""
    size = DTYPE_BYTES[dtype]
    out: dict[str, list[float]] = {p: [] for p in PASSES}
    if layer.type in VIEWS:
        return out
    out["forward"].append(float(batch * math.prod(layer.out_shape) * size))
    if layer.type not in PASS_THROUGH:
        out["backward_data"] = [float(batch * math.prod(s) * size) for src, s in zip(layer.inputs, layer.in_shapes)
                                if src not in free]
    if layer.params:
        out["backward_weight"].append(float(layer.params * size))
    return out


def requested_bytes(layer: Layer, batch: int, modeled: dict[str, list[float]]) -> dict[str, float]:
    """Bytes each pass of `layer` requests: measured at capture (backward on ``backward_data``) when the
    layer carries ``allocated_bytes``, else the modeled tensors."""
    measured = layer.attrs.get(ALLOCATED_BYTES)
    if not measured:
        return {p: sum(modeled[p]) for p in PASSES}
    forward_fixed, forward_per_sample, backward_fixed, backward_per_sample = measured
    return {"forward": forward_fixed + forward_per_sample * batch,
            "backward_data": backward_fixed + backward_per_sample * batch, "backward_weight": 0.0}


def _step_requests(model: Model, batch: int, dtype: str, free: frozenset[str] | None
                   ) -> list[tuple[Layer, dict[str, list[float]], dict[str, float]]]:
    """Per layer: (layer, modeled tensors, requested bytes) per pass (`fresh_tensors`, `requested_bytes`); a
    layer the backward never visits (`dlsim.cost.gradflow.unreached_by_loss`) requests nothing backward."""
    free = gradient_free(model) if free is None else free
    unreached = unreached_by_loss(model)
    out = []
    for layer in model.layers:
        modeled = fresh_tensors(layer, batch, dtype, free)
        requested = requested_bytes(layer, batch, modeled)
        if layer.name in unreached:
            modeled = {**modeled, "backward_data": [], "backward_weight": []}
            requested = {**requested, "backward_data": 0.0, "backward_weight": 0.0}
        out.append((layer, modeled, requested))
    return out


def step_requested_bytes(model: Model, batch: int, dtype: str, free: frozenset[str] | None = None) -> float:
    """Bytes one training step's operators request, summed over layers and passes (`requested_bytes`)."""
    return sum(sum(requested.values()) for _, _, requested in _step_requests(model, batch, dtype, free))


@dataclass(frozen=True)
class FreshPageSplit:
    """A predicted and a measured step with their fresh pages set apart.

    The measured pages are the process's minor faults per step times the page size; they cost the
    calibration's measured rate r (seconds per byte), as the predicted ones do:

        t_without = t_step − t_fresh,   t_fresh(measured) = r · faulted bytes per step

    so `error_without` is the error of everything but the allocator (kernels, host, optimizer), which
    holds from one process to the next while the faulted bytes do not (glibc's trims,
    reports/validation-torch-nets-notes.md)."""

    predicted_s: float
    predicted_fresh_s: float
    measured_s: float
    measured_fresh_bytes: float
    seconds_per_byte: float

    @property
    def measured_fresh_s(self) -> float:
        return self.measured_fresh_bytes * self.seconds_per_byte

    @property
    def predicted_fresh_bytes(self) -> float:
        return self.predicted_fresh_s / self.seconds_per_byte if self.seconds_per_byte > 0 else 0.0

    @property
    def error_without(self) -> float | None:
        """(t_pred − t_fresh,pred) / (t_meas − t_fresh,meas) − 1; None where the measured pages would cost the
        whole measured step or more (the rate does not describe this process)."""
        rest = self.measured_s - self.measured_fresh_s
        return (self.predicted_s - self.predicted_fresh_s) / rest - 1 if rest > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {"seconds_per_byte": self.seconds_per_byte,
                "predicted_bytes_per_step": self.predicted_fresh_bytes, "predicted_s": self.predicted_fresh_s,
                "measured_bytes_per_step": self.measured_fresh_bytes, "measured_s": self.measured_fresh_s,
                "without": {"predicted_s": self.predicted_s - self.predicted_fresh_s,
                            "measured_s": self.measured_s - self.measured_fresh_s, "error": self.error_without}}


def step_charges(model: Model, batch: int, dtype: str, allocator: AllocatorCost,
                 free: frozenset[str] | None = None) -> dict[str, dict[str, float]]:
    """Per layer and pass, the seconds of fresh pages (only non-zero entries)."""
    charges: dict[str, dict[str, float]] = {}
    if allocator.regime != "default" or allocator.seconds_per_byte <= 0:
        return charges
    for layer, modeled, requested in _step_requests(model, batch, dtype, free):
        mapped = {p: sum(b for b in modeled[p] if b > allocator.threshold_bytes) for p in PASSES}
        if ALLOCATED_BYTES in layer.attrs:  # measured backward bytes, ∇w included, sit on backward_data
            mapped["backward_data"] += mapped.pop("backward_weight")
            mapped["backward_weight"] = 0.0
        for pass_name in PASSES:
            t = allocator.charge(requested[pass_name], min(mapped[pass_name], requested[pass_name]))
            if t > 0:
                charges.setdefault(layer.name, {})[pass_name] = t
    return charges
