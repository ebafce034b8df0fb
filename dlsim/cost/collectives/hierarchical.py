"""Hierarchical (two-level) allreduce for N nodes of g ranks (`reference/algorithms.md` §3.1 [derived];
Mikami et al. 2018, Ying et al. 2018; NCCL's intra-node/inter-node split; Open MPI coll/han).

1. reduce-scatter inside every node by a ring on the intra-node tier (each rank keeps n/g bytes);
2. g concurrent allreduces of n/g bytes, one per local rank index, across the N nodes on the
   inter-node tier (ring by default, or any flat allreduce algorithm);
3. allgather inside every node by a ring on the intra-node tier.

    (g−1)·[T_intra(n/g) + r(n/g)] + A_inter(n/g, N) + (g−1)·T_intra(n/g)

With a ring across nodes and Hockney T this is the table's
2(g−1)α_i + 2((g−1)/g)nβ_i + 2(N−1)α_e + 2((N−1)/N)(n/g)β_e (+ γ terms).

The g inter-node groups run at once, so each flow has its device's share B_dev of the node's NICs
(β_e = 1/B_dev): the inter-node bytes per node, 2((N−1)/N)·n, are exactly the node-level lower
bound's (`bounds.py`). Reduce-scatter and allgather split the same way (NCCL's intra-node/inter-node
split of its ring; Open MPI coll/han):

    reduce-scatter (n = input per rank):   (g−1)·[T_intra(n/g) + r(n/g)] + (N−1)·[T_e(n/p) + r(n/p)]
    allgather      (n = gathered output):  (N−1)·T_e(n/p) + (g−1)·T_intra(n/g)

so reduce-scatter + allgather = the hierarchical allreduce with a ring across nodes.
"""

from __future__ import annotations

from typing import Callable

from dlsim.cost.collectives import ring
from dlsim.cost.collectives.costs import Costs
from dlsim.cost.collectives.schedule import Schedule, ScheduleBuilder, append_messages, relabel


def hierarchical_time(n, p, c: Costs, ranks_per_node: int, inter: Callable):
    g = ranks_per_node
    nodes = p // g
    return (ring.reduce_scatter_time(n, g, c, intra=True) + inter(n / g, nodes, c.flat())
            + ring.allgather_time(n, g, c, intra=True))


def reduce_scatter_time(n, p, c: Costs, ranks_per_node: int):
    g = ranks_per_node
    return ring.reduce_scatter_time(n, g, c, intra=True) + ring.reduce_scatter_time(n / g, p // g, c.flat())


def allgather_time(n, p, c: Costs, ranks_per_node: int):
    g = ranks_per_node
    return ring.allgather_time(n / g, p // g, c.flat()) + ring.allgather_time(n, g, c, intra=True)


def _split_schedule(collective: str, n: float, p: int, g: int, reduce: bool) -> Schedule:
    """Reduce-scatter (intra ring, then a ring per local index across nodes) or allgather (reverse)."""
    nodes = p // g
    b = ScheduleBuilder(collective, "hierarchical", n, p)
    local = [[node * g + i for i in range(g)] for node in range(nodes)]
    across = [[node * g + i for node in range(nodes)] for i in range(g)]
    if reduce:
        step = ring.add_ring(b, n, local, 0, reduce=True, intra=True)
        ring.add_ring(b, n / g, across, step, reduce=True)
    else:
        step = ring.add_ring(b, n / g, across, 0, reduce=False)
        ring.add_ring(b, n, local, step, reduce=False, intra=True)
    return b.build(ranks_per_node=g)


def reduce_scatter_schedule(n: float, p: int, ranks_per_node: int) -> Schedule:
    return _split_schedule("reduce-scatter", n, p, ranks_per_node, True)


def allgather_schedule(n: float, p: int, ranks_per_node: int) -> Schedule:
    return _split_schedule("allgather", n, p, ranks_per_node, False)


def hierarchical_schedule(n: float, p: int, ranks_per_node: int, inter: Callable[[float, int], Schedule],
                          inter_algorithm: str) -> Schedule:
    g, nodes = ranks_per_node, p // ranks_per_node
    b = ScheduleBuilder("allreduce", "hierarchical", n, p)
    local = [[node * g + i for i in range(g)] for node in range(nodes)]
    step = ring.add_ring(b, n, local, 0, reduce=True, intra=True)
    inner = inter(n / g, nodes)
    placed = []
    for i in range(g):
        placed += relabel(inner, [node * g + i for node in range(nodes)], step, intra=False)
    append_messages(b, placed)
    step += max((m.step for m in inner.messages), default=-1) + 1
    ring.add_ring(b, n, local, step, reduce=False, intra=True)
    return b.build(ranks_per_node=g, inter_algorithm=inter_algorithm)
