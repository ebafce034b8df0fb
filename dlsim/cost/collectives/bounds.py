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
α + max(1, p/S)·nβ, gossip α + f·R·nβ (f = min(fanout, p−1), R rounds). A sparse allreduce
(`sparse.py`: k = ρN items of c bytes per rank, K(p) expected in the sum) ends with every rank
holding the sum, of which it had at most its own k items: at least min(c·(K(p) − k), n) bytes reach
it, α' + (⌈lg p⌉ − 1)σ + min(c·(K(p) − k), n)·β (an expected-value bound; the dense fallback's own
bound is larger).

On a token-bucket port (`LinkTier.burst` b, peak rate R) at most b + t/β bytes can leave by time t
(tokens accrue during start-ups and reductions too) and none faster than R, so with V the bytes
through the busiest port the bound is max(start-ups + V/R + reduction, (V − b)β).

Across nodes (p = N·g ranks, g per node, N ≥ 2; `Costs.spans`) the bound counts what must cross
each NIC and each rank's ports. Treat each node as one process holding its g ranks' data (a node
may combine inside for free): Chan et al.'s bounds for N processes give the bytes V_node that leave
a node, through at most g·B_e of NIC bandwidth (the group's share; B_e the tier's per-device
rate); each rank still moves V_rank (the flat bound's volume for p ranks) through at most
B_i + g·B_e. At least one inter-node start-up lies on every path that combines two nodes' data,
the other rounds cost at least the cheapest start-up or spacing (σ below):

    α'_e + (⌈lg p⌉ − 1)·min(α'_e, α'_i, σ_e, σ_i) + max(V_node/(g·B_e), V_rank/(B_i + g·B_e)) + γ terms

    V_node: allreduce 2((N−1)/N)n, reduce-scatter and allgather ((N−1)/N)n, broadcast and reduce n

(other collectives keep the flat bound). The hierarchical allreduce meets the NIC term exactly.

Under LogP/LogGP a message of s bytes costs L + 2o + (s − 1)G ≥ (α − G) + sG, and a rank may start
its next send σ = max(o, g) after the previous one (σ ≤ α), so the number of ranks a value can have
reached at most doubles every σ after the first arrival: the start-up term is α' + (⌈lg p⌉ − 1)·σ
with α' = α − G (LogGP) — not ⌈lg p⌉α, which an Open MPI binomial broadcast to 3 ranks (α + σ)
would beat. Under Hockney σ = α' = α and it is Chan et al.'s ⌈lg p⌉α.

Bus bandwidth [doc: NVIDIA/nccl-tests doc/PERFORMANCE.md]: algbw = n / t and busbw = algbw × factor,
with factor 2(p−1)/p for allreduce, (p−1)/p for reduce-scatter, allgather and all-to-all, 1 otherwise.
"""

from __future__ import annotations

import numpy as np

from dlsim.cost.collectives.bits import ceil_log2
from dlsim.cost.collectives.sparse import fill_in
from dlsim.cost.p2p import PointToPoint

_BUS = {"allreduce": 2.0, "reduce-scatter": 1.0, "allgather": 1.0, "all-to-all": 1.0}


def bus_factor(collective: str, p):
    """nccl-tests busbw / algbw."""
    if collective in _BUS:
        return _BUS[collective] * (p - 1) / p
    return 1.0 + 0.0 * p


def lower_bound_time(collective: str, n, p, link: PointToPoint, gamma: float = 0.0, *, shards: int = 1,
                     fanout: int = 3, rounds: int = 1, density: float = 1.0, index_bytes: float = 4.0,
                     value_bytes: float = 4.0):
    """The lower bound above for `collective` (vectorised in n and p)."""
    a, b = _start(link), link.beta
    lat = _rounds(p, a, min(a, _spacing(link)))
    if collective == "sparse-allreduce":
        elements, c = n / value_bytes, index_bytes + value_bytes
        missing = c * (fill_in(density, p, elements) - density * elements)
        return lat + np.minimum(missing, n) * (link.gap_per_byte if link.shaped else b) * (p > 1)
    if link.shaped:
        return _shaped_bound(collective, n, p, link, gamma, shards, fanout, rounds)
    frac = (p - 1) / p
    if collective == "broadcast":
        return lat + n * b * (p > 1)
    if collective == "reduce":
        return lat + n * b * (p > 1) + frac * n * gamma
    if collective in ("allgather", "all-to-all"):
        return lat + frac * n * b
    if collective == "reduce-scatter":
        return lat + frac * n * (b + gamma)
    if collective == "allreduce":
        return lat + frac * n * (2 * b + gamma)
    if collective == "send-recv":
        return (a + n * b) * (p > 1)
    if collective in ("push", "pull"):
        return a + np.maximum(1.0, p / shards) * n * b
    if collective == "gossip":
        return (a + np.minimum(fanout, p - 1) * rounds * n * b) * (p > 1)
    raise ValueError(collective)


def _start(link: PointToPoint) -> float:
    """α' of the module doc: α, or α − G under LogGP."""
    return link.alpha - link.gap_per_byte if link.model == "loggp" else link.alpha


def _spacing(link: PointToPoint) -> float:
    """σ of the module doc: max(o, g) under LogP/LogGP, α otherwise."""
    return max(link.overhead, link.gap) if link.model in ("loggp", "logp") else link.alpha


def _rounds(p, first: float, then: float):
    """first + (⌈lg p⌉ − 1)·then for p > 1, else 0."""
    return np.where(np.asarray(p) > 1, first + (ceil_log2(p) - 1) * then, 0.0) if np.ndim(p) else \
        ((first + (ceil_log2(p) - 1) * then) if p > 1 else 0.0)


_NODE_VOLUME = {"allreduce": 2.0, "reduce-scatter": 1.0, "allgather": 1.0}


def node_lower_bound_time(collective: str, n, p, costs, *, shards: int = 1, fanout: int = 3, rounds: int = 1,
                          **sparse):
    """The bound above for a `Costs` that knows the nodes (`costs.node`); the flat bound elsewhere.
    `sparse`: density, index_bytes, value_bytes of a sparse allreduce."""
    flat = lower_bound_time(collective, n, p, costs.main, costs.gamma, shards=shards, fanout=fanout, rounds=rounds,
                            **sparse)
    if costs.node is not None and collective == "all-to-all":
        return _alltoall_node_bound(n, p, costs, flat)
    if costs.node is None or collective not in ("allreduce", "reduce-scatter", "allgather", "broadcast", "reduce"):
        return flat
    g, gamma = costs.ranks_per_node, costs.gamma
    q = np.asarray(p)
    nodes = np.maximum(q // g, 1)
    frac_p, frac_n = (q - 1) / q, (nodes - 1) / nodes
    a_e, a_i = _start(costs.main), _start(costs.intra)
    lat = _rounds(q, a_e, min(a_e, a_i, _spacing(costs.main), _spacing(costs.intra)))
    b_nic = g / costs.main.beta
    b_rank = 1.0 / costs.intra.beta + b_nic
    if collective in _NODE_VOLUME:
        v_node, v_rank = _NODE_VOLUME[collective] * frac_n * n, _NODE_VOLUME[collective] * frac_p * n
    else:
        v_node = v_rank = n
    red = frac_p * n * gamma if collective in ("allreduce", "reduce-scatter", "reduce") else 0.0
    topo = lat + np.maximum(v_node / b_nic, v_rank / b_rank) + red
    out = np.where(costs.spans(q), topo, flat)
    return out if np.ndim(out) else float(out)


def _alltoall_node_bound(n, p, costs, flat):
    """All-to-all over p ranks g per node: each rank sends (p − g)/p·n bytes off its node through its
    share of the NICs (β of the inter tier, per device) and (g − 1)/p·n bytes inside it (β_intra), the
    two at once at best: ⌈lg p⌉ start-ups + max of the two."""
    g = costs.ranks_per_node
    q = np.asarray(p)
    lat = _rounds(q, min(_start(costs.main), _start(costs.intra)),
                  min(_start(costs.main), _start(costs.intra), _spacing(costs.main), _spacing(costs.intra)))
    topo = lat + np.maximum((q - g) / q * n * costs.main.beta, (g - 1) / q * n * costs.intra.beta)
    out = np.where(costs.spans(q), topo, flat)
    return out if np.ndim(out) else float(out)


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
