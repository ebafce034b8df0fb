"""`comm()`, `comm_sweep()`, `comm_grid()`: price collectives on a profile or on given link parameters.

Records are plain dicts (JSON-ready); `dlsim comm` prints them and `dlsim.report.comm_plots` draws them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from dlsim import units
from dlsim.api.comm_cluster import ClusterGroup
from dlsim.api.limits import check_ranks_limit
from dlsim.api.models import as_cluster
from dlsim.cost.collectives import ALGORITHMS, bus_factor, collective_time, lower_bound, make_costs
from dlsim.cost.collectives.core import check_collective, check_ranks, effective_params, get_algorithm, make_options
from dlsim.cost.collectives.crossover import refine
from dlsim.cost.collectives.registry import applicable
from dlsim.cost.collectives.vectorized import bandwidths, best_of, evaluate, lower_bounds
from dlsim.errors import DlsimError, SpecError
from dlsim.results import Source
from dlsim.spec.cluster import Cluster, LinkTier

SCHEMA_VERSION = 1
UNTYPED = "any (priced by bytes)"   # a collective's time depends on its bytes, not on its element type
_PARAM_KEYS = ("segments", "shards", "fanout", "rounds", "seed", "inter_algorithm", "max_segments", "density",
               "value_bytes")
_SPARSE_KEYS = ("density", "value_bytes")


@dataclass(frozen=True)
class Network:
    """What a collective is priced on: the main link tier, the intra-node tier, γ and ranks per node;
    on a profile, the group of ranks the simulator would price (`dlsim.api.comm_cluster`)."""

    link: LinkTier
    intra: LinkTier | None
    gamma: float | None
    ranks_per_node: int | None
    source: str
    group: ClusterGroup | None = None

    def describe(self, model: str) -> dict[str, Any]:
        costs = make_costs(self.link, gamma=self.gamma, intra=self.intra, model=model)

        def tier(t: LinkTier | None) -> dict[str, Any] | None:
            return None if t is None else {"name": t.name, "latency_s": t.latency, "overhead_s": t.overhead,
                                           "gap_s": t.gap, "bandwidth_bytes_per_s": t.bandwidth,
                                           "burst_bytes": t.burst, "peak_bandwidth_bytes_per_s": t.peak_bandwidth}
        return {"source": self.source, "model": costs.main.model, "link": tier(self.link), "intra": tier(self.intra),
                "alpha_s": costs.main.alpha, "beta_s_per_byte": costs.main.beta,
                "gamma_s_per_byte": self.gamma, "ranks_per_node": self.ranks_per_node}


def network(ranks: int, *, cluster: Cluster | str | Path | None = None, latency: str | float | None = None,
            bandwidth: str | float | None = None, overhead: str | float | None = None, gap: str | float | None = None,
            reduce_bandwidth: str | float | None = None, ranks_per_node: int | None = None,
            burst: str | float | None = None, peak_bandwidth: str | float | None = None) -> Network:
    """A `Network` from a profile (the tier `ranks` ranks cross, γ = 1/reduce_bandwidth) or from link numbers.

    `burst` (a size) and `peak_bandwidth` make the command-line link a token-bucket port (`dlsim.cost.p2p`)."""
    ranks = check_ranks_limit(check_ranks(ranks))
    given = [x is not None for x in (latency, bandwidth, overhead, gap, burst, peak_bandwidth)]
    if cluster is not None and any(given):
        raise SpecError("give a cluster profile or link parameters (--latency/--bandwidth), not both", field="cluster")
    gamma = None
    if reduce_bandwidth is not None:
        rate = units.parse_bandwidth(reduce_bandwidth)
        if rate <= 0:
            raise SpecError("reduce bandwidth must be positive", field="reduce_bandwidth")
        gamma = 1.0 / rate
    if cluster is not None:
        c = as_cluster(cluster)
        per_node = ranks_per_node or min(c.devices_per_node, ranks)
        link = c.tier(ranks, per_node)
        intra = c.intra if link is not c.intra else None
        group = ClusterGroup.of(c, ranks, per_node)
        if reduce_bandwidth is None and c.reduce_bandwidth > 0:
            gamma = 1.0 / c.reduce_bandwidth
        return Network(link, intra, gamma, per_node, c.name, group if reduce_bandwidth is None else None)
    if latency is None or bandwidth is None:
        raise SpecError("give --cluster PROFILE, or --latency and --bandwidth", field="cluster")
    bw = units.parse_bandwidth(bandwidth)
    if bw <= 0:
        raise SpecError("bandwidth must be positive", field="bandwidth")
    peak = units.parse_bandwidth(peak_bandwidth) if peak_bandwidth is not None else float("inf")
    if peak <= 0:
        raise SpecError("peak bandwidth must be positive", field="peak_bandwidth")
    if peak_bandwidth is not None and burst is None:
        raise SpecError("--peak-bandwidth needs --burst", field="peak_bandwidth")
    link = LinkTier("command-line", latency=units.parse_time(latency), bandwidth=bw,
                    overhead=units.parse_time(overhead) if overhead is not None else 0.0,
                    gap=units.parse_time(gap) if gap is not None else 0.0,
                    burst=units.parse_size(burst) if burst is not None else 0.0, peak_bandwidth=peak)
    return Network(link, None, gamma, ranks_per_node, "command line")


def _params(params: dict[str, Any]) -> dict[str, Any]:
    unknown = set(params) - set(_PARAM_KEYS)
    if unknown:
        raise SpecError(f"unknown parameter {sorted(unknown)[0]!r} (use {', '.join(_PARAM_KEYS)})")
    return {k: v for k, v in params.items() if v is not None}


_USED_BY = {"shards": ("parameter-server", "sharded"), "fanout": ("random-peers",), "rounds": ("random-peers",),
            "seed": ("random-peers",), "inter_algorithm": ("hierarchical",), "segments": ("chain", "double-binary-tree"),
            "max_segments": ("chain", "double-binary-tree"),
            "density": ("ssar-recursive-doubling", "ssar-split-allgather", "dsar-split-allgather"),
            "value_bytes": ("ssar-recursive-doubling", "ssar-split-allgather", "dsar-split-allgather")}


def check_params_used(collective: str, names: Sequence[str], params: dict[str, Any], model: str = "auto",
                      link: LinkTier | None = None) -> None:
    """Refuse an algorithm parameter none of the algorithms `names` runs with (it would be ignored)."""
    for key, value in params.items():
        users = _USED_BY.get(key, ())
        if value is not None and users and not set(users) & set(names):
            table = ALGORITHMS.get(collective, {})
            can = [a for a in users if a in table]
            hint = f" (--algorithm {' or '.join(can)})" if can else ""
            which = names[0] if len(names) == 1 else f"{len(names)} candidate algorithms"
            raise SpecError(f"is used by {', '.join(users)} only, not by the {which} of {collective}{hint}", field=key)
    if model == "hockney" and link is not None and (link.overhead or link.gap):
        raise SpecError("the Hockney (alpha-beta) model has no overhead o or gap g; use --model loggp or logp",
                        field="model")


def algorithm_names(collective: str, algorithm: str | Sequence[str]) -> list[str]:
    """`all`, `auto` (the candidates auto chooses among) or names, checked against the collective."""
    table = check_collective(collective)
    if isinstance(algorithm, str):
        if algorithm == "all":
            return list(table)
        if algorithm == "auto":
            return [name for name, algo in table.items() if algo.auto]
        algorithm = [algorithm]
    for name in algorithm:
        if name not in table:
            raise SpecError(f"unknown algorithm {name!r} for {collective} (use {', '.join(table)}, auto or all)",
                            field="algorithm")
    return list(algorithm)


@dataclass(frozen=True)
class AlgorithmTime:
    """One algorithm's price for one collective call (a row of `CommResult.results`)."""

    algorithm: str
    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    source: str
    note: str
    params: dict[str, Any]
    lower_bound_ratio: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "time_s": self.time_s, "algbw_bytes_per_s": self.algbw_bytes_per_s,
                "busbw_bytes_per_s": self.busbw_bytes_per_s, "source": self.source, "note": self.note,
                "params": dict(self.params), "lower_bound_ratio": self.lower_bound_ratio}


