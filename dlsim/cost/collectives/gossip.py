"""Gossip: in every round each rank sends its n-byte model to f peers and averages what it receives
(S002 §6.2: "each node talks to a fixed number of random nodes (typically three)"; Boyd et al. 2005;
dissemination to all m nodes after about 1.639·log2 m rounds, Drezner & Barak 1986).

dlsim draws the peers of round t as f distinct random offsets o_1..o_f in [1, p) (seeded): rank i
sends to i + o_q mod p. Every rank then sends f and receives f messages per round, and its ports
serialise them:

    R·[T(n) + r(n) + (f − 1)·(S(n) + r(n))],   f = min(fanout, p − 1)

The seed fixes the peers (the schedule); the time does not depend on it.
"""

from __future__ import annotations

import math

import numpy as np

from dlsim.cost.collectives.costs import Costs
from dlsim.cost.collectives.schedule import Schedule, ScheduleBuilder

DEFAULT_FANOUT = 3


def dissemination_rounds(p: int) -> int:
    """⌈1.639·log2 p⌉ rounds to reach every rank with high probability (Drezner & Barak 1986)."""
    return max(1, math.ceil(1.639 * math.log2(p))) if p > 1 else 0


def gossip_time(n, p, c: Costs, fanout: int = DEFAULT_FANOUT, rounds: int = 1):
    f = np.minimum(fanout, np.maximum(p - 1, 0))
    per_round = c.step(n, True) + (f - 1) * (c.gap(n) + c.r(n))
    return np.where(f > 0, rounds * per_round, 0.0) if np.ndim(f) else (rounds * per_round if f > 0 else 0.0 * n)


def gossip_schedule(n: float, p: int, fanout: int = DEFAULT_FANOUT, rounds: int = 1, seed: int = 0) -> Schedule:
    b = ScheduleBuilder("gossip", "random-peers", n, p)
    f = min(fanout, p - 1)
    rng = np.random.default_rng(seed)
    for t in range(rounds if f > 0 else 0):
        offsets = rng.choice(np.arange(1, p), size=f, replace=False)
        for off in offsets:
            for i in range(p):
                b.send(t, i, (i + int(off)) % p, n, reduce=True)
    return b.build(fanout=fanout, rounds=rounds, seed=seed)
