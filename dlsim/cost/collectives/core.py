"""The public functions: price a collective, choose its algorithm, its lower bound, its schedule."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from dlsim.cost.collectives.bounds import node_lower_bound_time
from dlsim.cost.collectives.chain import chain_segments
from dlsim.cost.collectives.dbt import dbt_segments
from dlsim.cost.collectives.costs import Costs, make_costs
from dlsim.cost.collectives.registry import ALGORITHMS, Algorithm, Options, applicable
from dlsim.cost.collectives.replay import replay_steps
from dlsim.cost.collectives.schedule import Schedule
from dlsim.cost.collectives.segments import check_segments
from dlsim.errors import SpecError
from dlsim.results import Estimate, Source
from dlsim.spec.cluster import LinkTier


def check_collective(collective: str) -> dict[str, Algorithm]:
    if collective not in ALGORITHMS:
        raise SpecError(f"unknown collective {collective!r} (use {', '.join(ALGORITHMS)})", field="collective")
    return ALGORITHMS[collective]


def check_ranks(ranks: object) -> int:
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise SpecError(f"ranks must be a positive integer, got {ranks!r}", field="ranks")
    return ranks


def check_size(n_bytes: object) -> float:
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, (int, float)) or not math.isfinite(n_bytes) or n_bytes < 0:
        raise SpecError(f"size must be a finite non-negative number of bytes, got {n_bytes!r}", field="size")
    return float(n_bytes)


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{name} must be a positive integer, got {value!r}", field=name)
    return value


def make_options(*, segments: int | None = None, shards: int = 1, fanout: int = 3, rounds: int = 1, seed: int = 0,
                 ranks_per_node: int | None = None, inter_algorithm: str = "ring",
                 max_segments: int = 1024, density: float = 1.0, index_bytes: float = 4.0,
                 value_bytes: float = 4.0) -> Options:
    """Checked `Options` (one-line SpecError on a bad value)."""
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0 < density <= 1:
        raise SpecError(f"density must be in (0, 1], got {density!r}", field="density")
    for name, value in (("index_bytes", index_bytes), ("value_bytes", value_bytes)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e6:
            raise SpecError(f"{name} must be a positive number of bytes, got {value!r}", field=name)
    if inter_algorithm not in ALGORITHMS["allreduce"] or inter_algorithm in ("hierarchical", "parameter-server"):
        flat = [a for a in ALGORITHMS["allreduce"] if a not in ("hierarchical", "parameter-server")]
        raise SpecError(f"unknown inter-node algorithm {inter_algorithm!r} (use {', '.join(flat)})",
                        field="inter_algorithm")
    return Options(segments=check_segments(segments), max_segments=_positive("max_segments", max_segments),
                   shards=_positive("shards", shards), fanout=_positive("fanout", fanout),
                   rounds=_positive("rounds", rounds), seed=int(seed),
                   ranks_per_node=None if ranks_per_node is None else _positive("ranks_per_node", ranks_per_node),
                   inter_algorithm=inter_algorithm, density=float(density), index_bytes=float(index_bytes),
                   value_bytes=float(value_bytes))


def get_algorithm(collective: str, algorithm: str, ranks: int, options: Options) -> Algorithm:
    """The algorithm entry, checked to apply to `ranks` ranks."""
    table = check_collective(collective)
    if algorithm not in table:
        raise SpecError(f"unknown algorithm {algorithm!r} for {collective} (use {', '.join(table)} or auto)",
                        field="algorithm")
    algo = table[algorithm]
    if not applicable(algo, ranks, options):
        if algo.needs == "pof2":
            raise SpecError(f"{algorithm} {collective} needs a power-of-two number of ranks, got {ranks}",
                            field="ranks")
        raise SpecError(f"{algorithm} {collective} needs ranks_per_node dividing ranks ({ranks}), "
                        f"got {options.ranks_per_node}", field="ranks_per_node")
    return algo


BUCKET_FORMS = {("allreduce", "ring"), ("reduce-scatter", "ring"), ("allgather", "ring"),
                ("allreduce", "recursive-doubling"), ("allreduce", "rabenseifner"),
                ("allreduce", "binomial-tree-openmpi"), ("reduce", "binomial-tree"), ("send-recv", "direct")}
"""Algorithms whose closed form carries a token bucket (`bucket.py`); on a shaped link the others
are priced by replaying their schedule (`replay.replay_steps`, which carries it for any schedule)."""


def _replayed(algo: Algorithm, n, p, costs: Costs, options: Options):
    """`replay_steps` of the schedule at every point (scalar loop: shaped links without a closed form)."""
    def one(size, ranks):
        if size == 0:
            return 0.0
        return replay_steps(algo.schedule(float(size), int(ranks), options, costs), costs)
    if np.ndim(n) == 0 and np.ndim(p) == 0:
        return one(n, p)
    return np.vectorize(one, otypes=[float])(n, p)


def priced(algo: Algorithm, n, p, costs: Costs, options: Options):
    """`algo.time` with nothing to do priced at zero: n = 0, or one rank (except PS push/pull).

    On a token-bucket link (`LinkTier.burst`) algorithms outside `BUCKET_FORMS` are replayed."""
    shaped = costs.main.shaped or costs.intra.shaped
    if shaped and (algo.collective, algo.name) not in BUCKET_FORMS:
        t = _replayed(algo, n, p, costs, options)
    else:
        t = algo.time(n, p, costs, options)
    idle = (n == 0) | ((p == 1) & (algo.collective not in ("push", "pull")))
    return np.where(idle, 0.0, t) if np.ndim(idle) else (0.0 if idle else t)


def choose(collective: str, n_bytes: float, ranks: int, costs: Costs, options: Options) -> str:
    """The cheapest applicable algorithm by closed form (NCCL's rule, `reference/algorithms.md` §3.4)."""
    return _cheapest(collective, n_bytes, ranks, costs, options)[0]


def _cheapest(collective: str, n_bytes: float, ranks: int, costs: Costs, options: Options) -> tuple[str, float]:
    """`choose`'s algorithm and its seconds (`priced`; "" and inf where none applies)."""
    best, best_time = "", math.inf
    for name, algo in check_collective(collective).items():
        if algo.auto and applicable(algo, ranks, options):
            t = float(priced(algo, n_bytes, ranks, costs, options))
            if t < best_time:
                best, best_time = name, t
    return best, best_time


@lru_cache(maxsize=1024)
def _costs(link: LinkTier, gamma, intra: LinkTier | None, model, ranks_per_node: int | None, contention: float) -> Costs:
    """`make_costs`, kept: a sweep or a search prices thousands of calls on a few links."""
    return make_costs(link, gamma=gamma, intra=intra, model=model, ranks_per_node=ranks_per_node,
                      contention=contention)


@lru_cache(maxsize=256)
def _options(ranks_per_node: int | None) -> Options:
    """`make_options` with nothing but the ranks per node given, kept (frozen: safe to share)."""
    return make_options(ranks_per_node=ranks_per_node)


def _prepare(collective, n_bytes, ranks, link, gamma, intra, model, options, contention: float = 1.0):
    check_collective(collective)
    try:
        costs = _costs(link, gamma, intra, model, options.ranks_per_node, contention)
    except TypeError:  # a link built in a script with a list inside: priced, not kept
        costs = make_costs(link, gamma=gamma, intra=intra, model=model, ranks_per_node=options.ranks_per_node,
                           contention=contention)
    return check_size(n_bytes), check_ranks(ranks), costs


def collective_time(collective: str, algorithm: str, n_bytes: float, ranks: int, link: LinkTier, *,
                    gamma: float | None = None, ranks_per_node: int | None = None, intra: LinkTier | None = None,
                    model: str = "auto", contention: float = 1.0, **params) -> Estimate:
    """Model time of one collective call on `ranks` ranks over `link` (source MODEL; note = algorithm).

    `n_bytes` follows nccl-tests: the vector per rank (allreduce, reduce, broadcast), the gathered
    output (allgather), the input per rank (reduce-scatter), each rank's send buffer (all-to-all).
    `gamma` is the reduction cost in seconds per byte (1 / `Cluster.reduce_bandwidth`); `intra` the
    intra-node tier used by the hierarchical algorithm; `params` go to `make_options` (segments,
    shards, fanout, rounds, seed, inter_algorithm). `algorithm="auto"` picks the cheapest (alone on the
    network, as NCCL's tuner does); `contention` ≥ 1 then slows the inter-node bytes of the chosen
    algorithm (`make_costs`; the slowdown of `dlsim.plan.contention`).
    """
    options = make_options(ranks_per_node=ranks_per_node, **params) if params else _options(ranks_per_node)
    n, p, costs = _prepare(collective, n_bytes, ranks, link, gamma, intra, model, options)
    name, seconds = _cheapest(collective, n, p, costs, options) if algorithm == "auto" else (algorithm, math.inf)
    if contention != 1.0:
        costs = make_costs(link, gamma=gamma, intra=intra, model=model, ranks_per_node=options.ranks_per_node,
                           contention=contention)
    algo = get_algorithm(collective, name, p, options)
    if contention != 1.0 or seconds == math.inf:  # else `_cheapest` priced it as below
        seconds = float(priced(algo, n, p, costs, options))
    note = f"{collective} {name} ({costs.main.model})" + (" chosen by auto" if algorithm == "auto" else "")
    return Estimate(seconds, Source.MODEL, note)


def choose_algorithm(collective: str, n_bytes: float, ranks: int, link: LinkTier, *, gamma: float | None = None,
                     ranks_per_node: int | None = None, intra: LinkTier | None = None, model: str = "auto",
                     **params) -> str:
    """The algorithm `auto` uses: the cheapest applicable one by its closed form."""
    options = make_options(ranks_per_node=ranks_per_node, **params)
    n, p, costs = _prepare(collective, n_bytes, ranks, link, gamma, intra, model, options)
    return choose(collective, n, p, costs, options)


def lower_bound(collective: str, n_bytes: float, ranks: int, link: LinkTier, *, gamma: float | None = None,
                model: str = "auto", shards: int = 1, fanout: int = 3, rounds: int = 1,
                ranks_per_node: int | None = None, intra: LinkTier | None = None, **sparse: float) -> float:
    """The lower bound of `bounds.py` for `collective` with the link's α = L + 2o and β = G; with
    `intra` and `ranks_per_node` across nodes, the node-aware bound (NICs and intra-node ports)."""
    check_collective(collective)
    costs = make_costs(link, gamma=gamma, model=model, intra=intra, ranks_per_node=ranks_per_node)
    return float(node_lower_bound_time(collective, check_size(n_bytes), check_ranks(ranks), costs,
                                       shards=shards, fanout=fanout, rounds=rounds, **sparse))


def expand_schedule(collective: str, algorithm: str, n_bytes: float, ranks: int, *, link: LinkTier | None = None,
                    gamma: float | None = None, ranks_per_node: int | None = None, intra: LinkTier | None = None,
                    model: str = "auto", **params) -> Schedule:
    """The point-to-point messages of one call (see `schedule.py` for their meaning).

    Pipelined algorithms need a segment count: given in `params`, or chosen as `collective_time`
    does when `link` is given, else one segment per rank (the survey's "P segments").
    """
    options = make_options(ranks_per_node=ranks_per_node, **params)
    n, p = check_size(n_bytes), check_ranks(ranks)
    costs = make_costs(link, gamma=gamma, intra=intra, model=model,
                       ranks_per_node=ranks_per_node) if link is not None else None
    if algorithm == "auto":
        if costs is None:
            raise SpecError("algorithm auto needs a link to choose by", field="algorithm")
        algorithm = choose(collective, n, p, costs, options)
    algo = get_algorithm(collective, algorithm, p, options)
    if n == 0 or (p == 1 and collective not in ("push", "pull")):
        return Schedule(collective, algorithm, n, p, ())
    return algo.schedule(n, p, options, costs)


def effective_params(collective: str, algorithm: str, n_bytes: float, ranks: int, link: LinkTier, *,
                     gamma: float | None = None, ranks_per_node: int | None = None, intra: LinkTier | None = None,
                     model: str = "auto", **params) -> dict[str, object]:
    """The parameters an algorithm runs with, segments included when they are chosen for the size."""
    options = make_options(ranks_per_node=ranks_per_node, **params)
    n, p, costs = _prepare(collective, n_bytes, ranks, link, gamma, intra, model, options)
    out: dict[str, object] = {}
    if algorithm == "chain":
        out["segments"] = options.segments or int(chain_segments(n, p, costs, collective, options.max_segments))
    elif algorithm == "double-binary-tree":
        if costs.spans(p):
            out["segments"] = options.segments or int(dbt_segments(n, p // costs.ranks_per_node, _node(costs),
                                                                   options.max_segments))
            out["across_nodes"] = f"{p // costs.ranks_per_node} nodes x {costs.ranks_per_node} (chain inside)"
        else:
            out["segments"] = options.segments or (int(dbt_segments(n, p, costs, options.max_segments))
                                                   if p > 1 else 1)
    elif algorithm in ("parameter-server", "sharded"):
        out["shards"] = options.shards
    elif algorithm == "random-peers":
        out.update(fanout=options.fanout, rounds=options.rounds)
    elif algorithm == "hierarchical":
        out.update(ranks_per_node=options.ranks_per_node)
        if collective == "allreduce":
            out.update(inter_algorithm=options.inter_algorithm)
    elif costs.spans(p) and algorithm == "ring":
        out["across_nodes"] = f"{p // costs.ranks_per_node} nodes x {costs.ranks_per_node} (node-contiguous)"
    return out


def _node(costs: Costs) -> Costs:
    return Costs(costs.node, costs.intra, costs.gamma)
