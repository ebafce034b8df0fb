"""Benchmark tables as plain data: per convolution layer and pass, (algorithm, micro-batch size) → time, workspace.

Rows come from a measured CSV (`dlsim.io.bench_table`), from the NumPy calibration
(`dlsim.calibrate.microbatch_bench`), or from the cost model (`dlsim.plan.microbatch.model_table`);
`source` says which: "measured", "interpolated" or "model" (`SOURCES`; a CSV's optional ``source``
column gives it per row, and a kernel whose rows disagree is "mixed"). A row's layer is a layer name, or a geometry signature
(`dlsim.cost.conv_methods.ConvGeometry.signature`) that stands for every layer of that shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from dlsim.errors import SpecError
from dlsim.plan.microbatch.configs import Kernel

PASSES = ("forward", "backward_data", "backward_weight")
SOURCES = ("measured", "interpolated", "model")
"""Where a row's time comes from: timed on the device, interpolated between timed rows, or a model
(the roofline-priced convolution costs of `dlsim.plan.microbatch.model_table`)."""
SOURCE_ALIASES = {"measured": "measured", "interpolated": "interpolated", "model": "model", "modelled": "model",
                  "modeled": "model", "roofline": "model"}


def canonical_source(name: str) -> str | None:
    """The source a user's spelling means (measured / interpolated / model), or None."""
    return SOURCE_ALIASES.get(str(name).strip().lower())
PASS_ALIASES = {
    "forward": "forward", "fwd": "forward", "fprop": "forward",
    "backward_data": "backward_data", "backward-data": "backward_data", "bwd_data": "backward_data",
    "dgrad": "backward_data", "backwarddata": "backward_data",
    "backward_weight": "backward_weight", "backward-weight": "backward_weight", "backward_filter": "backward_weight",
    "backward-filter": "backward_weight", "bwd_filter": "backward_weight", "wgrad": "backward_weight",
    "backwardfilter": "backward_weight",
}


def canonical_pass(name: str) -> str | None:
    """The pass a user's spelling means (forward / backward_data / backward_weight), or None."""
    return PASS_ALIASES.get(str(name).strip().lower())


@dataclass(frozen=True)
class KernelTable:
    """Every (algorithm, micro-batch size) row of one layer and pass."""

    layer: str
    pass_name: str
    rows: tuple[Kernel, ...]
    source: str = "measured"

    def at(self, size: int) -> tuple[Kernel, ...]:
        return tuple(r for r in self.rows if r.size == size)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted({r.size for r in self.rows}))


@dataclass(frozen=True)
class BenchTable:
    """Kernel tables in layer order (the order rows first name them)."""

    kernels: tuple[KernelTable, ...]
    origin: str = ""

    @staticmethod
    def from_rows(rows: Iterable[tuple], source: str = "measured", origin: str = "") -> "BenchTable":
        """From (layer, pass, Kernel) triples, or (layer, pass, Kernel, source) with a row's own source
        (`source` is the others'); a kernel whose rows have different sources is "mixed"."""
        grouped: dict[tuple[str, str], list[Kernel]] = {}
        sources: dict[tuple[str, str], set[str]] = {}
        for layer, pass_name, kernel, *own in rows:
            grouped.setdefault((layer, pass_name), []).append(kernel)
            sources.setdefault((layer, pass_name), set()).add(own[0] if own and own[0] else source)
        return BenchTable(tuple(KernelTable(layer, p, tuple(ks), _one(sources[(layer, p)]))
                                for (layer, p), ks in grouped.items()), origin)

    def layers(self) -> list[str]:
        seen: dict[str, None] = {}
        for k in self.kernels:
            seen.setdefault(k.layer, None)
        return list(seen)

    def kernel(self, layer: str, pass_name: str) -> KernelTable | None:
        for k in self.kernels:
            if k.layer == layer and k.pass_name == pass_name:
                return k
        return None

    def passes(self, layer: str) -> list[str]:
        found = {k.pass_name for k in self.kernels if k.layer == layer}
        return [p for p in PASSES if p in found]


def _one(sources: set[str]) -> str:
    return next(iter(sources)) if len(sources) == 1 else "mixed"


def bind_to_layers(table: BenchTable, layers: list[tuple[str, str]], *, strict: bool, origin: str = "") -> BenchTable:
    """Re-key `table` by model layer name: `layers` is [(name, signature)] of the model's convolutions.

    A row names a layer or a signature; a layer takes its own rows first, then its signature's.
    With `strict`, a row naming neither a model convolution nor one's signature is an error (a user
    table for this model); otherwise such rows are ignored (a profile's table for many models).
    """
    names = {name for name, _ in layers}
    signatures = {sig for _, sig in layers}
    if strict:
        for k in table.kernels:
            if k.layer not in names and k.layer not in signatures:
                known = ", ".join(sorted(names)[:8]) + (", ..." if len(names) > 8 else "")
                raise SpecError(f"unknown layer {k.layer!r}: not a convolution of the model (conv layers: {known})",
                                path=origin or table.origin or None, field="layer")
    bound = []
    for name, sig in layers:
        for p in PASSES:
            k = table.kernel(name, p) or table.kernel(sig, p)
            if k is not None:
                bound.append(KernelTable(name, p, k.rows, k.source))
    return BenchTable(tuple(bound), table.origin)
