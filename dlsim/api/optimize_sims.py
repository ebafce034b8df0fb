"""The event simulations `optimize` runs (`dlsim.api.optimize`): which candidates, on how many forked
processes, and one simulation per distinct run.

Which (objective time): in ascending order of the estimate, the `top` best and every later one that
may still beat the fastest simulation so far (`may_win`: the evaluator is held within
`EVALUATOR_TOLERANCE` of the simulation on its validated space, `APPROXIMATE_TOLERANCE` where it flags
what it does not model), at most max(cap, top).

One simulation per run: candidates whose runs are the same task for task (`ScenarioBuilder.runs_as`,
e.g. selective recomputation that recomputes nothing beside no recomputation) share the simulation
of the first of them; each keeps its own strategy in its record (`as_run_of`). The candidates
simulated, their order and their records are those of one simulation per candidate.
"""

from __future__ import annotations

import gc
import math
import multiprocessing as mp
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import replace
from typing import Callable

from dlsim.api.simulate import run_simulation
from dlsim.plan.evaluate import Evaluation
from dlsim.results_sim import SimResult
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.spec.strategy import Strategy

EVALUATOR_TOLERANCE = 0.03
APPROXIMATE_TOLERANCE = 0.12
POOL_MIN_SIMULATIONS = 4
"""Fewer simulations than this run in the calling process (a pool costs more than it saves)."""

RunsAs = Callable[[Strategy], Strategy]

_WORK: list[tuple] = []
"""The simulations a forked pool runs (inherited by the workers: models and clusters hold read-only
mappings that do not pickle); only indices and results cross the process boundary."""


def _simulate_one(i: int) -> SimResult:
    model, cluster, strategy, measured = _WORK[i]
    return run_simulation(model, cluster, strategy, measured=measured).result


def as_run_of(result: SimResult, simulated: Strategy, s: Strategy) -> SimResult:
    """The record of `s`, which runs as `simulated` did (`ScenarioBuilder.runs_as`): `result` with the
    strategy fields in which `s` differs from `simulated`."""
    if s == simulated:
        return result
    mine, theirs = s.to_dict(), simulated.to_dict()
    return replace(result, strategy={**result.strategy, **{k: v for k, v in mine.items() if theirs.get(k) != v}})


def _pool(jobs: int, count: int) -> ProcessPoolExecutor | None:
    """A forked pool of `jobs` workers where there are enough simulations to pay for it."""
    if jobs < 2 or count < POOL_MIN_SIMULATIONS or "fork" not in mp.get_all_start_methods():
        return None
    gc.freeze()  # the workers then leave the inherited heap untouched (no copy-on-write by the collector)
    return ProcessPoolExecutor(max_workers=min(jobs, count), mp_context=mp.get_context("fork"))


def _close(pool: ProcessPoolExecutor | None) -> None:
    if pool is not None:
        pool.shutdown()
        gc.unfreeze()
    _WORK.clear()


def simulate_all(model: Model, cluster: Cluster, chosen: list[Evaluation], measured: bool, jobs: int,
                 runs_as: RunsAs) -> list[SimResult]:
    """The simulations of `chosen` (in order): one per distinct run, on `jobs` forked processes when
    there are enough of them (each simulation is deterministic: the same results either way)."""
    first: dict[Strategy, int] = {}
    reps = [first.setdefault(runs_as(e.strategy), i) for i, e in enumerate(chosen)]
    distinct = sorted(set(reps))
    _WORK[:] = [(model, cluster, chosen[i].strategy, measured) for i in distinct]
    pool = _pool(jobs, len(_WORK))
    try:
        got = list(pool.map(_simulate_one, range(len(_WORK)))) if pool else [_simulate_one(i) for i in range(len(_WORK))]
    finally:
        _close(pool)
    by_rep = dict(zip(distinct, got))
    return [as_run_of(by_rep[r], chosen[r].strategy, e.strategy) for r, e in zip(reps, chosen)]


def may_win(e: Evaluation, best_s: float) -> bool:
    """Whether candidate `e` can still be simulated faster than `best_s`: its simulation is at least
    its estimate / (1 + tolerance) when the estimate is within the tolerance of it."""
    tol = APPROXIMATE_TOLERANCE if e.approximate else EVALUATOR_TOLERANCE
    return e.iteration_time_s < best_s * (1 + tol)


def simulate_by_time(model: Model, cluster: Cluster, evals: list[Evaluation], top: int, cap: int, measured: bool,
                     jobs: int, runs_as: RunsAs, upper: float = math.inf) -> list[tuple[Evaluation, SimResult]]:
    """Objective time: in ascending order of the estimate, the first `top` candidates and every later
    one that may still beat the fastest simulated before it and `upper`, a bound of the simulated
    optimum from the estimates (`dlsim.plan.search.upper_bound`), at most max(cap, top) (`may_win`).

    On `jobs` processes, a free worker takes the next candidate eligible by the simulations finished
    so far (so it may run one the one-by-one rule would have skipped, never skip one it would run);
    the one-by-one rule then keeps exactly the candidates it would have simulated, so that the result
    does not depend on `jobs` or on which simulation finishes first. A candidate that runs as one
    simulated or running (`runs_as`) takes that simulation's result, without a worker, as soon as it
    is there."""
    order = sorted(evals, key=lambda e: (e.iteration_time_s, e.peak_memory_bytes))
    limit = max(cap, top)
    results: dict[int, SimResult] = {}
    rep_of: dict[Strategy, int] = {}  # a run -> the candidate whose simulation it is
    twins: dict[int, list[int]] = {}  # a running simulation -> the candidates waiting for it

    def eligible(j: int, best_s: float) -> bool:
        return j < top or may_win(order[j], best_s)

    def finished(i: int, result: SimResult) -> float:
        results[i] = result
        for t in twins.pop(i, ()):
            results[t] = as_run_of(result, order[i].strategy, order[t].strategy)
        return result.iteration_time_s if result.feasible else math.inf

    _WORK[:] = [(model, cluster, e.strategy, measured) for e in order]
    pool = _pool(jobs, len(order))
    try:
        best, j = upper, 0
        running: dict = {}  # future -> candidate index: a worker takes the next eligible one as soon as it is free
        while True:
            while j < len(order) and len(results) + sum(map(len, twins.values())) + len(running) < limit \
                    and (pool is None or len(running) < jobs):
                if eligible(j, best):
                    rep = rep_of.setdefault(runs_as(order[j].strategy), j)
                    if rep != j and rep in results:
                        best = min(best, finished(j, as_run_of(results[rep], order[rep].strategy, order[j].strategy)))
                    elif rep != j:
                        twins[rep].append(j)
                    elif pool is None:
                        best = min(best, finished(j, _simulate_one(j)))
                    else:
                        twins[j] = []
                        running[pool.submit(_simulate_one, j)] = j
                j += 1
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in done:
                best = min(best, finished(running.pop(f), f.result()))
    finally:
        _close(pool)
    kept, best = [], upper
    for i in sorted(results):
        if len(kept) >= limit:
            break
        if eligible(i, best):
            kept.append((order[i], results[i]))
            if results[i].feasible:
                best = min(best, results[i].iteration_time_s)
    return kept
