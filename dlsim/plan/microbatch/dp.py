"""WR (workspace reuse): μ-cuDNN's dynamic programme over micro-batch splits of one layer-pass.

Oyama, Ben-Nun, Hoefler & Matsuoka, "Accelerating Deep Learning Frameworks with Micro-batches",
IEEE CLUSTER 2018, §III (code: spcl/ucudnn src/optimizer.cpp ``getDesirableConvConfigs``); the
survey's slide (S003 L4434-4765):

    T(b) = min( min_{a: ws(a,b) ≤ M} t(a, b)                                [b ∈ S],
                min_{b1 ∈ S, 1 ≤ b1 ≤ ⌊b/2⌋} ( min_{a: ws(a,b1) ≤ M} t(a, b1) + T(b − b1) ) )

The first micro-batch only ranges up to ⌊b/2⌋: any split into two or more parts has a part no larger
than b/2, and a split's (Σ time, max workspace) does not depend on the order. Best mode keeps one
configuration per b (scalar DP, O(B·|S|)); desirable mode keeps the whole Pareto front per b (the
input of the WD ILP): combining (sum, max) never turns a dominated tail into a non-dominated one, so
pruning to fronts is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlsim.plan.microbatch.configs import Config, Kernel, pareto_front
from dlsim.plan.microbatch.policies import batch_sizes
from dlsim.plan.microbatch.table import KernelTable

INF = float("inf")
_REL = 1e-12


def _better(c: tuple, cand: tuple | None) -> bool:
    """Smaller time; times equal up to rounding (1e-12 relative) → smaller workspace, then fewer micro-batches."""
    if cand is None:
        return True
    if abs(c[0] - cand[0]) > _REL * max(abs(c[0]), abs(cand[0])):
        return c[0] < cand[0]
    return c[1:3] < cand[1:3]


def _singles(table: KernelTable, sizes: tuple[int, ...], limit: float) -> dict[int, list[Kernel]]:
    """Per allowed size, the Pareto front of single kernels that fit the limit."""
    out = {}
    allowed = set(sizes)
    by_size: dict[int, list[Kernel]] = {}
    for r in table.rows:
        if r.size in allowed and r.workspace_bytes <= limit:
            by_size.setdefault(r.size, []).append(r)
    for b, ks in by_size.items():
        out[b] = pareto_front(ks)
    return out


def undivided(table: KernelTable, batch: int, limit: float) -> Kernel | None:
    """The fastest single kernel for the whole batch within `limit` (plain cuDNN under the same limit)."""
    fits = [r for r in table.rows if r.size == batch and r.workspace_bytes <= limit]
    return min(fits, key=lambda r: (r.time_s, r.workspace_bytes, r.algorithm)) if fits else None


def wr_best(table: KernelTable, batch: int, limit: float, policy: str = "powerOfTwo") -> Config | None:
    """The fastest configuration of the whole batch whose every micro-batch fits `limit`; None if none does."""
    sizes = batch_sizes(policy, batch)
    fastest = {b: min(ks, key=lambda k: (k.time_s, k.workspace_bytes, k.algorithm))
               for b, ks in _singles(table, sizes, limit).items()}
    small = [b for b in sizes if b in fastest]
    # state per b: (time, workspace, count, first kernel, rest b)
    best: list[tuple | None] = [None] * (batch + 1)
    for b in range(1, batch + 1):
        cand = None
        if b in fastest:
            k = fastest[b]
            cand = (k.time_s, k.workspace_bytes, 1, k, 0)
        for b1 in small:
            if b1 > b // 2:
                break
            rest = best[b - b1]
            if rest is None:
                continue
            k = fastest[b1]
            c = (k.time_s + rest[0], max(k.workspace_bytes, rest[1]), rest[2] + 1, k, b - b1)
            if _better(c, cand):
                cand = c
        best[b] = cand
    if best[batch] is None:
        return None
    kernels, b = [], batch
    while b:
        state = best[b]
        kernels.append(state[3])
        b = state[4]
    return Config.of(kernels)


@dataclass(frozen=True)
class _Node:
    """A configuration under construction: head kernel plus a tail node (a linked list)."""

    time_s: float
    workspace_bytes: float
    head: Kernel
    tail: "_Node | None"
    count: int

    def key(self) -> tuple:
        return (self.count, self.head.size, self.head.algorithm)

    def kernels(self) -> list[Kernel]:
        out, node = [], self
        while node is not None:
            out.append(node.head)
            node = node.tail
        return out


def wr_desirable(table: KernelTable, batch: int, limit: float, policy: str = "powerOfTwo") -> list[Config]:
    """The desirable set: every Pareto-optimal (workspace, time) configuration of the whole batch whose
    micro-batches each fit `limit`, workspace ascending. Empty if nothing fits."""
    sizes = batch_sizes(policy, batch)
    singles = _singles(table, sizes, limit)
    small = [b for b in sizes if b in singles]
    fronts: list[list[_Node]] = [[] for _ in range(batch + 1)]
    for b in range(1, batch + 1):
        cands = [_Node(k.time_s, k.workspace_bytes, k, None, 1) for k in singles.get(b, ())]
        for b1 in small:
            if b1 > b // 2:
                break
            rest = fronts[b - b1]
            for k in singles[b1]:
                for r in rest:
                    cands.append(_Node(k.time_s + r.time_s, max(k.workspace_bytes, r.workspace_bytes), k, r,
                                       r.count + 1))
        fronts[b] = pareto_front(cands, key=_Node.key)
    return [Config.of(node.kernels()) for node in fronts[batch]]


def min_feasible_limit(table: KernelTable, batch: int, policy: str = "powerOfTwo") -> float | None:
    """The smallest per-kernel workspace limit under which some split of the batch runs (bottleneck DP:
    W(b) = min(ws_min(b), min_{b1 ≤ b/2} max(ws_min(b1), W(b − b1)))); None if no split exists at all."""
    sizes = batch_sizes(policy, batch)
    least = {}
    for r in table.rows:
        if r.size in sizes:
            least[r.size] = min(least.get(r.size, INF), r.workspace_bytes)
    small = [b for b in sizes if b in least]
    w = [INF] * (batch + 1)
    for b in range(1, batch + 1):
        v = least.get(b, INF)
        for b1 in small:
            if b1 > b // 2:
                break
            v = min(v, max(least[b1], w[b - b1]))
        w[b] = v
    return None if w[batch] == INF else w[batch]
