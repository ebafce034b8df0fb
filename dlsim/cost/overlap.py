"""What overlapping communication with computation costs on one device.

Communication kernels share the device's SMs and memory bandwidth with the computation beside
them (NCCL copies every transferred byte through device memory two to three times), so compute
overlapped by communication runs slower by a fraction σ (`Device.overlap_slowdown`; measured 18.9%
on average by Lee et al., arXiv:2507.03114, 2025). A compute run of c seconds beside a
communication of m seconds, both started together:

    overlapped for  o = min(m, c·(1 + σ))   seconds, during which compute progresses at 1/(1 + σ);
    compute ends at c + o·σ/(1 + σ);        exposed communication  max(0, m − c·(1 + σ)).

With σ = 0 this is max(c, m) in total; with m = 0 it is c.
"""

from __future__ import annotations


def overlap_cost(compute: float, comm: float, slowdown: float) -> tuple[float, float]:
    """(extra compute time caused by the overlap, communication time left exposed after it)."""
    stretched = compute * (1.0 + slowdown)
    overlapped = min(comm, stretched)
    return overlapped * slowdown / (1.0 + slowdown), max(0.0, comm - stretched)
