"""Host time per ATen operator of an eager step, charged where an imported layer dispatches operators.

A layer captured from PyTorch carries ``host_ops: [forward, backward]``, the ATen operators its forward
and its backward dispatch in an eager step (counted at capture, `dlsim.importers.torch_export`). With a
profile that measured the host's cost per operator (`dlsim.calibrate.host_ops`: h_fwd, h_bwd, the eager
time of a probe network beyond its operators' own kernel times, per operator) the layer pays

    forward += host_ops[0] · h_fwd,   ∇x += host_ops[1] · h_bwd

on top of its kernels' table times. A layer without ``host_ops`` (a hand-written YAML) pays nothing extra.

The same eager loop runs its optimizer step once per step, after the backward. Its operands (weights,
gradients, state) and the host's own objects were last used a whole step before, so under LRU they are
still in the last-level cache of C bytes only if the step touched at most C bytes in between (the
reuse-distance, or stack-distance, rule: Mattson, Gecsei, Slutz and Traiger, "Evaluation techniques
for storage hierarchies", IBM Systems Journal 9(2), 1970). The step's footprint F is the bytes its
operators request plus the persistent weights, gradients and optimizer state, so a captured network's
optimizer step is priced

    t_step = t_step(back-to-back table) + h_fit    if F <= C  (operands still cached)
    t_step = t_step(flushed-cache table) + h       if F >  C  (operands evicted)

h_fit and h are what an eager loop pays beyond those timings (the host code and its objects run
colder after a backward than back to back), both measured on probe networks of their regime
(`dlsim.calibrate.loop_probe`). Without the back-to-back row or h_fit the flushed-cache rule prices
every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlsim.results import Estimate, Source
from dlsim.spec.model import Layer

QUANTITIES = ("host_op_forward_s", "host_op_backward_s")
"""The ``device.csv`` quantities of h_fwd and h_bwd."""
OPTIMIZER_QUANTITY = "optimizer_in_loop_extra_s"
"""The ``device.csv`` quantity of h (steps whose footprint overflows the last-level cache)."""
OPTIMIZER_FIT_QUANTITY = "optimizer_in_loop_extra_fit_s"
"""The ``device.csv`` quantity of h_fit (steps whose footprint fits the last-level cache)."""


@dataclass(frozen=True)
class HostOpCost:
    """Measured seconds per ATen operator beyond its kernel, forward and backward, and where they come from."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    source: str = ""
    optimizer_extra_s: float | None = None
    optimizer_fit_extra_s: float | None = None

    def charges(self, layer: Layer, fused: bool = False) -> dict[str, float]:
        """Seconds to add per pass of `layer` (empty without ``host_ops``). A layer priced as one fused
        operator (`fused`: its measured row times the whole call, `dlsim.cost.pricing.whole_kernel_times`)
        pays for that one call per pass: its row already holds the operators it dispatches inside (a GRU
        on CPU dispatches about 19 per step and layer)."""
        counts = layer.attrs.get("host_ops")
        if not counts:
            return {}
        if fused:
            counts = [min(1, c) for c in counts[:2]]
        return {"forward": counts[0] * self.forward_s, "backward_data": counts[1] * self.backward_s}


def in_loop_optimizer_step(tables: Any, optimizer: str, params: int, tensors: int, footprint_bytes: float,
                           host: HostOpCost) -> Estimate | None:
    """The eager loop's optimizer step (module docstring): the back-to-back table + h_fit when the step's
    footprint fits the tables' last-level cache, the flushed-cache table + h otherwise; None when
    the tables lack the row or `host` measured no in-loop extra."""
    cold_tables, warm_tables = getattr(tables, "cold", tables), getattr(tables, "warm", None)
    cache = getattr(tables, "cache_bytes", None)
    mib = footprint_bytes / 2**20
    if warm_tables is not None and cache is not None and host.optimizer_fit_extra_s is not None \
            and footprint_bytes <= cache:
        warm = warm_tables.optimizer_step(optimizer, params, tensors)
        if warm is not None and warm.source in (Source.MEASURED, Source.INTERPOLATED):
            return Estimate(warm.seconds + host.optimizer_fit_extra_s, warm.source,
                            f"{warm.note} (back to back: step footprint {mib:.1f} MiB <= last-level cache "
                            f"{cache / 2**20:.0f} MiB) + {host.optimizer_fit_extra_s * 1e6:.0f} us in the loop (measured)")
    if host.optimizer_extra_s is None:
        return None
    cold = cold_tables.optimizer_step(optimizer, params, tensors)
    if cold is None:
        return None
    if cache is None:
        why = "the profile records no last-level cache size"
    elif footprint_bytes > cache:
        why = f"step footprint {mib:.1f} MiB > last-level cache {cache / 2**20:.0f} MiB"
    else:
        why = f"step footprint {mib:.1f} MiB fits, but no back-to-back row or h_fit was measured"
    return Estimate(cold.seconds + host.optimizer_extra_s, cold.source,
                    f"{cold.note} (flushed cache: {why}) + {host.optimizer_extra_s * 1e6:.0f} us in the loop (measured)")
