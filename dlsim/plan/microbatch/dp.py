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

import numpy as np

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
class _Front:
    """A Pareto front of configurations of b samples as arrays: workspace, time, micro-batch count, and how
    each was built (head kernel: size, index into that size's singles; tail: index into front[b − size])."""

    ws: np.ndarray
    t: np.ndarray
    count: np.ndarray
    head_size: np.ndarray
    head_index: np.ndarray
    tail: np.ndarray


def _pareto_arrays(ws, t, count, *rest) -> tuple:
    """Keep the non-dominated entries (workspace ascending, time strictly descending); ties in
    (workspace, time) keep the one with fewer micro-batches (then the first)."""
    order = np.lexsort((count, t, ws))
    ts = t[order]
    keep = np.ones(len(order), dtype=bool)
    if len(order) > 1:
        keep[1:] = ts[1:] < np.minimum.accumulate(ts)[:-1]
    idx = order[keep]
    return (ws[idx], t[idx], count[idx]) + tuple(r[idx] for r in rest)


def wr_desirable(table: KernelTable, batch: int, limit: float, policy: str = "powerOfTwo") -> list[Config]:
    """The desirable set: every Pareto-optimal (workspace, time) configuration of the whole batch whose
    micro-batches each fit `limit`, workspace ascending. Empty if nothing fits.

    Fronts are NumPy arrays: for each b, every (single kernel of size b1 ≤ b/2) × (front of b − b1) pair
    is formed at once (time sum, workspace max) and pruned, with back-pointers to rebuild the lists.
    """
    sizes = batch_sizes(policy, batch)
    singles = _singles(table, sizes, limit)
    small = [b for b in sizes if b in singles]
    width = max((len(ks) for ks in singles.values()), default=0)
    kw = np.full((batch + 1, max(width, 1)), INF)
    kt = np.full((batch + 1, max(width, 1)), INF)
    for b, ks in singles.items():
        kw[b, :len(ks)] = [k.workspace_bytes for k in ks]
        kt[b, :len(ks)] = [k.time_s for k in ks]
    fronts: list[_Front | None] = [None] * (batch + 1)
    for b in range(1, batch + 1):
        parts = []
        if b in singles:
            n = len(singles[b])
            parts.append((kw[b, :n], kt[b, :n], np.ones(n, dtype=np.int64), np.full(n, b), np.arange(n),
                          np.full(n, -1)))
        heads = [b1 for b1 in small if b1 <= b // 2 and fronts[b - b1] is not None]
        if heads:   # every (head kernel of size b1) x (front of b - b1) pair at once
            tails = [fronts[b - b1] for b1 in heads]
            label = np.concatenate([np.full(len(f.ws), b1) for b1, f in zip(heads, tails)])
            r_ws = np.concatenate([f.ws for f in tails])
            ws = np.maximum(kw[label], r_ws[:, None])
            t = kt[label] + np.concatenate([f.t for f in tails])[:, None]
            ok = np.isfinite(t)
            rows, cols = np.nonzero(ok)
            parts.append((ws[ok], t[ok], np.concatenate([f.count for f in tails])[rows] + 1, label[rows], cols,
                          np.concatenate([np.arange(len(f.ws)) for f in tails])[rows]))
        if parts:
            fronts[b] = _Front(*_pareto_arrays(*(np.concatenate(col) for col in zip(*parts))))
    top = fronts[batch]
    if top is None:
        return []
    configs = []
    for i in range(len(top.ws)):
        kernels, b, j = [], batch, i
        while j >= 0:
            f = fronts[b]
            hb = int(f.head_size[j])
            kernels.append(singles[hb][int(f.head_index[j])])
            b, j = b - hb, int(f.tail[j])
        configs.append(Config.of(kernels))
    return configs


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
