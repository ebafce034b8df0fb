"""Every collective algorithm dlsim knows: its closed form, its schedule and when it applies."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from dlsim.cost.collectives import alltoall, butterfly, chain, dbt, gossip, hierarchical, ps, ring, sparse, trees
from dlsim.cost.collectives.bits import is_pof2
from dlsim.cost.collectives.costs import Costs
from dlsim.cost.collectives.schedule import Schedule
from dlsim.cost.collectives.segments import MAX_SEGMENTS

COLLECTIVES = ("allreduce", "reduce-scatter", "allgather", "broadcast", "reduce", "all-to-all", "send-recv",
               "push", "pull", "gossip", "sparse-allreduce")


@dataclass(frozen=True)
class Options:
    """Algorithm parameters: pipelining segments (None: chosen for the size), PS shards, gossip
    fan-out/rounds/seed, ranks per node and inter-node algorithm of the hierarchical allreduce; the
    sparse allreduce's density (nonzeros per rank over elements) and item sizes (`sparse.py`)."""

    segments: int | None = None
    max_segments: int = MAX_SEGMENTS
    shards: int = 1
    fanout: int = gossip.DEFAULT_FANOUT
    rounds: int = 1
    seed: int = 0
    ranks_per_node: int | None = None
    inter_algorithm: str = "ring"
    density: float = 1.0
    index_bytes: float = sparse.DEFAULT_INDEX_BYTES
    value_bytes: float = 4.0


TimeFn = Callable[[object, object, Costs, Options], object]
ScheduleFn = Callable[[float, int, Options, "Costs | None"], Schedule]


@dataclass(frozen=True)
class Algorithm:
    """`time(n, p, costs, options)` is vectorised in n and p; `schedule(n, p, options, costs)` is scalar.

    `needs`: "" (any p), "pof2" (p a power of two) or "nodes" (ranks_per_node divides p).
    `auto`: whether `choose_algorithm` considers it (not PS or gossip, which change the hardware or
    the semantics).
    """

    collective: str
    name: str
    time: TimeFn
    schedule: ScheduleFn
    needs: str = ""
    auto: bool = True


def _plain(fn) -> TimeFn:
    return lambda n, p, c, o: fn(n, p, c)


def _plain_schedule(fn) -> ScheduleFn:
    return lambda n, p, o, c: fn(n, p)


def _segments(o: Options, c: Costs | None, n: float, p: int, choose: Callable) -> int:
    if o.segments is not None:
        return o.segments
    return int(choose(n, p, c, o.max_segments)) if c is not None else max(p, 1)


def _chain(collective: str) -> tuple[TimeFn, ScheduleFn]:
    time = lambda n, p, c, o: chain.chain_time(n, p, c, collective, o.segments, o.max_segments)  # noqa: E731
    pick = lambda n, p, c, m: chain.chain_segments(n, p, c, collective, m)  # noqa: E731
    sched = lambda n, p, o, c: chain.chain_schedule(n, p, collective, _segments(o, c, n, p, pick))  # noqa: E731
    return time, sched


def _inter(o: Options) -> Algorithm:
    return ALGORITHMS["allreduce"][o.inter_algorithm]


def _hier_time(n, p, c: Costs, o: Options):
    inner = _inter(o)
    flat = replace(o, ranks_per_node=None)
    return hierarchical.hierarchical_time(n, p, c, o.ranks_per_node, lambda m, q, cc: inner.time(m, q, cc, flat))


def _hier_schedule(n: float, p: int, o: Options, c: Costs | None) -> Schedule:
    inner = _inter(o)
    flat = replace(o, ranks_per_node=None)
    return hierarchical.hierarchical_schedule(n, p, o.ranks_per_node, lambda m, q: inner.schedule(m, q, flat, c),
                                              o.inter_algorithm)


