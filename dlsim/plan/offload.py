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
  backward pass waits for it. Where the backward pass follows the forward pass directly (data
  parallelism and FSDP without a pipeline, a pipeline's last stage) they are offloaded one unit
  at a time inside the passes (`UnitOffload`, units from `offload_units`: Transformer Engine's
  layer-by-layer CPU offload, PyTorch's `save_on_cpu` hooks): each unit's activations go to the
  host while the next units compute and come back one unit ahead of their backward. Under full
  recomputation only the chunk-level offload applies (the checkpoints of a chunk whose backward
  comes later).
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

from typing import Any, Callable, Mapping, Sequence

from dlsim.cost.p2p import p2p_model
from dlsim.errors import SpecError
from dlsim.results import Estimate, Source
from dlsim.plan.taskgraph import ACTIVATIONS
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


def offload_units(entries: Sequence[Any], instance: Mapping[str, str | None]) -> dict[int, int]:
    """Activation-offload unit of every layer of a chunk (layer index -> unit, in forward order): the
    repeated-block instance a layer belongs to (a transformer layer, as Transformer Engine's
    `get_cpu_offload_context` offloads one layer at a time), else the layer itself (a network without
    repeated blocks: every layer its own unit); a layer outside the blocks joins the unit before it."""
    out: dict[int, int] = {}
    unit, previous = -1, None
    for e in entries:
        key = instance.get(e.name)
        if unit < 0 or (key is not None and key != previous):
            unit += 1
            previous = key
        out[e.index] = unit
    return out


def unit_offload_plan(entries: Sequence[Any], instance: Mapping[str, str | None], selective: bool,
                      bucket_units: Mapping[int, int] | None = None) -> tuple[dict[int, int], dict[int, float]]:
    """(layer index -> unit, unit -> activation bytes kept, in forward order) of a chunk for `UnitOffload`: the units of
    `offload_units`, or `bucket_units` (FSDP's parameter units, ZeRO-3: a wrapped module offloads its
    own activations) when given; bytes are each layer's `saved_bytes` less, under selective
    recomputation, its attention core (`core_bytes`, recomputed rather than kept)."""
    units = dict(bucket_units) if bucket_units else offload_units(entries, instance)
    kept: dict[int, float] = {}
    for e in entries:
        u = units[e.index]
        kept[u] = kept.get(u, 0.0) + e.saved_bytes - (e.core_bytes if selective else 0.0)
    return units, kept


class UnitOffload:
    """Activation offload one unit at a time for a forward pass followed directly by its backward
    pass (data parallelism and FSDP without a pipeline, a pipeline's last stage): step hooks
    (`dlsim.plan.templates.StepHooks`) wrapping the synchronisation's hooks, if any.

    Forward: a unit's saved activations (`kept[unit]` bytes) count from its first step; when the
    next unit starts they are copied to the host (device-to-host stream) and leave device memory
    when the copy ends; unit u + 2 waits for unit u's copy (double buffering: at most two units'
    activations in flight beside the running one). The last unit stays on the device (its backward
    comes next). Backward (units in reverse): as a unit starts, the unit after it (in backward order)
    is copied back beside it (host-to-device stream; after its copy out), counting from that copy's
    start; a unit's first step waits for its copy back, and its activations are freed
    when its last step ends. `copy(direction, nbytes, deps, name, mem_start=..., mem_end=...)`
    issues a host copy on this device (`dlsim.plan.iteration._Builder.host_copy`)."""

    def __init__(self, kept: Mapping[int, float], copy: Callable[..., int], graph: Any, label: str,
                 inner: Any = None):
        self.kept, self.copy, self.g, self.label, self.inner = dict(kept), copy, graph, label, inner
        self.order = list(self.kept)        # forward order
        self.position = {u: j for j, u in enumerate(self.order)}
        self.out: dict[int, int] = {}       # unit -> its copy to the host
        self.back: dict[int, int] = {}      # unit -> its copy back to the device
        self.unit, self.last, self.first_of_unit, self.backward = -1, -1, False, False

    def start_backward(self, inner: Any) -> None:
        """Switch to the backward pass (with that op's synchronisation hooks, if any)."""
        self.inner, self.backward, self.unit = inner, True, -1

    def before(self, step: Any) -> list[int]:
        deps = list(self.inner.before(step)) if self.inner is not None else []
        self.first_of_unit = step.unit >= 0 and step.unit != self.unit
        if not self.first_of_unit:
            return deps
        previous = self.unit
        if not self.backward:
            if previous >= 0 and self.kept.get(previous, 0.0) > 0:
                self.out[previous] = self.copy("out", self.kept[previous], [self.last],
                                               f"D2H activations unit{previous} {self.label}",
                                               mem_end=((ACTIVATIONS, -self.kept[previous]),))
            j = self.position.get(step.unit, 0)
            if j >= 2 and self.order[j - 2] in self.out:
                deps.append(self.out[self.order[j - 2]])
        else:
            self._free(previous)
            self._prefetch(step.unit)
            if step.unit in self.back:
                deps.append(self.back[step.unit])
        self.unit = step.unit
        return deps

    def after(self, step: Any, tid: int) -> None:
        if self.inner is not None:
            self.inner.after(step, tid)
        if self.first_of_unit and not self.backward:
            self.g.tasks[tid].mem_start += ((ACTIVATIONS, self.kept.get(step.unit, 0.0)),)
        self.first_of_unit = False
        self.last = tid

    def close(self) -> None:
        """The backward pass has ended: free its last unit."""
        self._free(self.unit)

    def _free(self, unit: int) -> None:
        if unit >= 0 and self.last >= 0 and self.kept.get(unit, 0.0):
            self.g.tasks[self.last].mem_end += ((ACTIVATIONS, -self.kept[unit]),)

    def _prefetch(self, unit: int) -> None:
        """`unit` starts its backward: copy back the unit after it in backward order, beside it."""
        j = self.position.get(unit, 0)
        if j == 0:
            return
        nxt = self.order[j - 1]
        if nxt in self.out and nxt not in self.back:
            self.back[nxt] = self.copy("in", self.kept[nxt], [self.out[nxt], self.last],
                                       f"H2D activations unit{nxt} {self.label}",
                                       mem_start=((ACTIVATIONS, self.kept[nxt]),))
