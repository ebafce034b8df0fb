"""Run-time jitter and stragglers: seeded multiplicative factors on compute task durations.

Each compute (and recompute) task's time is multiplied by a draw with mean 1 and coefficient of
variation cv from the chosen distribution (normal clipped at 0.05; lognormal with
σ² = ln(1 + cv²), μ = −σ²/2; shifted exponential 1 − cv + cv·Exp(1), cv ≤ 1; uniform on
[1 − √3·cv, 1 + √3·cv]), and by its device's slowdown (a seeded choice of ⌈fraction·N⌉ straggler
ranks, or explicit per-rank factors: heterogeneous devices). A simulated device that stands for a
tensor-parallel group moves at the pace of the group's slowest member (the group synchronises at
every layer), so it takes the maximum of the group's draws and slowdowns.
"""

from __future__ import annotations

import math

import numpy as np

from dlsim.plan.taskgraph import COMPUTE, RECOMPUTE, TaskGraph
from dlsim.spec.strategy import Variability


def draw(var: Variability, rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray:
    """Jitter factors with mean 1 and coefficient of variation `var.jitter_cv`."""
    cv = var.jitter_cv
    if var.jitter == "none" or cv == 0:
        return np.ones(size)
    if var.jitter == "normal":
        return np.maximum(1.0 + cv * rng.standard_normal(size), 0.05)
    if var.jitter == "lognormal":
        sigma2 = math.log(1.0 + cv * cv)
        return rng.lognormal(-sigma2 / 2, math.sqrt(sigma2), size)
    if var.jitter == "exponential":
        cv = min(cv, 1.0)
        return 1.0 - cv + cv * rng.exponential(1.0, size)
    if var.jitter == "uniform":
        half = math.sqrt(3.0) * cv
        return np.maximum(rng.uniform(1.0 - half, 1.0 + half, size), 0.05)
    raise ValueError(f"unknown jitter distribution {var.jitter!r}")


def rank_slowdowns(var: Variability, ranks: int) -> dict[int, float]:
    """Slowdown factor of every rank that is slower than nominal."""
    out: dict[int, float] = {}
    if var.straggler_fraction > 0 and var.straggler_slowdown != 1.0:
        count = math.ceil(var.straggler_fraction * ranks)
        chosen = np.random.default_rng([var.seed, 1]).choice(ranks, size=count, replace=False)
        for r in sorted(int(c) for c in chosen):
            out[r] = var.straggler_slowdown
    for rank, factor in var.device_slowdown:
        out[rank] = float(factor)
    return out


def apply_variability(graph: TaskGraph, var: Variability, ranks: int, group_of: dict[int, list[int]]) -> None:
    """Scale compute task durations in place. `group_of[d]` lists the real ranks simulated device d
    stands for along tensor parallelism (its slowest member sets its pace)."""
    if not var.active:
        return
    slow = rank_slowdowns(var, ranks)
    device_factor = [max(slow.get(r, 1.0) for r in group_of[d]) for d in range(len(graph.devices))]
    targets = [t for t in graph.tasks if t.category in (COMPUTE, RECOMPUTE) and t.duration > 0 and t.device >= 0]
    width = max((len(g) for g in group_of.values()), default=1)
    rng = np.random.default_rng([var.seed, 2])
    factors = draw(var, rng, (len(targets), width))
    for row, t in zip(factors, targets):
        f = device_factor[t.device] * float(row[: len(group_of[t.device])].max())
        if t.parts:
            t.parts = tuple((c, s * f if c in (COMPUTE, RECOMPUTE) else s, m * f if c in (COMPUTE, RECOMPUTE) else m)
                            for c, s, m in t.parts)
            t.duration = sum(s for _, s, _ in t.parts)
        else:
            t.duration *= f
