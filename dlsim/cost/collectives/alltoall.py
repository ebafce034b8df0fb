"""All-to-all (each rank holds p blocks of n/p bytes, one for every rank) and point-to-point send/recv.

Sources: Thakur et al. 2005 §4.4 (MPICH pairwise exchange, scattered isend/irecv, Bruck);
Bruck, Ho, Kipnis, Upfal, Weathersby, IEEE TPDS 8(11) 1997; `reference/algorithms.md` §3.1.

    pairwise exchange: in step i (1..p−1) rank r sends to r+i, receives from r−i   (p−1)·T(n/p)
    linear: every rank posts its p−1 sends at once; ports serialise them           T(n/p) + (p−2)·S(n/p)
    Bruck: in step k (0..⌈lg p⌉−1) rank r sends to r+2^k the c_k blocks whose index has bit k set
                                                                                   Σ_k T(c_k·n/p)
    send/recv (pipeline stages): one message                                       T(n)
    node-aware ("hierarchical", g ranks per node, p/g nodes): every rank posts its g−1 sends inside
    its node on the intra-node tier and its p−g sends to other nodes on the inter-node tier at once;
    the two tiers' ports work side by side (NVLink beside the NIC; NCCL's all-to-all is grouped
    ncclSend/ncclRecv, each peer over the path between the two GPUs [doc: NCCL user guide, "Point-to-
    point communication", all-to-all example]; Megatron-Core's MoE dispatch uses it):
        max( T_i(n/p) + (g−2)·S_i(n/p),  T(n/p) + (p−g−1)·S(n/p) )        (a term is 0 with no message)
    where T_i, S_i price the intra-node tier and T, S the inter-node tier at the rank's share of its
    node's NICs (B_dev). With Hockney: max((g−1)·T_i(n/p), (p−g)·T(n/p)).

Bruck allgather (n = gathered size): in step k rank r sends the min(2^k, p − 2^k) blocks it has
gathered so far to r − 2^k: Σ_k T(min(2^k, p − 2^k)·n/p), which is ⌈lg p⌉α + ((p−1)/p)nβ with Hockney T.

S is the injection gap (`dlsim.cost.p2p`): with Hockney S = T and linear equals pairwise; with LogGP
the posted sends overlap. c_k = ⌊p / 2^{k+1}⌋·2^k + max(0, p mod 2^{k+1} − 2^k); for p a power of two
c_k = p/2 and Bruck costs ⌈lg p⌉(α + (n/2)β). The local block rotations of Bruck are not priced.
"""

from __future__ import annotations

import numpy as np

from dlsim.cost.collectives.bits import ceil_log2
from dlsim.cost.collectives.costs import Costs
from dlsim.cost.collectives.schedule import Schedule, ScheduleBuilder
from dlsim.cost.collectives.trees import doubling_blocks_time


def pairwise_time(n, p, c: Costs):
    return (p - 1) * c.step(n / p)


def linear_time(n, p, c: Costs):
    return np.where(p > 1, c.step(n / p) + np.maximum(p - 2, 0) * c.gap(n / p), 0.0) if np.ndim(p) else \
        (c.step(n / p) + (p - 2) * c.gap(n / p) if p > 1 else 0.0)


def node_aware_time(n, p, c: Costs, g):
    """The node-aware all-to-all (module doc) for g ranks per node (vectorised in n and p)."""
    s = n / p
    inside = np.where(g > 1, c.t(s, True) + np.maximum(g - 2, 0) * c.gap(s, True), 0.0)
    across = np.where(p > g, c.t(s) + np.maximum(p - g - 1, 0) * c.gap(s), 0.0)
    out = np.maximum(inside, across)
    return out if np.ndim(out) else float(out)


def bruck_blocks(p, k):
    """c_k: how many block indices in [0, p) have bit k set."""
    return (p >> (k + 1)) * (1 << k) + np.maximum(0, p % (1 << (k + 1)) - (1 << k))


def bruck_time(n, p, c: Costs):
    K = ceil_log2(p)
    if np.ndim(K) == 0:
        return sum(c.step(bruck_blocks(p, k) * n / p) for k in range(int(K))) if K else 0.0 * n
    total = np.zeros(np.broadcast(n, p).shape)
    for k in range(int(np.max(K))):
        total = total + np.where(k < K, c.step(bruck_blocks(p, k) * n / p), 0.0)
    return total


def bruck_allgather_time(n, p, c: Costs):
    return doubling_blocks_time(n, p, c)


def sendrecv_time(n, p, c: Costs):
    return np.where(p > 1, c.step(n), 0.0) if np.ndim(p) else (c.step(n) if p > 1 else 0.0 * n)


def pairwise_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("all-to-all", "pairwise", n, p)
    for i in range(1, p):
        for r in range(p):
            b.send(i - 1, r, (r + i) % p, n / p)
    return b.build()


def linear_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("all-to-all", "linear", n, p)
    for i in range(1, p):
        for r in range(p):
            b.send(0, r, (r + i) % p, n / p)
    return b.build()


def node_aware_schedule(n: float, p: int, g: int) -> Schedule:
    """Rank r = node·g + l sends first inside its node (to l + i mod g, i = 1..g−1, intra tier), then
    to every other node j (to local index l + i mod g there, i = 0..g−1), all in one step; in each
    slot every receiver gets one message, so no receive port queues."""
    b = ScheduleBuilder("all-to-all", "hierarchical", n, p)
    nodes = p // g
    for i in range(1, g):
        for r in range(p):
            node, local = divmod(r, g)
            b.send(0, r, node * g + (local + i) % g, n / p, intra=True)
    for j in range(1, nodes):
        for i in range(g):
            for r in range(p):
                node, local = divmod(r, g)
                b.send(0, r, ((node + j) % nodes) * g + (local + i) % g, n / p)
    return b.build(ranks_per_node=g)


def bruck_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("all-to-all", "bruck", n, p)
    for k in range(ceil_log2(p)):
        for r in range(p):
            b.send(k, r, (r + (1 << k)) % p, bruck_blocks(p, k) * n / p)
    return b.build()


def bruck_allgather_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("allgather", "bruck", n, p)
    for k in range(ceil_log2(p)):
        for r in range(p):
            b.send(k, r, (r - (1 << k)) % p, min(1 << k, p - (1 << k)) * n / p)
    return b.build()


def sendrecv_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("send-recv", "direct", n, p)
    if p > 1:
        b.send(0, 0, 1, n)
    return b.build()
