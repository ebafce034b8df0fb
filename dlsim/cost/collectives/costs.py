"""The per-message prices the collective formulas are written in: T(s), S(s) and the reduction r(s).

    T(s)  time of one message of s bytes (Hockney, LogP or LogGP; `dlsim.cost.p2p`)
    S(s)  injection gap between back-to-back messages at one port (S ≤ T)
    r(s)  = γ·s, the time to combine s received bytes; γ is seconds per byte of reduction compute
          (Dryden's γ, S003), normally 1 / `Cluster.reduce_bandwidth`; None means free reduction.

Every closed form in this package is a sum of these terms over the steps of its schedule, so the
same function serves scalars and NumPy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlsim.cost.p2p import Bytes, PointToPoint, p2p_model
from dlsim.errors import SpecError
from dlsim.spec.cluster import LinkTier


@dataclass(frozen=True)
class Costs:
    """Prices for one collective call: the main tier, the intra-node tier and γ."""

    main: PointToPoint
    intra: PointToPoint
    gamma: float = 0.0

    def t(self, s: Bytes, intra: bool = False) -> Bytes:
        return (self.intra if intra else self.main).time(s)

    def gap(self, s: Bytes, intra: bool = False) -> Bytes:
        return (self.intra if intra else self.main).spacing(s)

    def r(self, s: Bytes) -> Bytes:
        return self.gamma * s

    def step(self, s: Bytes, reduce: bool = False, intra: bool = False) -> Bytes:
        """One step in which every active rank sends and receives at most one message of s bytes."""
        return self.t(s, intra) + self.r(s) if reduce else self.t(s, intra)


def make_costs(link: LinkTier, *, gamma: float | None = None, intra: LinkTier | None = None,
               model: "str | PointToPoint" = "auto") -> Costs:
    """`Costs` from link tiers; `gamma` in seconds per byte (None: reductions are free).

    `model` is a p2p model name, or a ready `PointToPoint` (e.g. `p2p.table_model` of measured
    times) that prices the main tier instead of `link`'s parameters.
    """
    g = 0.0 if gamma is None else float(gamma)
    if not np.isfinite(g) or g < 0:
        raise SpecError(f"gamma must be a finite non-negative number of seconds per byte, got {gamma!r}", field="gamma")
    if isinstance(model, PointToPoint):
        main = model
        inner = p2p_model(intra) if intra is not None else main
        return Costs(main, inner, g)
    main = p2p_model(link, model)
    inner = p2p_model(intra, main.model if model == "auto" else model) if intra is not None else main
    return Costs(main, inner, g)
