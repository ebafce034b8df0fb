"""Offload to host memory over the device's host link (PCIe, NVLink-C2C): activations and the
optimizer state (strategy key `offload`: none | activations | optimizer | both).

A transfer of n bytes over the host link (`Cluster.host`, a `LinkTier`) takes the link's
point-to-point time (`dlsim.cost.p2p.p2p_model`; Hockney without LogGP terms):

    t(n) = latency + n / (bandwidth · bandwidth_efficiency)

Each device has its own link with one copy engine per direction (host-to-device and
device-to-host streams run at once).

* Activations (as Transformer Engine's `get_cpu_offload_context` and ZeRO-Infinity's activation
  checkpoint offload do): after a chunk's forward pass for a micro-batch, the activations it
  keeps for the backward pass are copied to the host (device-to-host stream, beside the next
  kernels) and leave device memory when the copy ends; before its backward pass they are copied
  back, prefetched: the copy may start once the op before that backward pass has started, and the
  backward pass waits for it. Nothing is offloaded when the backward pass follows the forward
  pass directly (the last stage's last micro-batch).
* Optimizer state (fp32 master weights and moments, `dlsim.cost.memory.state_bytes_per_param`)
  lives in host memory; the optimizer step streams it through the device in `OFFLOAD_SLICES`
  equal slices: a slice is copied in (the first prefetched from the start of the device's last
  backward pass; at most two slices on the device, double-buffered), stepped, and copied back.
  dlsim runs the step on the device: profiles hold no CPU optimizer throughput to price a CPU step
  (DeepSpeed ZeRO-Offload's CPU Adam) with. A slice counts against device memory between its two
  copies (memory kind `offload_staging`); with copies slower than the step the step takes about
  max(Σ copies in, Σ steps, Σ copies out).
"""

from __future__ import annotations

from dlsim.cost.p2p import p2p_model
from dlsim.errors import SpecError
from dlsim.results import Estimate, Source
from dlsim.spec.cluster import Cluster, LinkTier

from dlsim.spec.strategy import OFFLOADS  # noqa: F401  (the strategy's values, named here too)


OFFLOAD_SLICES = 8
"""Slices the offloaded optimizer state is streamed in (a modelling choice, like DeepSpeed's
`sub_group_size`; not a measured number): two on the device at a time bound the staging memory."""


def offloads_activations(offload: str) -> bool:
    return offload in ("activations", "both")


def offloads_optimizer(offload: str) -> bool:
    return offload in ("optimizer", "both")


def host_link(cluster: Cluster, offload: str) -> LinkTier | None:
    """The host link offloading uses, or None without offload; refuses a profile without one."""
    if offload == "none":
        return None
    if cluster.host is None:
        raise SpecError(f"offload {offload} moves bytes over the device's host link; profile {cluster.name!r} has no "
                        "host_link (add one: name, bandwidth_gbytes_per_s, latency_us)", field="offload")
    return cluster.host


def host_transfer(link: LinkTier, nbytes: float) -> Estimate:
    """Seconds to move `nbytes` between device and host memory: latency + n / effective bandwidth."""
    if nbytes <= 0:
        return Estimate(0.0, Source.MODEL, "nothing to move")
    model = p2p_model(link)
    return Estimate(float(model.time(float(nbytes))), Source.MODEL, f"host copy {model.model} over {link.name}")