@dataclass(frozen=True)
class CommResult:
    """`comm()`: one collective call priced per algorithm, its bus factor and lower bound."""

    collective: str
    size_bytes: float
    ranks: int
    algorithm_requested: str
    network: dict[str, Any]
    bus_factor: float
    lower_bound_s: float
    best: str | None
    results: tuple[AlgorithmTime, ...]
    skipped: tuple[dict[str, str], ...] = ()
    dtype: str = UNTYPED

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "comm", "collective": self.collective, "dtype": self.dtype,
                "size_bytes": self.size_bytes, "ranks": self.ranks, "algorithm_requested": self.algorithm_requested,
                "network": self.network, "bus_factor": self.bus_factor, "lower_bound_s": self.lower_bound_s,
                "best": self.best, "results": [r.to_dict() for r in self.results],
                "skipped": [dict(s) for s in self.skipped]}


@dataclass(frozen=True)
class CommSweep:
    """`comm_sweep()`: times over sizes per algorithm, the best per size and the crossover sizes."""

    collective: str
    ranks: int
    network: dict[str, Any]
    algorithms: tuple[str, ...]
    sizes_bytes: tuple[float, ...]
    times_s: dict[str, list[float]]
    busbw_bytes_per_s: dict[str, list[float]]
    lower_bound_s: tuple[float, ...]
    best: tuple[str, ...]
    best_time_s: tuple[float, ...]
    crossovers: tuple[dict[str, Any], ...]
    pairwise_crossovers: tuple[dict[str, Any], ...]
    dtype: str = UNTYPED

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "comm-sweep", "collective": self.collective,
                "dtype": self.dtype, "ranks": self.ranks, "network": self.network,
                "algorithms": list(self.algorithms), "sizes_bytes": list(self.sizes_bytes),
                "times_s": {a: list(t) for a, t in self.times_s.items()},
                "busbw_bytes_per_s": {a: list(b) for a, b in self.busbw_bytes_per_s.items()},
                "lower_bound_s": list(self.lower_bound_s), "best": list(self.best),
                "best_time_s": list(self.best_time_s), "crossovers": [dict(c) for c in self.crossovers],
                "pairwise_crossovers": [dict(c) for c in self.pairwise_crossovers]}


