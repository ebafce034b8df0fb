"""Token routing of a mixture-of-experts layer: how many token-expert pairs the busiest expert rank runs.

A layer of E routed experts with top-k routing sends each of R tokens to k experts (Shazeer et al.
2017; GShard, Lepikhin et al. 2021; Switch Transformer, Fedus et al. 2022, §2.1). Under expert
parallelism of degree ep each rank holds E/ep experts. Balanced, every rank receives R·k pairs per
micro-batch of R tokens (R·k/ep from each of the ep ranks) and each of its experts R·k·ep/E.

`imbalance` I is the load of the busiest expert rank over the mean (1 = balanced; at most ep, all
pairs on one rank; with ep = 1 there is one rank and I has no effect, so I_eff = min(I, ep)).
With a capacity factor c (Switch Transformer eq. 3: expert capacity = c·R·k/E pairs per expert) a
rank runs at most c times its mean load; the pairs beyond are dropped (passed on by the residual
connection only). Without one (dropless, Megablocks / Megatron-Core's default) nothing is dropped.
The busiest rank therefore runs

    u·R·k pairs,   u = min(I_eff, c)     (u = I_eff dropless)

and drops a fraction 1 − u/I_eff of the pairs routed to it. The step waits for that rank, so its
expert GEMMs and its all-to-all volumes set the layer's time (`dlsim.cost.layers`,
`dlsim.plan.expertparallel`). Padding to capacity is not computed (Megatron-Core's default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Routing:
    """Routing of one micro-batch of `tokens` tokens on the busiest of `ep` expert ranks."""

    tokens: int
    top_k: int
    experts: int
    ep: int
    load: float
    """u: the busiest rank's pairs over the balanced R·k (module doc)."""
    dropped: float
    """fraction of the pairs routed to the busiest rank that it drops (capacity)."""

    @property
    def local_experts(self) -> int:
        return self.experts // self.ep

    @property
    def pairs(self) -> int:
        """Token-expert pairs the busiest rank computes: ⌈u·R·k⌉."""
        return math.ceil(self.load * self.tokens * self.top_k - 1e-9)

    @property
    def rows_per_expert(self) -> int:
        """Rows of each local expert's GEMMs: ⌈pairs / (E/ep)⌉."""
        return math.ceil(self.pairs / self.local_experts)


def routing(attrs: Mapping, tokens: int, ep: int = 1) -> Routing:
    """`Routing` of a `moe` layer with attributes `attrs` for `tokens` tokens under `ep` ranks."""
    imbalance = min(float(attrs["imbalance"]), float(ep))
    cap = attrs["capacity_factor"]
    load = imbalance if cap is None else min(imbalance, float(cap))
    dropped = 1.0 - load / imbalance
    return Routing(tokens, int(attrs["top_k"]), int(attrs["experts"]), ep, load, dropped)
