"""Which flows of a collective run at once: its traffic patterns, for pricing it on a shared network.

A pattern is a set of concurrent flows between group members (indices 0..p−1) and the weight of
the steps it stands for (their bytes per flow, summed). On a network whose links concurrent flows
share (`dlsim.cost.fabric`), each pattern's flows (and those of the group's concurrent copies) get
max-min fair rates; a pattern is slowed by s = max_f c_f / r_f (`dlsim.cost.fairshare.slowdown`),
and the collective's bandwidth term by the weighted mean

    S = Σ_k w_k·s_k / Σ_k w_k

which is exact for the Hockney form Σ_k (α + w_k·β·s_k) of a lock-step algorithm (each step's
slowest flow sets its time) and for a pipelined one in steady state (one pattern).

* ring (allreduce, reduce-scatter, allgather): one pattern, member i → i + 1 mod p. Across nodes
  (g ≥ 2 members per node, node-contiguous, `Costs.spans`) its inter-node hops are node flows at
  B_node = min(g·B_dev, B_intra) spread over the node's g members' NICs (`node=True`).
* hierarchical: the inter-node part only, g rings (or the inner algorithm's patterns), one per
  local index, each flow at B_dev.
* chain: its steady state, every hop i → i + 1 at once.
* double binary tree: its steady state, every edge of both trees both ways at once; across nodes the
  trees join nodes (node flows), as NCCL builds them.
* all-to-all: pairwise, p − 1 patterns (in step k rank i sends to i + k); linear, every pair at once;
  node-aware, every pair on different nodes at once (each sender's flows share its port); at most
  `MAX_FLOWS` flows.
* every other algorithm: the steps of its schedule (`schedule.py`), each step a pattern weighted by
  its largest message; built only for schedules of at most `MAX_MESSAGES` messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from dlsim.cost.collectives.dbt import dbt_layout
from dlsim.cost.collectives.schedule import Schedule

MAX_MESSAGES = 20_000
"""Largest schedule read step by step for its patterns (larger ones are not priced for contention)."""

MAX_FLOWS = 300_000
"""Most flows an all-to-all's patterns hold, all patterns together (p(p − 1): up to 548 ranks)."""


@dataclass(frozen=True)
class Pattern:
    """Concurrent flows (src member, dst member), the bytes per flow of the steps they stand for, and
    whether each inter-node pair is one node flow over the group's NICs on that node (`node`)."""

    weight: float
    pairs: tuple[tuple[int, int], ...]
    node: bool = False


def ring_pairs(p: int) -> tuple[tuple[int, int], ...]:
    return tuple((i, (i + 1) % p) for i in range(p)) if p > 1 else ()


def _tree_edges(p: int) -> tuple[tuple[int, int], ...]:
    edges, _, _ = dbt_layout(p)
    out = []
    for _, child, parent, _, _ in edges:
        out += [(child, parent), (parent, child)]
    return tuple(out)


def _across(p: int, g: int | None) -> bool:
    return g is not None and g >= 2 and p % g == 0 and p >= 2 * g


def patterns(collective: str, algorithm: str, p: int, g: int | None, schedule_of: Callable,
             inner: str = "ring") -> list[Pattern] | None:
    """The patterns of `algorithm` for `collective` on p members, g per node (None: not node-aware),
    or None when they are not known (a schedule over `MAX_MESSAGES`). `schedule_of(collective,
    algorithm, p)` builds a schedule for the generic case; `inner` is the hierarchical allreduce's
    inter-node algorithm."""
    if p < 2:
        return []
    node = _across(p, g)
    if algorithm == "ring":
        return [Pattern(1.0, ring_pairs(p), node)]
    if algorithm == "chain":
        return [Pattern(1.0, tuple((i, i + 1) for i in range(p - 1)))]
    if algorithm == "double-binary-tree":
        if node:
            return [Pattern(1.0, tuple((a * g, b * g) for a, b in _tree_edges(p // g)), True)]
        return [Pattern(1.0, _tree_edges(p))]
    if collective == "all-to-all" and algorithm in ("pairwise", "linear", "hierarchical"):
        if p * (p - 1) > MAX_FLOWS:
            return None
        if algorithm == "pairwise":  # step k: i sends to i + k
            return [Pattern(1.0, tuple((i, (i + k) % p) for i in range(p))) for k in range(1, p)]
        if algorithm == "linear":    # every send posted at once
            return [Pattern(1.0, tuple((i, j) for i in range(p) for j in range(p) if j != i))]
        if g is not None and p % g == 0:  # node-aware: every send to another node at once
            return [Pattern(1.0, tuple((i, j) for i in range(p) for j in range(p) if j // g != i // g))]
    if algorithm == "hierarchical" and collective in _SPLIT and g is not None and p % g == 0:
        nodes = p // g
        if collective == "allreduce" and inner != "ring":
            sub = patterns(collective, inner, nodes, None, schedule_of)
            return None if sub is None else spread(sub, nodes, g)
        return spread([Pattern(1.0, ring_pairs(nodes))], nodes, g)
    return schedule_patterns(schedule_of(collective, algorithm, p), p)


_SPLIT = ("allreduce", "reduce-scatter", "allgather")


def schedule_patterns(s: Schedule | None, p: int) -> list[Pattern] | None:
    """Every step of a schedule as one pattern, weighted by its largest message (module doc); None for
    a schedule over `MAX_MESSAGES` or with participants beyond the group's p ranks (a parameter
    server's)."""
    if s is None or len(s.messages) > MAX_MESSAGES or s.ranks > p:
        return None
    out = []
    for step in s.steps:
        msgs = [s.messages[i] for i in step if not s.messages[i].intra]
        if msgs:
            out.append(Pattern(max(m.nbytes for m in msgs), tuple((m.src, m.dst) for m in msgs)))
    return out


def spread(pats: list[Pattern], members: int, copies: int) -> list[Pattern]:
    """Patterns over `members` ranks repeated for `copies` interleaved groups (member m of copy c is
    c + copies·m): the hierarchical algorithms' per-local-index groups across nodes."""
    return [Pattern(pt.weight, tuple((a * copies + c, b * copies + c) for c in range(copies) for a, b in pt.pairs),
                    pt.node) for pt in pats]
