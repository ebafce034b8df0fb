"""Host time per ATen operator of an eager step, charged where an imported layer dispatches operators.

A layer captured from PyTorch carries ``host_ops: [forward, backward]``, the ATen operators its forward
and its backward dispatch in an eager step (counted at capture, `dlsim.importers.torch_export`). With a
profile that measured the host's cost per operator (`dlsim.calibrate.host_ops`: h_fwd, h_bwd, the eager
time of a probe network beyond its operators' own kernel times, per operator) the layer pays

    forward += host_ops[0] · h_fwd,   ∇x += host_ops[1] · h_bwd

on top of its kernels' table times. A layer without ``host_ops`` (a hand-written YAML) pays nothing extra.
The same eager loop runs its optimizer step from a cold cache (its state and weights were last
touched a whole step before) and a little later than that (the intra-op threads idle during the
backward's tail), so a captured network's optimizer step is priced

    t_step = t_step(flushed-cache table) + h

with h measured on probe networks (`dlsim.calibrate.loop_probe`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dlsim.spec.model import Layer

QUANTITIES = ("host_op_forward_s", "host_op_backward_s")
"""The ``device.csv`` quantities of h_fwd and h_bwd."""
OPTIMIZER_QUANTITY = "optimizer_in_loop_extra_s"
"""The ``device.csv`` quantity of h."""


@dataclass(frozen=True)
class HostOpCost:
    """Measured seconds per ATen operator beyond its kernel, forward and backward, and where they come from."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    source: str = ""
    optimizer_extra_s: float | None = None

    def charges(self, layer: Layer) -> dict[str, float]:
        """Seconds to add per pass of `layer` (empty without ``host_ops``)."""
        counts = layer.attrs.get("host_ops")
        if not counts:
            return {}
        return {"forward": counts[0] * self.forward_s, "backward_data": counts[1] * self.backward_s}
