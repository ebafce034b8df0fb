"""The survey's allreduce formulas, in its own notation (S002 §2.5; seeds-inventory §3.1–3.2).

The survey (Ben-Nun & Hoefler) uses a simplified LogP model with o = g = 0: L the latency, G the
cost per byte, P the machines, m the number of values and γ the **size of one value in bytes**.
That γ is not the reduction-compute γ of Dryden's α-β-γ model (seconds per byte, used everywhere
else in dlsim; seeds-inventory §14 item 5), so here it is called `elem_bytes`:

    T_tree = 2·log2(P)·(L + γmG)
    T_bfly = log2(P)·(L + γmG)
    T_pipe = 2(P−1)·(L + γ(m/P)G)
    T_rabe = 2L·log2(P) + 2γmG(P−1)/P
    T ≥ L·log2(P) + 2γmG(P−1)/P          (lower bound without redundant computation, Chan et al. 2007)

For P a power of two these equal dlsim's binomial-tree, recursive-doubling, ring and Rabenseifner
closed forms with Hockney α = L, β = G, n = γm bytes and free reductions (a test checks it).
"""

from __future__ import annotations

import math

SURVEY_ALGORITHMS = {"tree": "binomial-tree", "butterfly": "recursive-doubling", "pipeline": "ring",
                     "rabenseifner": "rabenseifner"}
"""Survey name -> dlsim allreduce algorithm."""


def survey_allreduce_time(algorithm: str, values: float, elem_bytes: float, P: int, L: float, G: float) -> float:
    """T_tree, T_bfly, T_pipe or T_rabe of the survey for m = `values` values of `elem_bytes` bytes."""
    lg, n = math.log2(P), elem_bytes * values
    if algorithm == "tree":
        return 2 * lg * (L + n * G)
    if algorithm == "butterfly":
        return lg * (L + n * G)
    if algorithm == "pipeline":
        return 2 * (P - 1) * (L + n / P * G)
    if algorithm == "rabenseifner":
        return 2 * L * lg + 2 * n * G * (P - 1) / P
    raise ValueError(f"unknown survey algorithm {algorithm!r} (use {', '.join(SURVEY_ALGORITHMS)})")


def survey_lower_bound(values: float, elem_bytes: float, P: int, L: float, G: float) -> float:
    """L·log2(P) + 2γmG(P−1)/P."""
    return L * math.log2(P) + 2 * elem_bytes * values * G * (P - 1) / P
