"""Ring algorithms (Patarasuk & Yuan, JPDC 69(2) 2009; the Baidu/Horovod ring; Thakur et al. 2005).

The vector is cut into p chunks of n/p bytes; in every step each rank sends one chunk to its right
neighbour and receives one from its left neighbour.

    reduce-scatter (p−1 steps, combine on receipt):  (p−1)·[T(n/p) + r(n/p)]
    allgather      (p−1 steps; n = gathered size):   (p−1)·T(n/p)
    allreduce      (reduce-scatter then allgather):  (p−1)·[T(n/p) + r(n/p)] + (p−1)·T(n/p)

With Hockney T this is 2(p−1)α + 2((p−1)/p)nβ + ((p−1)/p)nγ, the table of
`reference/algorithms.md` §3.1 and S003 "Collectives for deep learning". On a token-bucket link
the same steps are priced with the bucket carried from step to step (`bucket.lockstep_time`).

Across nodes (p = N·g ranks, g per node, node-contiguous, `Costs.spans`): in every step N hops
cross nodes, one per node, and the other p − N hops stay inside a node, so a step costs
max(T_node(n/p), T_intra(n/p)) (+ r(n/p)) with T_node at B_node = min(g·B_dev, B_intra)
(`costs.py`; NCCL's rings across nodes, NCCL's channels using all the node's NICs):

    allreduce = 2(p−1)·max(T_node, T_intra)(n/p) + (p−1)·r(n/p)
              = 2(p−1)α_e + 2((p−1)/p)·n/B_node + ((p−1)/p)nγ     (Hockney, B_node ≤ B_intra)
"""

from __future__ import annotations

import numpy as np

from dlsim.cost.collectives import bucket
from dlsim.cost.collectives.costs import Costs
from dlsim.cost.collectives.schedule import Schedule, ScheduleBuilder


def ring_step(n, p, c: Costs, reduce: bool, intra: bool = False):
    """One ring step of n/p bytes: flat, or node-contiguous across nodes (module doc)."""
    flat = c.step(n / p, reduce=reduce, intra=intra)
    if intra or c.node is None:
        return flat
    spans = c.spans(p)
    if np.ndim(spans) == 0:
        return c.node_step(n / p, reduce) if spans else flat
    return np.where(spans, c.node_step(n / p, reduce), flat)


def reduce_scatter_time(n, p, c: Costs, intra: bool = False):
    if bucket.shaped(c, intra):
        return bucket.lockstep_time(c, bucket.ring_steps(n, p, True, False), intra)
    return (p - 1) * ring_step(n, p, c, True, intra)


def allgather_time(n, p, c: Costs, intra: bool = False):
    if bucket.shaped(c, intra):
        return bucket.lockstep_time(c, bucket.ring_steps(n, p, False, True), intra)
    return (p - 1) * ring_step(n, p, c, False, intra)


def allreduce_time(n, p, c: Costs, intra: bool = False):
    if bucket.shaped(c, intra):
        return bucket.lockstep_time(c, bucket.ring_steps(n, p, True, True), intra)
    return reduce_scatter_time(n, p, c, intra) + allgather_time(n, p, c, intra)


def add_ring(b: ScheduleBuilder, n: float, groups: list[list[int]], first_step: int, *, reduce: bool,
             intra: bool = False) -> int:
    """Append p−1 ring steps, run at once in every group of p ranks (chunks of n/p); returns the next step."""
    p = len(groups[0])
    for k in range(p - 1):
        for ranks in groups:
            for i in range(p):
                b.send(first_step + k, ranks[i], ranks[(i + 1) % p], n / p, reduce=reduce, intra=intra)
    return first_step + max(p - 1, 0)


def reduce_scatter_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("reduce-scatter", "ring", n, p)
    add_ring(b, n, [list(range(p))], 0, reduce=True)
    return b.build()


def allgather_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("allgather", "ring", n, p)
    add_ring(b, n, [list(range(p))], 0, reduce=False)
    return b.build()


def allreduce_schedule(n: float, p: int) -> Schedule:
    b = ScheduleBuilder("allreduce", "ring", n, p)
    step = add_ring(b, n, [list(range(p))], 0, reduce=True)
    add_ring(b, n, [list(range(p))], step, reduce=False)
    return b.build()
