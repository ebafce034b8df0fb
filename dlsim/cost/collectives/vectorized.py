"""Many (size, ranks, algorithm) points at once: the closed forms on NumPy arrays.

Every closed form in this package is written with NumPy operations, so one call prices a whole grid;
the double binary tree is evaluated once per distinct rank count. Points where an algorithm does
not apply (recursive-doubling allgather on a rank count that is not a power of two, hierarchical
without a dividing ranks_per_node) are NaN.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from dlsim.cost.collectives.bounds import bus_factor, node_lower_bound_time
from dlsim.cost.collectives.core import check_collective, make_options, priced
from dlsim.cost.collectives.costs import make_costs
from dlsim.cost.collectives.registry import applicable
from dlsim.errors import SpecError
from dlsim.spec.cluster import LinkTier


def _arrays(sizes, ranks) -> tuple[np.ndarray, np.ndarray]:
    n = np.asarray(sizes, dtype=float)
    p = np.asarray(ranks)
    if not np.all(np.isfinite(n)) or np.any(n < 0):
        raise SpecError("sizes must be finite non-negative numbers of bytes", field="size")
    if p.dtype.kind not in "iu" or np.any(p < 1):
        raise SpecError("ranks must be positive integers", field="ranks")
    return np.broadcast_arrays(n, p.astype(np.int64))


def evaluate(collective: str, algorithms: Iterable[str] | None, sizes, ranks, link: LinkTier, *,
             gamma: float | None = None, intra: LinkTier | None = None, model: str = "auto",
             ranks_per_node: int | None = None, **params) -> dict[str, np.ndarray]:
    """Time in seconds of each algorithm at every point of broadcast(sizes, ranks); NaN = not applicable.

    `algorithms=None` means every algorithm of the collective.
    """
    table = check_collective(collective)
    names = list(table) if algorithms is None else list(algorithms)
    for name in names:
        if name not in table:
            raise SpecError(f"unknown algorithm {name!r} for {collective} (use {', '.join(table)})", field="algorithm")
    options = make_options(ranks_per_node=ranks_per_node, **params)
    costs = make_costs(link, gamma=gamma, intra=intra, model=model, ranks_per_node=ranks_per_node)
    n, p = _arrays(sizes, ranks)
    out = {}
    for name in names:
        algo = table[name]
        ok = np.asarray(applicable(algo, p, options), dtype=bool)
        times = np.full(n.shape, np.nan)
        if ok.any():
            times[ok] = priced(algo, n[ok], p[ok], costs, options)
        out[name] = times
    return out


def best_of(times: dict[str, np.ndarray], candidates: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """(index into `candidates`, time) of the fastest algorithm at every point (ignoring NaN)."""
    names = list(candidates)
    stack = np.stack([times[name] for name in names])
    filled = np.where(np.isnan(stack), np.inf, stack)
    index = np.argmin(filled, axis=0)
    return index, np.take_along_axis(filled, index[None], axis=0)[0]


def bandwidths(collective: str, sizes, ranks, seconds) -> tuple[np.ndarray, np.ndarray]:
    """nccl-tests algbw = n / t and busbw = algbw × factor (bytes/s; 0 where t = 0)."""
    n, p = _arrays(sizes, ranks)
    t = np.asarray(seconds, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        alg = np.where(t > 0, n / np.where(t > 0, t, 1.0), 0.0)
    return alg, alg * bus_factor(collective, p)


def lower_bounds(collective: str, sizes, ranks, link: LinkTier, *, gamma: float | None = None, model: str = "auto",
                 shards: int = 1, fanout: int = 3, rounds: int = 1, ranks_per_node: int | None = None,
                 intra: LinkTier | None = None, **sparse: float) -> np.ndarray:
    """`bounds.node_lower_bound_time` at every point (node-aware with `intra` and `ranks_per_node`;
    `sparse`: a sparse allreduce's density and item sizes)."""
    n, p = _arrays(sizes, ranks)
    costs = make_costs(link, gamma=gamma, model=model, intra=intra, ranks_per_node=ranks_per_node)
    return np.asarray(node_lower_bound_time(collective, n, p, costs, shards=shards, fanout=fanout,
                                            rounds=rounds, **sparse), dtype=float)
