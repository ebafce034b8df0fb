"""Kernel configurations and μ-cuDNN's "desirable set": the Pareto front in (workspace, time).

A configuration runs a layer-pass's mini-batch as a list of micro-batches, each with its own
algorithm; its time is the sum of theirs and, because the micro-batches run one after another in
one buffer (workspace reuse), its workspace is the largest of theirs (spcl/ucudnn src/convConfig.h).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Kernel:
    """One micro-batch: `size` samples through `algorithm`, measured (or modelled) time and workspace."""

    algorithm: str
    size: int
    time_s: float
    workspace_bytes: float


@dataclass(frozen=True)
class Config:
    """Micro-batches in execution order (largest first); time adds up, workspace is the maximum."""

    kernels: tuple[Kernel, ...]
    time_s: float
    workspace_bytes: float

    @staticmethod
    def of(kernels: Iterable[Kernel]) -> "Config":
        ks = tuple(sorted(kernels, key=lambda k: (-k.size, k.algorithm)))
        return Config(ks, sum(k.time_s for k in ks), max((k.workspace_bytes for k in ks), default=0.0))

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(k.size for k in self.kernels)

    @property
    def batch(self) -> int:
        return sum(self.sizes)

    def key(self) -> tuple:
        """Deterministic tie-break: fewer micro-batches, then the micro-batch list itself."""
        return (len(self.kernels), tuple((-k.size, k.algorithm) for k in self.kernels))


def dominates(a: Config | Kernel, b: Config | Kernel) -> bool:
    """a is no worse in both workspace and time and better in one."""
    return (a.workspace_bytes <= b.workspace_bytes and a.time_s <= b.time_s
            and (a.workspace_bytes, a.time_s) != (b.workspace_bytes, b.time_s))


def pareto_front(items: Iterable, key=None) -> list:
    """The non-dominated items in (workspace, time), workspace ascending and time strictly descending.

    Same semantics as μ-cuDNN's ``DesirableSet::insert`` (spcl/ucudnn src/desirableSet.cpp): an item stays
    iff no other item has workspace ≤ its workspace and a smaller time; items with equal (workspace,
    time) collapse to one (the first by `key`, default `Config.key` / the algorithm name).
    """
    tie = key or (lambda c: c.key() if isinstance(c, Config) else (c.algorithm, c.size))
    front, best = [], float("inf")
    for item in sorted(items, key=lambda c: (c.workspace_bytes, c.time_s, tie(c))):
        if item.time_s < best:
            front.append(item)
            best = item.time_s
    return front
