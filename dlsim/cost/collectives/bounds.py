"""Lower bounds and the nccl-tests bandwidth conventions.

Lower bounds (Chan, Heimlich, Purkayastha, van de Geijn, CCPE 19(13) 2007, Table "lower bounds";
`reference/algorithms.md` §3.1), with α = L + 2o and β = G of the link and γ seconds per byte:

    broadcast        ⌈lg p⌉α + nβ
    reduce           ⌈lg p⌉α + nβ + ((p−1)/p)nγ
    allgather        ⌈lg p⌉α + ((p−1)/p)nβ
    reduce-scatter   ⌈lg p⌉α + ((p−1)/p)nβ + ((p−1)/p)nγ
    allreduce        ⌈lg p⌉α + 2((p−1)/p)nβ + ((p−1)/p)nγ      (the survey's L log2 P + 2γmG(P−1)/P, S002 §2.5)
    all-to-all       ⌈lg p⌉α + ((p−1)/p)nβ
    send/recv        α + nβ

dlsim adds bounds for its non-MPI patterns, from the busiest port's bytes: push and pull
α + max(1, p/S)·nβ, gossip α + f·R·nβ (f = min(fanout, p−1), R rounds).

On a token-bucket port (`LinkTier.burst` b, peak rate R) at most b + t/β bytes can leave by time t
(tokens accrue during start-ups and reductions too) and none faster than R, so with V the bytes
through the busiest port the bound is max(start-ups + V/R + reduction, (V − b)β).

Bus bandwidth [doc: NVIDIA/nccl-tests doc/PERFORMANCE.md]: algbw = n / t and busbw = algbw × factor,
with factor 2(p−1)/p for allreduce, (p−1)/p for reduce-scatter, allgather and all-to-all, 1 otherwise.
"""

from __future__ import annotations

import numpy as np

from dlsim.cost.collectives.bits import ceil_log2
from dlsim.cost.p2p import PointToPoint

_BUS = {"allreduce": 2.0, "reduce-scatter": 1.0, "allgather": 1.0, "all-to-all": 1.0}


def bus_factor(collective: str, p):
    """nccl-tests busbw / algbw."""
    if collective in _BUS:
        return _BUS[collective] * (p - 1) / p
    return 1.0 + 0.0 * p


def lower_bound_time(collective: str, n, p, link: PointToPoint, gamma: float = 0.0, *, shards: int = 1,
                     fanout: int = 3, rounds: int = 1):
    """The lower bound above for `collective` (vectorised in n and p)."""
    if link.shaped:
        return _shaped_bound(collective, n, p, link, gamma, shards, fanout, rounds)
    a, b, lg = link.alpha, link.beta, ceil_log2(p)
    frac = (p - 1) / p
    if collective == "broadcast":
        return lg * a + n * b * (p > 1)
    if collective == "reduce":
        return lg * a + n * b * (p > 1) + frac * n * gamma
    if collective in ("allgather", "all-to-all"):
        return lg * a + frac * n * b
    if collective == "reduce-scatter":
        return lg * a + frac * n * (b + gamma)
    if collective == "allreduce":
        return lg * a + frac * n * (2 * b + gamma)
    if collective == "send-recv":
        return (a + n * b) * (p > 1)
    if collective in ("push", "pull"):
        return a + np.maximum(1.0, p / shards) * n * b
    if collective == "gossip":
        return (a + np.minimum(fanout, p - 1) * rounds * n * b) * (p > 1)
    raise ValueError(collective)


def _shaped_bound(collective: str, n, p, link: PointToPoint, gamma: float, shards: int, fanout: int, rounds: int):
    """max(start-ups + V/R + reduction, (V − b)β) with V the busiest port's bytes (module doc)."""
    a, lg = link.alpha, ceil_log2(p)
    frac = (p - 1) / p
    one = 1.0 * (p > 1)
    lat, volume, red = {
        "broadcast": (lg * a, n * one, 0.0),
        "reduce": (lg * a, n * one, frac * n * gamma),
        "allgather": (lg * a, frac * n, 0.0),
        "all-to-all": (lg * a, frac * n, 0.0),
        "reduce-scatter": (lg * a, frac * n, frac * n * gamma),
        "allreduce": (lg * a, 2 * frac * n, frac * n * gamma),
        "send-recv": (a * one, n * one, 0.0),
        "push": (a, np.maximum(1.0, p / shards) * n, 0.0),
        "pull": (a, np.maximum(1.0, p / shards) * n, 0.0),
        "gossip": (a * one, np.minimum(fanout, p - 1) * rounds * n * one, 0.0),
    }[collective]
    return np.maximum(lat + volume / link.peak_bandwidth + red, (volume - link.burst) * link.gap_per_byte)