def _sparse(name: str) -> tuple[TimeFn, ScheduleFn]:
    """SparCML's algorithm `name` with the options' density and item sizes (`sparse.py`)."""
    if name == "ssar-recursive-doubling":
        return (lambda n, p, c, o: sparse.recursive_doubling_time(n, p, c, o.density, o.index_bytes, o.value_bytes),
                lambda n, p, o, c: sparse.recursive_doubling_schedule(n, p, o.density, o.index_bytes, o.value_bytes))
    dynamic = name == "dsar-split-allgather"
    return (lambda n, p, c, o: sparse.split_allgather_time(n, p, c, o.density, o.index_bytes, o.value_bytes, dynamic),
            lambda n, p, o, c: sparse.split_allgather_schedule(n, p, o.density, o.index_bytes, o.value_bytes,
                                                               dynamic))


def _dense_candidates(p, o: Options) -> list[Algorithm]:
    return [a for a in ALGORITHMS["allreduce"].values() if a.auto and np.any(applicable(a, p, o))]


def _dense_time(n, p, c: Costs, o: Options):
    """The sparse allreduce switched to dense before it starts: the cheapest dense allreduce of n."""
    best = None
    for a in _dense_candidates(p, o):
        t = np.where(applicable(a, p, o), a.time(n, p, c, o), np.inf)
        best = t if best is None else np.minimum(best, t)
    return best if np.ndim(best) else float(best)


def _dense_schedule(n: float, p: int, o: Options, c: Costs | None) -> Schedule:
    algos = _dense_candidates(p, o)
    best = min(algos, key=lambda a: float(a.time(n, p, c, o))) if c is not None else ALGORITHMS["allreduce"]["ring"]
    return best.schedule(n, p, o, c)


