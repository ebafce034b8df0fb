"""Micro-batch plans for a network's convolutions: WR (per-kernel DP) and WD (ILP over desirable sets).

A kernel is one (layer, pass). WR gives every kernel the same workspace limit M and one buffer that
its micro-batches reuse, so the device needs max_k ws_k (one buffer shared by all kernels run one
after another). WD divides one budget M among the kernels, each keeping a private segment, so the
device needs Σ_k ws_k ≤ M. Both are compared with the undivided baseline under the same limit:
the fastest single algorithm per kernel for the whole batch (WD: the ILP restricted to those).
"""

from __future__ import annotations

from typing import Any, Sequence

from dlsim.errors import InfeasibleError
from dlsim.plan.microbatch.configs import Config, Kernel, pareto_front
from dlsim.plan.microbatch.dp import min_feasible_limit, undivided, wr_best, wr_desirable
from dlsim.plan.microbatch.ilp import GAP_REL, wd_ilp
from dlsim.plan.microbatch.policies import batch_sizes
from dlsim.plan.microbatch.records import LayerPlan, MicrobatchPlan, PassPlan
from dlsim.plan.microbatch.table import PASSES, BenchTable, KernelTable
from dlsim.units import format_bytes


def _kernels(table: BenchTable) -> list[KernelTable]:
    return [k for layer in table.layers() for p in PASSES if (k := table.kernel(layer, p)) is not None]


def _source(kernels: Sequence[KernelTable]) -> str:
    kinds = {k.source for k in kernels}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _least(cache: dict, table: KernelTable, batch: int, policy: str) -> float:
    v = _cached(min_feasible_limit, cache, table, batch, policy)
    return float("inf") if v is None else v


def _cached(fn, cache: dict, table: KernelTable, *args):
    key = (fn.__name__, table.rows, *args)
    if key not in cache:
        cache[key] = fn(table, *args)
    return cache[key]


def _assemble(mode, policy, batch, limit, kernels, chosen, baseline, fronts, notes, solver="", optimal=True
              ) -> MicrobatchPlan:
    by_layer: dict[str, list[PassPlan]] = {}
    for k, cfg, base, front in zip(kernels, chosen, baseline, fronts):
        by_layer.setdefault(k.layer, []).append(
            PassPlan(k.pass_name, cfg.kernels, cfg.time_s, cfg.workspace_bytes, base, k.source, tuple(front)))
    combine = max if mode == "wr" else sum
    layers = tuple(LayerPlan(name, tuple(ps), combine(p.workspace_bytes for p in ps)) for name, ps in by_layer.items())
    base_time = None if any(b is None for b in baseline) else sum(b.time_s for b in baseline)
    if base_time is None:
        notes = notes + ("the undivided baseline does not fit this workspace limit",)
    total_ws = combine(c.workspace_bytes for c in chosen) if chosen else 0.0
    return MicrobatchPlan(mode, policy, batch, limit, layers, sum(c.time_s for c in chosen), base_time, total_ws,
                          _source(kernels), solver, optimal, notes)


def plan_wr(table: BenchTable, batch: int, limit: float, policy: str = "powerOfTwo", *, pareto: bool = False,
            notes: tuple[str, ...] = ()) -> MicrobatchPlan:
    """WR: the fastest split of every kernel with each micro-batch's workspace ≤ `limit`."""
    batch_sizes(policy, batch)
    kernels, cache = _kernels(table), {}
    chosen, baseline, fronts = [], [], []
    for k in kernels:
        cfg = _cached(wr_best, cache, k, batch, limit, policy)
        if cfg is None:
            worst = max(_least(cache, kt, batch, policy) for kt in kernels)
            hint = f"; the smallest limit every kernel fits is {format_bytes(worst)} ({worst:.0f} bytes)" \
                if worst != float("inf") else "; some kernel has no measured size that the policy can combine"
            raise InfeasibleError(f"{k.layer} {k.pass_name}: no configuration with policy {policy} fits the "
                                  f"workspace limit {format_bytes(limit)}{hint}")
        chosen.append(cfg)
        baseline.append(_cached(undivided, cache, k, batch, limit))
        fronts.append(_cached(wr_desirable, cache, k, batch, limit, policy) if pareto else [])
    return _assemble("wr", policy, batch, limit, kernels, chosen, baseline, fronts, notes)


def plan_wd(table: BenchTable, batch: int, budget: float, policy: str = "powerOfTwo", *, solver: Any = "cbc",
            time_limit_s: float = 10.0, gap_rel: float = GAP_REL, pareto: bool = False,
            notes: tuple[str, ...] = ()) -> MicrobatchPlan:
    """WD: one configuration per kernel from its desirable set (each capped by `budget`), Σ workspace ≤ budget."""
    batch_sizes(policy, batch)
    kernels, cache = _kernels(table), {}
    fronts = [_cached(wr_desirable, cache, k, batch, budget, policy) for k in kernels]
    names = [f"{k.layer} {k.pass_name}" for k in kernels]
    if any(not f for f in fronts):
        least = sum(_least(cache, k, batch, policy) for k in kernels)
        empty = names[next(i for i, f in enumerate(fronts) if not f)]
        raise InfeasibleError(f"{empty}: no configuration with policy {policy} fits the workspace budget "
                              f"{format_bytes(budget)}; the smallest feasible budget is {format_bytes(least)} "
                              f"({least:.0f} bytes)")
    result = wd_ilp(fronts, budget, solver=solver, time_limit_s=time_limit_s, gap_rel=gap_rel, names=names)
    chosen = [f[c] for f, c in zip(fronts, result.choice)]
    singles = [pareto_front([r for r in k.at(batch) if r.workspace_bytes <= budget]) for k in kernels]
    baseline: list[Kernel | None] = [None] * len(kernels)
    if all(singles) and sum(min(r.workspace_bytes for r in s) for s in singles) <= budget:
        base = wd_ilp([[Config.of([r]) for r in s] for s in singles], budget, solver=solver,
                      time_limit_s=time_limit_s, gap_rel=gap_rel, names=names)
        baseline = [singles[k][c] for k, c in enumerate(base.choice)]
    notes = notes + ((result.note,) if result.note else ())
    return _assemble("wd", policy, batch, budget, kernels, chosen, baseline, fronts if pareto else [[]] * len(kernels),
                     notes, result.solver, result.optimal)
