"""A software stack: the framework a strategy runs on, named and versioned (frozen data).

A prediction depends on the stack as much as on the hardware: which kernels are fused, which
collectives run beside which GEMMs, how gradients are accumulated and reduced, what the pipeline
engine does between micro-batches. A `Stack` sets those strategy fields (`STACK_KEYS`), each value
read from that framework's code at a named commit (`sources`); the built-in stacks are files in
``stacks/`` (`dlsim.io.stack_yaml`). A strategy takes the stack's values for every key its caller did
not give (`stack_fields`): a flag or a strategy-file key overrides one key of the stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Collection, Mapping

STACK_KEYS = ("dtype", "fused_kernels", "loss_kernel", "optimizer", "optimizer_impl", "grad_accumulation", "grad_reduce_dtype", "zero_grad_reduce",
              "fsdp_units", "fsdp_copies", "tp_async_backward", "sequence_parallel",
              "tp_comm_overlap", "p2p_overlap", "p2p_scatter_gather", "pipeline_split", "overlap", "bucket_size", "first_bucket_size", "zero",
              "param_gather_overlap", "recompute")
"""The strategy fields a stack may set (`dlsim.spec.strategy.Strategy`). The layout (dp, tp, pp, cp,
ep), the batch and the schedule are the strategy's own; `zero`, `sequence_parallel` and
`recompute` are the stack's defaults, which a strategy changes at will."""

RECORD_NAMES = {"bucket_size": "bucket_size_bytes", "first_bucket_size": "first_bucket_size_bytes"}
"""Stack keys whose record name carries their unit (bytes); every other key is named as it is."""

NEEDS_TP = ("sequence_parallel", "tp_async_backward", "tp_comm_overlap")
"""Keys that only mean something with tensor parallelism: a stack's value applies when tp >= 2."""

NEEDS_SP = ("tp_comm_overlap",)
"""Keys that only mean something with sequence parallelism: a stack's value applies when the strategy
runs it (the caller's `sequence_parallel`, else the stack's)."""

NEEDS_ZERO1 = ("zero_grad_reduce",)
"""Keys that only mean something with ZeRO-1 without hybrid sharding: a stack's value applies when the
strategy runs zero 1 (the caller's `zero`, else the stack's; not when a search varies it) unsharded
across nodes."""


@dataclass(frozen=True)
class Stack:
    """A named, versioned software stack: `values` by strategy field (`STACK_KEYS`), and per key
    where the value was read (`sources`: repository, file, commit)."""

    name: str
    version: str
    framework: str
    description: str = ""
    values: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    repositories: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    path: str = ""

    @property
    def label(self) -> str:
        """``name (version)``, as summaries name the stack."""
        return f"{self.name} ({self.version})" if self.version else self.name

    def to_dict(self) -> dict[str, Any]:
        """The record of the stack a result ran on."""
        return {"name": self.name, "version": self.version, "framework": self.framework,
                "values": {RECORD_NAMES.get(k, k): list(v) if isinstance(v, tuple) else v for k, v in self.values.items()}}


def stack_fields(stack: Stack, given: Collection[str], tp: int, dtype: str | None,
                 sequence_parallel: bool | None = None, zero1: bool | None = None) -> dict[str, Any]:
    """The strategy fields `stack` adds to those `given` (which win): every value of the stack the
    caller did not set, but those that need tensor parallelism when tp < 2, those that need
    sequence parallelism without it (`sequence_parallel`: the caller's value, None when not given)
    and those that need unsharded-across-nodes ZeRO-1 without it (`zero1`: whether the caller's
    strategy runs it, None when the caller set neither zero nor hybrid sharding: the stack's zero),
    and the stack's dtype as `dtype` (the device's closest precision, `device_dtype`, decided by the
    caller) when given."""
    out: dict[str, Any] = {}
    if sequence_parallel is None:
        sequence_parallel = bool(stack.values.get("sequence_parallel", False)) and tp >= 2
    if zero1 is None:
        zero1 = stack.values.get("zero", 0) == 1
    for key, value in stack.values.items():
        if key in given or (key in NEEDS_TP and tp < 2) or (key in NEEDS_SP and not sequence_parallel) \
                or (key in NEEDS_ZERO1 and not zero1):
            continue
        if key == "dtype":
            if dtype is None:
                continue
            value = dtype
        out[key] = value
    return out


def device_dtype(wanted: str, peaks: Mapping[str, float]) -> str | None:
    """The training precision a stack asking for `wanted` gets on a device with matrix peaks
    `peaks`: `wanted` where the device computes it; 16-bit training falls back to the 16-bit type
    the device has (bf16 ↔ fp16: AMP picks what the tensor cores take); None where neither (the
    model's own precision stays, e.g. on a CPU)."""
    if wanted in peaks:
        return wanted
    if wanted in ("bf16", "fp16"):
        for other in ("bf16", "fp16"):
            if other in peaks:
                return other
    return None