def _table() -> dict[str, dict[str, Algorithm]]:
    t: dict[str, dict[str, Algorithm]] = {c: {} for c in COLLECTIVES}

    def add(collective, name, time, schedule, needs="", auto=True):
        t[collective][name] = Algorithm(collective, name, time, schedule, needs, auto)

    add("allreduce", "ring", _plain(ring.allreduce_time), _plain_schedule(ring.allreduce_schedule))
    add("allreduce", "recursive-doubling", _plain(butterfly.recursive_doubling_allreduce_time),
        _plain_schedule(butterfly.recursive_doubling_allreduce_schedule))
    add("allreduce", "rabenseifner", _plain(butterfly.rabenseifner_allreduce_time),
        _plain_schedule(butterfly.rabenseifner_allreduce_schedule))
    add("allreduce", "binomial-tree", _plain(trees.binomial_allreduce_time),
        _plain_schedule(trees.binomial_allreduce_schedule))
    add("allreduce", "binomial-tree-openmpi", _plain(trees.openmpi_allreduce_time),
        _plain_schedule(trees.openmpi_allreduce_schedule))
    add("allreduce", "chain", *_chain("allreduce"))
    add("allreduce", "double-binary-tree", lambda n, p, c, o: dbt.dbt_node_time(n, p, c, o.segments, o.max_segments),
        lambda n, p, o, c: dbt.dbt_schedule(n, p, _segments(o, c, n, p, dbt.dbt_segments)))
    add("allreduce", "hierarchical", _hier_time, _hier_schedule, needs="nodes")
    add("allreduce", "parameter-server", lambda n, p, c, o: ps.ps_allreduce_time(n, p, c, o.shards),
        lambda n, p, o, c: ps.ps_allreduce_schedule(n, p, o.shards), auto=False)

    add("reduce-scatter", "ring", _plain(ring.reduce_scatter_time), _plain_schedule(ring.reduce_scatter_schedule))
    add("reduce-scatter", "recursive-halving", _plain(butterfly.recursive_halving_reduce_scatter_time),
        _plain_schedule(butterfly.recursive_halving_reduce_scatter_schedule))
    add("reduce-scatter", "hierarchical",
        lambda n, p, c, o: hierarchical.reduce_scatter_time(n, p, c, o.ranks_per_node),
        lambda n, p, o, c: hierarchical.reduce_scatter_schedule(n, p, o.ranks_per_node), needs="nodes")

    add("allgather", "ring", _plain(ring.allgather_time), _plain_schedule(ring.allgather_schedule))
    add("allgather", "recursive-doubling", _plain(butterfly.recursive_doubling_allgather_time),
        _plain_schedule(butterfly.recursive_doubling_allgather_schedule), needs="pof2")
    add("allgather", "bruck", _plain(alltoall.bruck_allgather_time), _plain_schedule(alltoall.bruck_allgather_schedule))
    add("allgather", "hierarchical", lambda n, p, c, o: hierarchical.allgather_time(n, p, c, o.ranks_per_node),
        lambda n, p, o, c: hierarchical.allgather_schedule(n, p, o.ranks_per_node), needs="nodes")

    add("broadcast", "binomial-tree", _plain(trees.binomial_bcast_time), _plain_schedule(trees.binomial_bcast_schedule))
    add("broadcast", "binomial-tree-openmpi", _plain(trees.openmpi_bcast_time),
        _plain_schedule(trees.openmpi_bcast_schedule))
    add("broadcast", "chain", *_chain("broadcast"))
    add("broadcast", "scatter-allgather", _plain(trees.scatter_allgather_bcast_time),
        _plain_schedule(trees.scatter_allgather_bcast_schedule))

    add("reduce", "binomial-tree", _plain(trees.binomial_reduce_time), _plain_schedule(trees.binomial_reduce_schedule))
    add("reduce", "chain", *_chain("reduce"))
    add("reduce", "rabenseifner", _plain(butterfly.rabenseifner_reduce_time),
        _plain_schedule(butterfly.rabenseifner_reduce_schedule))

    add("all-to-all", "pairwise", _plain(alltoall.pairwise_time), _plain_schedule(alltoall.pairwise_schedule))
    add("all-to-all", "linear", _plain(alltoall.linear_time), _plain_schedule(alltoall.linear_schedule))
    add("all-to-all", "bruck", _plain(alltoall.bruck_time), _plain_schedule(alltoall.bruck_schedule))
    add("all-to-all", "hierarchical", lambda n, p, c, o: alltoall.node_aware_time(n, p, c, o.ranks_per_node),
        lambda n, p, o, c: alltoall.node_aware_schedule(n, p, o.ranks_per_node), needs="nodes")

    add("send-recv", "direct", _plain(alltoall.sendrecv_time), _plain_schedule(alltoall.sendrecv_schedule))
    add("push", "sharded", lambda n, p, c, o: ps.push_time(n, p, c, o.shards),
        lambda n, p, o, c: ps.push_schedule(n, p, o.shards))
    add("pull", "sharded", lambda n, p, c, o: ps.pull_time(n, p, c, o.shards),
        lambda n, p, o, c: ps.pull_schedule(n, p, o.shards))
    for name in ("ssar-recursive-doubling", "ssar-split-allgather", "dsar-split-allgather"):
        add("sparse-allreduce", name, *_sparse(name))
    add("sparse-allreduce", "dense-fallback", _dense_time, _dense_schedule)
    add("gossip", "random-peers", lambda n, p, c, o: gossip.gossip_time(n, p, c, o.fanout, o.rounds),
        lambda n, p, o, c: gossip.gossip_schedule(n, p, o.fanout, o.rounds, o.seed))
    return t


ALGORITHMS: dict[str, dict[str, Algorithm]] = _table()


def applicable(algo: Algorithm, p, options: Options):
    """Whether `algo` can run on p ranks (vectorised)."""
    if algo.needs == "pof2":
        return is_pof2(p)
    if algo.needs == "nodes":
        g = options.ranks_per_node
        if g is None:
            return np.zeros(np.shape(p), dtype=bool) if np.ndim(p) else False
        return (np.asarray(p) % g == 0) if np.ndim(p) else p % g == 0
    return np.ones(np.shape(p), dtype=bool) if np.ndim(p) else True