_NETWORK_KEYWORDS = ("cluster", "latency", "bandwidth", "overhead", "gap", "reduce_bandwidth", "ranks_per_node",
                     "burst", "peak_bandwidth")
_ALGORITHM_KEYWORDS = ("segments", "shards", "fanout", "rounds", "seed", "inter_algorithm", "max_segments", "density",
                       "value_bytes")


def _split_keywords(given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """From a call's keyword values: the network keywords given and the algorithm parameters given
    (checked)."""
    net = {k: given[k] for k in _NETWORK_KEYWORDS if given[k] is not None}
    return net, _params({k: given[k] for k in _ALGORITHM_KEYWORDS})


def comm(collective: str, size: str | float, ranks: int, *, algorithm: str = "auto", model: str = "auto",
         cluster: Cluster | str | Path | None = None, latency: str | float | None = None,
         bandwidth: str | float | None = None, overhead: str | float | None = None, gap: str | float | None = None,
         reduce_bandwidth: str | float | None = None, ranks_per_node: int | None = None,
         burst: str | float | None = None, peak_bandwidth: str | float | None = None,
         segments: int | None = None, shards: int | None = None, fanout: int | None = None,
         rounds: int | None = None, seed: int | None = None, inter_algorithm: str | None = None,
         max_segments: int | None = None, density: float | None = None,
         value_bytes: float | None = None) -> CommResult:
    """Time, algbw, busbw (nccl-tests) and the lower bound of one collective call, per algorithm.

    `algorithm`: a name, `auto` (the cheapest, as NCCL and MPICH choose) or `all`. Network keywords
    as `network()`; algorithm keywords: segments, shards, fanout, rounds, seed, inter_algorithm,
    max_segments; a sparse allreduce's density (nonzeros per rank over elements, SparCML) and
    value_bytes (bytes per value; indices 4 bytes). ``.to_dict()`` is the JSON record of
    ``dlsim comm --json``.
    """
    net_kw, params = _split_keywords(locals())
    net = network(ranks, **net_kw)
    n = units.parse_size(size)
    check_collective(collective)
    options = make_options(ranks_per_node=net.ranks_per_node, **params)
    names = algorithm_names(collective, algorithm)
    check_params_used(collective, names, params, model, net.link if net.source == "command line" else None)
    common = dict(gamma=net.gamma, ranks_per_node=net.ranks_per_node, intra=net.intra, model=model, **params)
    results, skipped = [], []
    simulated = _as_simulated(net, collective, model, params)
    alone: dict[str, float] = {}  # each algorithm's closed form alone on the network (what auto chooses by)
    for name in names:
        algo = ALGORITHMS[collective][name]
        if not applicable(algo, ranks, options):
            if algorithm in ("all", "auto"):
                if algorithm == "all":
                    reason = "needs a power-of-two number of ranks" if algo.needs == "pof2" else \
                        "needs ranks_per_node dividing ranks"
                    skipped.append({"algorithm": name, "reason": reason})
                continue
            get_algorithm(collective, name, ranks, options)         # raises the one-line error
        est = collective_time(collective, name, n, ranks, net.link, **common)
        alone[name] = est.seconds
        if simulated:
            est = net.group.time(collective, name, n) or est
        alg, bus = bandwidths(collective, n, ranks, est.seconds)
        results.append(AlgorithmTime(name, est.seconds, float(alg), float(bus), est.source.value, est.note,
                                      effective_params(collective, name, n, ranks, net.link, **common)))
    bound = lower_bound(collective, n, ranks, net.link, gamma=net.gamma, model=model,
                        ranks_per_node=net.ranks_per_node, intra=net.intra,
                        **{k: v for k, v in params.items() if k in ("shards", "fanout", "rounds") + _SPARSE_KEYS})
    results = [replace(r, lower_bound_ratio=r.time_s / bound if bound > 0 else None) for r in results]
    best = min(results, key=lambda r: r.time_s).algorithm if results else None
    if algorithm == "auto":
        # the simulator's auto, as NCCL's tuner: the cheapest alone on the network (contention priced after)
        best = min(alone, key=alone.__getitem__) if alone else None
        results = [r for r in results if r.algorithm == best]
        if simulated:  # what the simulator's auto prices: the library's own choice where it was measured
            est = net.group.time(collective, "auto", n)
            if est.source is not Source.MODEL:
                alg, bus = bandwidths(collective, n, ranks, est.seconds)
                results = [AlgorithmTime(MEASURED_DEFAULT, est.seconds, float(alg), float(bus), est.source.value,
                                         est.note, {}, est.seconds / bound if bound > 0 else None)]
                best = MEASURED_DEFAULT
    return CommResult(collective, n, ranks, algorithm, net.describe(model), float(bus_factor(collective, ranks)),
                      bound, best, tuple(results), tuple(skipped))


MEASURED_DEFAULT = "default"
"""The row name of a measured time of the library's own algorithm choice (nccl-tests, `calibrate comm`)."""


def _as_simulated(net: Network, collective: str, model: str, params: dict[str, Any]) -> bool:
    """Whether a call is priced as the simulator prices it (`dlsim.api.comm_cluster`): on a profile,
    for a collective the simulator runs, with the model and parameters it uses (a point-to-point
    model or algorithm parameters given on the command line ask for the closed form instead)."""
    return net.group is not None and net.group.priced(collective) and model == "auto" and not params


def parse_sweep(spec: str) -> list[float]:
    """``"1KB:1GB"`` (factor 2) or ``"1KB:1GB:4"``: START, START·FACTOR, ... up to STOP, and STOP itself."""
    parts = str(spec).split(":")
    if len(parts) not in (2, 3):
        raise SpecError(f"sweep must be START:STOP or START:STOP:FACTOR, got {spec!r}", field="sweep")
    start, stop = units.parse_size(parts[0]), units.parse_size(parts[1])
    try:
        factor = float(parts[2]) if len(parts) == 3 else 2.0
    except ValueError:
        raise SpecError(f"sweep factor must be a number, got {parts[2]!r}", field="sweep") from None
    if start <= 0 or stop < start:
        raise SpecError(f"sweep needs 0 < START <= STOP, got {spec!r}", field="sweep")
    if not math.isfinite(factor) or factor <= 1:
        raise SpecError(f"sweep factor must be > 1, got {factor}", field="sweep")
    count = int(math.floor(math.log(stop / start) / math.log(factor) + 1e-9)) + 1
    if count > 100_000:
        raise SpecError(f"sweep has {count} sizes; use a larger factor (at most 100000 sizes)", field="sweep")
    sizes = [start * factor ** i for i in range(count)]
    if sizes[-1] < stop * (1 - 1e-9):
        sizes.append(stop)
    return sizes


def comm_grid(collective: str, sizes: Iterable[float], ranks: Iterable[int], algorithms: str | Sequence[str],
              net: Network, *, model: str = "auto", **params: Any) -> dict[str, np.ndarray]:
    """The vectorised path: seconds per algorithm on the grid sizes × ranks (NaN where not applicable)."""
    names = algorithm_names(collective, algorithms)
    n = np.asarray(list(sizes), dtype=float)[:, None]
    p = np.asarray(list(ranks), dtype=np.int64)[None, :]
    return evaluate(collective, names, n, p, net.link, gamma=net.gamma, intra=net.intra, model=model,
                    ranks_per_node=net.ranks_per_node, **_params(params))


def _crossover(a: str, b: str, lo: float, hi: float, time) -> float:
    def diff(size: float) -> float:
        return time(a, size) - time(b, size)
    try:
        if (diff(lo) < 0) != (diff(hi) < 0):
            return refine(diff, lo, hi)
    except DlsimError:
        pass
    return math.sqrt(lo * hi)


def comm_sweep(collective: str, sweep: str | Sequence[float], ranks: int, *, algorithm: str = "auto",
               model: str = "auto", cluster: Cluster | str | Path | None = None, latency: str | float | None = None,
               bandwidth: str | float | None = None, overhead: str | float | None = None, gap: str | float | None = None,
               reduce_bandwidth: str | float | None = None, ranks_per_node: int | None = None,
               burst: str | float | None = None, peak_bandwidth: str | float | None = None,
               segments: int | None = None, shards: int | None = None, fanout: int | None = None,
               rounds: int | None = None, seed: int | None = None, inter_algorithm: str | None = None,
               max_segments: int | None = None, density: float | None = None,
               value_bytes: float | None = None) -> CommSweep:
    """Times over sizes for every candidate algorithm, the best per size and the crossover sizes
    (keywords as `comm()`; ``.to_dict()`` is the JSON record of ``dlsim comm --sweep --json``)."""
    net_kw, params = _split_keywords(locals())
    net = network(ranks, **net_kw)
    sizes = parse_sweep(sweep) if isinstance(sweep, str) else [units.parse_size(s) for s in sweep]
    names = algorithm_names(collective, algorithm)
    check_params_used(collective, names, params, model, net.link if net.source == "command line" else None)
    grid = comm_grid(collective, sizes, [ranks], names, net, model=model, **params)
    names = [a for a in names if not np.all(np.isnan(grid[a]))]
    if not names:
        raise SpecError(f"no {collective} algorithm applies to {ranks} ranks", field="algorithm")
    common = dict(gamma=net.gamma, ranks_per_node=net.ranks_per_node, intra=net.intra, model=model, **params)
    simulated = _as_simulated(net, collective, model, params) and (
        net.group.measured or (net.link.fabric.shared and net.link is not net.intra))

    def time(name: str, size: float) -> float:
        if simulated:  # as the simulator prices it: measured rows, contention (`dlsim.api.comm_cluster`)
            est = net.group.time(collective, "auto" if name == MEASURED_DEFAULT else name, size)
            if est is not None:
                return est.seconds
        return collective_time(collective, name, size, ranks, net.link, **common).seconds
    if simulated:
        names = names + ([MEASURED_DEFAULT] if algorithm == "auto" and any(
            net.group.time(collective, "auto", x).source is not Source.MODEL for x in sizes) else [])  # type: ignore[union-attr]
        times = {a: np.array([time(a, x) if not np.isnan(grid[a][i, 0]) else np.nan for i, x in enumerate(sizes)])
                 if a in grid else np.array([time(a, x) for x in sizes]) for a in names}
    else:
        times = {a: grid[a][:, 0] for a in names}
    index, best_t = best_of(times, names)
    best = [names[i] for i in index]
    crossovers = []
    for i in range(len(sizes) - 1):
        if best[i] != best[i + 1]:
            at = _crossover(best[i], best[i + 1], sizes[i], sizes[i + 1], time)
            crossovers.append({"size_bytes": at, "from": best[i], "to": best[i + 1]})
    pairwise = []
    for a, b in itertools.combinations(names, 2):
        d = np.sign(times[a] - times[b])
        for i in range(len(sizes) - 1):
            if d[i] != 0 and d[i + 1] != 0 and d[i] != d[i + 1]:
                at = _crossover(a, b, sizes[i], sizes[i + 1], time)
                pairwise.append({"size_bytes": at, "faster_below": b if d[i] > 0 else a,
                                 "faster_above": a if d[i] > 0 else b})
    bounds = lower_bounds(collective, sizes, ranks, net.link, gamma=net.gamma, model=model,
                          ranks_per_node=net.ranks_per_node, intra=net.intra,
                          **{k: v for k, v in params.items() if k in ("shards", "fanout", "rounds") + _SPARSE_KEYS})
    busbw = {a: bandwidths(collective, sizes, ranks, times[a])[1].tolist() for a in names}
    return CommSweep(collective, ranks, net.describe(model), tuple(names), tuple(sizes),
                     {a: times[a].tolist() for a in names}, busbw, tuple(bounds.tolist()), tuple(best),
                     tuple(best_t.tolist()), tuple(crossovers),
                     tuple(sorted(pairwise, key=lambda c: c["size_bytes"])))
