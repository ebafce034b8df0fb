"""`optimize()`: which strategy, and why. The search space (`dlsim.plan.search`) is weighed by the
analytic evaluator (`dlsim.plan.evaluate`); the best candidates are simulated event by event
(`dlsim.api.simulate`) and the ranking is the simulation's.

Which candidates are simulated (objective time): in ascending order of the estimate, the `top`
best and every later one whose estimate is below (1 + tolerance) × the fastest simulation so far,
and below (1 + tolerance) × the least estimate / (1 − tolerance) of a candidate sure to fit: the
evaluator is held within `EVALUATOR_TOLERANCE` of the simulation on its validated space, so a
candidate whose estimate exceeds either cannot be simulated faster than the optimum; candidates
outside that space (`Evaluation.approximate`) get the wider `APPROXIMATE_TOLERANCE`; at most
`max_simulations` in all (`dlsim.api.optimize_sims`, which simulates candidates that run alike
once). The search does not time a candidate whose lower bound already puts it beyond that
(`dlsim.plan.search.Prune`).
Objective memory: the `top` best by estimated memory and those within the tolerance band of the
best estimate.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from dlsim.api.gcpause import paused_gc
from dlsim.api.limits import check_batch_limit, check_nodes_limit
from dlsim.api.models import as_cluster, as_model, check_dtype
from dlsim.api.optimize_sims import APPROXIMATE_TOLERANCE, EVALUATOR_TOLERANCE, simulate_all, simulate_by_time
from dlsim.api.simulate import default_pricers, kernel_tables
from dlsim.api.stacks import apply_stack, choose_stack, stack_record
from dlsim.errors import InfeasibleError, SpecError
from dlsim.plan.scenario import ScenarioBuilder
from dlsim.plan.evaluate import Evaluation, Evaluator
from dlsim.plan.search import OUT_OF_MEMORY, SEARCHED, Prune, SearchSpace, search, upper_bound
from dlsim.results import SCHEMA_VERSION
from dlsim.results_sim import SimResult
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.spec.strategy import DEFAULT_BUCKET_BYTES, OFFLOADS, Strategy
from dlsim.units import format_bytes

OBJECTIVES = ("time", "memory", "time-to-train", "cost", "energy")
"""time-to-train, cost, energy: the candidates simulated as for time, ranked by the whole run
(`dlsim.api.run_rank`: failures, checkpoints, energy, prices)."""
MAX_JOBS = 8


def _band(tol: float) -> float:
    """A candidate whose estimate exceeds the best estimate by more than this factor cannot be the
    simulated optimum when both estimates are within `tol` of their simulations."""
    return (1 + tol) / (1 - tol)


@dataclass(frozen=True)
class Candidate:
    """One simulated candidate: its strategy, the evaluator's estimate and the simulation."""

    strategy: Strategy
    estimate: Evaluation
    result: SimResult
    equivalents: tuple[str, ...] = ()
    """Labels of simulated candidates that ran exactly alike (the field they change does nothing
    here, e.g. selective recomputation beside flash attention), collapsed into this one."""

    @property
    def time_s(self) -> float:
        return self.result.iteration_time_s

    @property
    def memory_bytes(self) -> float:
        return self.result.peak_memory_bytes

    def key(self, objective: str) -> tuple:
        if objective == "memory":
            return (not self.result.feasible, self.memory_bytes, self.time_s)
        return (not self.result.feasible, self.time_s, self.memory_bytes)

    def row(self, rank: int) -> dict[str, Any]:
        r, e = self.result, self.estimate
        b = r.breakdown.to_dict()
        mem = max(r.devices, key=lambda d: d.peak_memory_bytes) if r.devices else None
        return {"rank": rank, "strategy": strategy_fields(self.strategy), "label": label(self.strategy),
                "equivalents": list(self.equivalents),
                "feasible": r.feasible, "infeasible_reason": r.infeasible_reason,
                "iteration_time_s": r.iteration_time_s, "throughput_samples_per_s": r.throughput_samples_per_s,
                "breakdown_s": b, "peak_memory_bytes": r.peak_memory_bytes,
                "memory_bytes": dict(mem.memory) if mem else {},
                "capacity_bytes": mem.capacity_bytes if mem else 0.0,
                "estimate": {"iteration_time_s": e.iteration_time_s, "peak_memory_bytes": e.peak_memory_bytes,
                             "error": e.iteration_time_s / r.iteration_time_s - 1 if r.iteration_time_s else None,
                             "approximate": list(e.approximate)}}


def strategy_fields(s: Strategy) -> dict[str, Any]:
    """The searched fields of a strategy."""
    d = s.to_dict()
    return {k: d[k] for k in SEARCHED}


def label(s: Strategy) -> str:
    """A short name: dp2 tp4 pp2 mbs1x8 1f1b sp sel z1."""
    parts = [f"dp{s.dp}", f"tp{s.tp}", f"pp{s.pp}", f"mbs{s.microbatch_size}x{s.num_microbatches}",
             s.schedule + (f"/v{s.virtual_stages}" if s.virtual_stages > 1 else "")]
    if s.ep > 1:
        parts.append(f"ep{s.ep}")
    if s.sequence_parallel:
        parts.append("sp")
    if s.tp_comm_overlap:
        parts.append("tpo")
    if s.recompute != "none":
        parts.append({"selective": "rc-sel", "full": "rc-full", "selective_layer": "rc-layer", "selective_op": "rc-op"}[s.recompute])
    if s.zero:
        parts.append(f"zero{s.zero}")
    if s.cp > 1:
        parts.append(f"cp{s.cp}")
    if s.spatial > 1:
        parts.append(f"spatial{s.spatial}")
    if s.hybrid_shard:
        parts.append("hsdp")
    if s.offload != "none":
        parts.append(f"offload-{s.offload}")
    return " ".join(parts)


@dataclass(frozen=True)
class OptimizeResult:
    """The ranked simulated candidates, the Pareto front (time vs memory per device) over every
    evaluated candidate, the winner's "why", the search's counts, and the assumptions."""

    model: str
    cluster: str
    gpus: int
    global_batch: int
    objective: str
    dtype: str
    ranked: tuple[Candidate, ...]
    pareto: tuple[dict[str, Any], ...]
    space: dict[str, Any]
    enumerated: int
    evaluated: int
    dropped: dict[str, int]
    capacity_bytes: float
    memory_limit_bytes: float
    assumed: dict[str, Any]
    seconds: dict[str, float] = field(default_factory=dict)
    pruned: int = 0
    points: tuple[tuple[float, float, str], ...] = ()
    """Every evaluated candidate as (iteration seconds, peak bytes per device, "simulated" or
    "estimated"), the simulation's numbers where there is one: what the Pareto front is drawn from."""
    stack: dict[str, Any] | None = None
    """The software stack every candidate ran on (`dlsim.api.stacks.stack_record`)."""
    run: dict[str, Any] | None = None
    """Objectives of the whole run: the run winner against the step-time winner (`dlsim.api.run_rank`)."""

    @property
    def best(self) -> Candidate:
        return self.ranked[0]

    def why(self) -> dict[str, Any]:
        """The winner's bottleneck, exposed-communication and bubble shares, memory headroom, and
        what the runner-up trades."""
        w = self.best.result
        t = w.iteration_time_s
        b = w.breakdown.to_dict()
        parts = {k: v for k, v in b.items() if k != "total"}
        bottleneck = max(parts, key=parts.get)
        out: dict[str, Any] = {
            "winner": label(self.best.strategy), "bottleneck": bottleneck,
            "bottleneck_share": parts[bottleneck] / t if t else 0.0,
            "exposed_comm_share": b.get("exposed_comm", 0.0) / t if t else 0.0,
            "bubble_share": b.get("bubble", 0.0) / t if t else 0.0,
            "memory_headroom_bytes": self.capacity_bytes - w.peak_memory_bytes,
            "memory_headroom_share": 1 - w.peak_memory_bytes / self.capacity_bytes if self.capacity_bytes else 0.0,
        }
        if len(self.ranked) > 1:
            ru = self.ranked[1]
            diff = {k: [v, strategy_fields(ru.strategy)[k]] for k, v in strategy_fields(self.best.strategy).items()
                    if strategy_fields(ru.strategy)[k] != v}
            dt = ru.time_s / t - 1 if t else 0.0
            dm = ru.memory_bytes - w.peak_memory_bytes
            out["runner_up"] = {"label": label(ru.strategy), "differs": diff, "time_delta": dt,
                                "memory_delta_bytes": dm,
                                "trade": f"{label(ru.strategy)}: {abs(dt):.1%} {'slower' if dt >= 0 else 'faster'}, "
                                         f"{format_bytes(abs(dm))} {'more' if dm >= 0 else 'less'} memory per device"}
        return out

    def why_lines(self) -> list[str]:
        y = self.why()
        lines = [f"bottleneck: {y['bottleneck']} ({y['bottleneck_share']:.0%} of the iteration); exposed "
                 f"communication {y['exposed_comm_share']:.1%}, pipeline bubble {y['bubble_share']:.1%}; memory "
                 f"headroom {format_bytes(y['memory_headroom_bytes'])} ({y['memory_headroom_share']:.0%} of capacity)"]
        if "runner_up" in y:
            ru = y["runner_up"]
            changes = ", ".join(f"{k} {a}->{b}" for k, (a, b) in ru["differs"].items())
            lines.append(f"runner-up {ru['trade']} ({changes})")
        if self.run is not None:
            lines.append(self.run["sentence"])
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "optimize", "model": self.model, "cluster": self.cluster,
                "gpus": self.gpus, "global_batch": self.global_batch, "objective": self.objective,
                "dtype": self.dtype, "stack": self.stack, "assumed": dict(self.assumed), "space": self.space,
                "candidates": {"enumerated": self.enumerated, "dropped": dict(self.dropped),
                               "pruned_by_bound": self.pruned, "evaluated": self.evaluated,
                               "simulated": len(self.ranked)},
                "capacity_bytes": self.capacity_bytes, "memory_limit_bytes": self.memory_limit_bytes,
                "best": self.best.row(1), "why": self.why(), "run": self.run,
                "ranked": [c.row(i + 1) for i, c in enumerate(self.ranked)],
                "pareto": list(self.pareto),
                "points": {"iteration_time_s": [p[0] for p in self.points],
                           "peak_memory_bytes": [p[1] for p in self.points], "source": [p[2] for p in self.points]},
                "seconds": dict(self.seconds)}


def pareto_front(points: Sequence[tuple[float, float, Any]]) -> list[tuple[float, float, Any]]:
    """(time, memory, payload) points no other point beats on both (ascending time)."""
    front: list[tuple[float, float, Any]] = []
    best_mem = math.inf
    for p in sorted(points, key=lambda x: (x[0], x[1])):
        if p[1] < best_mem:
            front.append(p)
            best_mem = p[1]
    return front


def parse_fix(items: Sequence[str] | Mapping[str, Any] | None) -> dict[str, Any]:
    """``["tp=8", "schedule=1f1b", "sequence_parallel=true"]`` -> fields (ints, booleans, strings)."""
    if items is None:
        return {}
    if isinstance(items, Mapping):
        return dict(items)
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not value.strip():
            raise SpecError(f"--fix needs FIELD=VALUE, got {item!r}", field="fix")
        if key not in Strategy.__dataclass_fields__ or key in ("stage_partition", "layer_groups", "variability",
                                                               "compression"):
            raise SpecError(f"cannot fix {key!r} (fixable: {', '.join(SEARCHED)}, optimizer, collective, dtype, "
                            "bucket_size, tp_async_backward, p2p_overlap, fused_kernels, recompute_layers)",
                            field="fix")
        v = value.strip()
        low = v.lower()
        parsed: Any
        if low in ("true", "yes", "on"):
            parsed = True
        elif low in ("false", "no", "off"):
            parsed = False
        else:
            try:
                parsed = int(v)
            except ValueError:
                parsed = v
        if key == "fused_kernels":
            parsed = tuple(x for x in v.split(",") if x)
        if key in out and out[key] != parsed:
            raise SpecError(f"--fix {key} given twice ({out[key]} and {parsed})", field="fix")
        out[key] = parsed
    return out


def _check_fixed_degrees(fixed: Mapping[str, Any], gpus: int) -> None:
    """Pinned parallel degrees whose product does not divide the devices: no candidate can be built;
    say so with the remainder, before searching."""
    pinned = {k: fixed[k] for k in ("dp", "tp", "pp", "cp", "spatial") if isinstance(fixed.get(k), int) and fixed[k] > 0}
    product = math.prod(pinned.values())
    if pinned and gpus % product:
        names = " x ".join(pinned)
        what = f"{names} = {product}" if len(pinned) > 1 else f"{names} {product}"
        raise InfeasibleError(f"no candidate strategy can be built: --fix {' '.join(f'{k}={v}' for k, v in pinned.items())}"
                              f" ({what}) does not divide --gpus {gpus} (remainder {gpus % product})")
    if set(pinned) >= {"dp", "tp", "pp"} and product != gpus:
        raise InfeasibleError(f"no candidate strategy can be built: --fix {' '.join(f'{k}={v}' for k, v in pinned.items())}"
                              f" uses {product} devices, --gpus is {gpus} ({abs(gpus - product)} "
                              f"{'short' if product > gpus else 'left over'})")


def _no_feasible(outcome, space: SearchSpace, cluster: Cluster, memory_limit: float, fraction: float) -> InfeasibleError:
    d = outcome.dropped
    if outcome.enumerated == 0:
        reasons = ", ".join(f"{k}: {v}" for k, v in d.most_common(3)) or "nothing to enumerate"
        return InfeasibleError(f"no candidate strategy for {space.gpus} GPUs and global batch {space.global_batch} "
                               f"can be built ({reasons})")
    need, limit, s = outcome.closest_oom
    cap = f"{fraction:.0%} of " if fraction < 1 else ""
    return InfeasibleError(
        f"no feasible candidate: all {d[OUT_OF_MEMORY]} buildable candidates run out of memory "
        f"(limit {cap}{format_bytes(cluster.device.memory_bytes - cluster.device.memory_reserved)} per device); the "
        f"closest, {label(s)}, needs {format_bytes(need)} (over by {format_bytes(need - limit)}, "
        f"{need / limit:.0%} of the limit)")


@paused_gc
def optimize(model: Model | str | Path, cluster: Cluster | str | Path, *, gpus: int, global_batch: int,
             objective: str = "time", top: int = 5, max_memory_fraction: float = 1.0,
             fix: Sequence[str] | Mapping[str, Any] | None = None, nodes: int | None = None,
             schedules: Sequence[str] = ("1f1b", "interleaved"), max_microbatch_size: int = 8,
             tp_across_nodes: bool = False, measured: bool = True, max_simulations: int = 24,
             overrides: Mapping[str, Any] | None = None, prune_bound: bool = True,
             jobs: int | None = None, cp: Sequence[int] = (1,), hybrid_shard: bool = False,
             offload: Sequence[str] = ("none",), stack: str | None = None, spatial: Sequence[int] = (1,),
             run_options: Mapping[str, Any] | Any | None = None) -> OptimizeResult:
    """Search the strategies of `model` on `gpus` devices of `cluster` for `global_batch` samples per
    iteration (see the module docstring). `objective` time (fastest) or memory (least peak memory
    per device); `fix` pins strategy fields (``["tp=8"]`` or a mapping); `max_memory_fraction` of
    the device memory is the limit a candidate must fit; `prune_bound` skips timing the candidates
    that the evaluator's lower bound shows can neither be simulated nor sit on the Pareto front
    (`dlsim.plan.search.Prune`; the result is the same without it, only slower; a space of at most
    `EXHAUSTIVE_CANDIDATES` fitting candidates is timed whole either way); `cp` the
    context-parallel degrees, `spatial` the spatial-parallel degrees, `hybrid_shard` also hybrid
    sharding, `offload` the offload choices
    searched (`dlsim.plan.search`); `stack` the software stack every candidate runs on (default: the
    model's, else `dlsim.api.stacks.DEFAULT_STACK`): its values for every field neither fixed nor
    searched; `run_options` the token budget, prices and overrides of the run objectives
    (`dlsim.api.run.RunOptions`); `jobs` processes
    size, evaluate and simulate the candidates (default: the machine's cores, at most `MAX_JOBS`; the
    same result with 1). Raises `InfeasibleError` naming the limit
    when nothing can be built or fits."""
    t0 = time.perf_counter()
    model, cluster = as_model(model, overrides), as_cluster(cluster)
    if jobs is None:
        jobs = max(1, min(MAX_JOBS, os.cpu_count() or 1))
    for name, value in (("gpus", gpus), ("global_batch", global_batch), ("top", top), ("jobs", jobs),
                        ("max_microbatch_size", max_microbatch_size), ("max_simulations", max_simulations)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"must be a positive integer, got {value!r}", field=name)
    check_batch_limit(global_batch, "global_batch")  # as simulate does, before any search
    if objective not in OBJECTIVES:
        raise SpecError(f"unknown objective {objective!r} (use {', '.join(OBJECTIVES)})", field="objective")
    by_run = objective not in ("time", "memory")
    if by_run:
        from dlsim.api.run_rank import run_options as _run_options
        run_options = _run_options(objective, run_options)
    if isinstance(max_memory_fraction, bool) or not isinstance(max_memory_fraction, (int, float)) \
            or not (0 < max_memory_fraction <= 1):
        raise SpecError(f"must be a number in (0, 1], got {max_memory_fraction!r}", field="max_memory_fraction")
    bad = [s for s in schedules if s not in ("gpipe", "1f1b", "interleaved")]
    if bad or not schedules:
        raise SpecError(f"unknown schedule {bad[0] if bad else '(none)'!r} (use gpipe, 1f1b, interleaved)",
                        field="schedules")
    if not cp or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in cp):
        raise SpecError(f"context-parallel degrees must be positive integers, got {list(cp)!r}", field="cp")
    if not spatial or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in spatial):
        raise SpecError(f"spatial degrees must be positive integers, got {list(spatial)!r}", field="spatial")
    if not offload or any(o not in OFFLOADS for o in offload):
        raise SpecError(f"unknown offload in {list(offload)!r} (use {', '.join(OFFLOADS)})", field="offload")
    per_node = cluster.devices_per_node
    if nodes is not None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise SpecError(f"must be a positive integer, got {nodes!r}", field="nodes")
        cluster = replace(cluster, nodes=check_nodes_limit(nodes, per_node))
    elif gpus > cluster.num_devices:
        cluster = replace(cluster, nodes=check_nodes_limit(-(-gpus // per_node), per_node))
    if gpus > cluster.num_devices:
        raise InfeasibleError(f"--gpus {gpus} but {cluster.name} has {cluster.num_devices} devices "
                              f"({gpus - cluster.num_devices} short)")
    fixed = parse_fix(fix)
    _check_fixed_degrees(fixed, gpus)
    run_stack, why = choose_stack(stack or fixed.get("stack"), model)
    user_fixed = set(fixed)
    fixed = apply_stack(run_stack, {k: v for k, v in fixed.items() if k != "stack"}, user_fixed | set(SEARCHED),
                        model, cluster)
    dtype = check_dtype(fixed.get("dtype"), model)
    evaluator = Evaluator.of(ScenarioBuilder(model, cluster, dtype, default_pricers(cluster, measured),
                                             kernel_tables(cluster, measured)[0]))
    space = SearchSpace(gpus, global_batch, per_node, schedules=tuple(schedules),
                        max_microbatch_size=max_microbatch_size, tp_across_nodes=tp_across_nodes, fixed=fixed,
                        cp=tuple(dict.fromkeys(cp)), hybrid_shard=(False, True) if hybrid_shard else (False,),
                        offload=tuple(dict.fromkeys(offload)), spatial=tuple(dict.fromkeys(spatial)),
                        tp_comm_overlap=(False, run_stack.values["tp_comm_overlap"]) if run_stack.values.get("tp_comm_overlap") else (False,),
                        zero_grad_reduce=run_stack.values.get("zero_grad_reduce", "reduce_scatter"))
    limit = evaluator.capacity * max_memory_fraction
    prune = _prune("time" if by_run else objective, top, evaluator.capacity)
    if not prune_bound:
        prune = None
    outcome = search(evaluator, model, space, limit, prune, jobs)
    t_eval = time.perf_counter() - t0
    if not outcome.evaluations:
        raise _no_feasible(outcome, space, cluster, limit, max_memory_fraction)
    if objective == "time" or by_run:
        upper = upper_bound(outcome.evaluations, _prune("time", top, evaluator.capacity))
        pairs = simulate_by_time(model, cluster, outcome.evaluations, top, max_simulations, measured, jobs,
                                 evaluator.builder.runs_as, upper)
    else:
        chosen = _to_simulate(outcome.evaluations, objective, top, max_simulations)
        pairs = list(zip(chosen, simulate_all(model, cluster, chosen, measured, jobs, evaluator.builder.runs_as)))
    ranked = collapse_equivalents([Candidate(e.strategy, e, sim) for e, sim in pairs])
    ranked.sort(key=lambda c: c.key("time" if by_run else objective))
    run_why = None
    if by_run and ranked[0].result.feasible:
        from dlsim.api.run_rank import rank_by_run
        ranked, run_why = rank_by_run(ranked, model, cluster, objective, run_options, lambda s: label(s))
    t_sim = time.perf_counter() - t0 - t_eval
    if not ranked[0].result.feasible:
        raise InfeasibleError(f"no feasible candidate: the simulation puts every simulated candidate out of memory "
                              f"(best: {label(ranked[0].strategy)}: {ranked[0].result.infeasible_reason})")
    sims = {id(c.estimate): c for c in ranked}
    points = []
    for e in outcome.evaluations:
        c = sims.get(id(e))
        if c is not None:
            points.append((c.time_s, c.memory_bytes, (e, "simulated")))
        else:
            points.append((e.iteration_time_s, e.peak_memory_bytes, (e, "estimated")))
    pareto = tuple({"label": label(e.strategy), "strategy": strategy_fields(e.strategy), "iteration_time_s": t,
                    "peak_memory_bytes": m, "source": src} for t, m, (e, src) in pareto_front(points))
    assumed = {"dtype": dtype, "optimizer": fixed.get("optimizer", "adam"),
               "collective": fixed.get("collective", "auto"),
               "bucket_size_bytes": fixed.get("bucket_size", DEFAULT_BUCKET_BYTES),
               "fused_kernels": list(fixed.get("fused_kernels", ())),
               "tp_async_backward": fixed.get("tp_async_backward", False),
               "p2p_overlap": fixed.get("p2p_overlap", True), "gradient_overlap": True,
               "tensor_parallel": "across nodes allowed" if tp_across_nodes else "within a node",
               "measured_tables": bool(measured and cluster.tables), "stage_partition": fixed.get("pipeline_split", "balanced"),
               "ranks": "Megatron-LM order (tp, dp, pp)"}
    return OptimizeResult(model.name, cluster.name, gpus, global_batch, objective, dtype, tuple(ranked), pareto,
                          space.to_dict(), outcome.enumerated, len(outcome.evaluations),
                          dict(outcome.dropped.most_common()), evaluator.capacity, limit, assumed,
                          {"search_and_evaluate": t_eval, "simulate": t_sim,
                           "total": time.perf_counter() - t0}, outcome.pruned,
                          tuple((t, m, src) for t, m, (_, src) in points), stack_record(run_stack, why, user_fixed),
                          run_why)


def collapse_equivalents(candidates: list[Candidate]) -> list[Candidate]:
    """One candidate per distinct simulated outcome: candidates whose time, memory and breakdown are
    exactly alike keep the first (the simpler, in search order) and name the others in `equivalents`."""
    kept: dict[tuple, int] = {}
    out: list[Candidate] = []
    for c in candidates:
        r = c.result
        key = (r.iteration_time_s, r.peak_memory_bytes, tuple(r.breakdown.to_dict().values()), r.feasible)
        if key in kept:
            first = out[kept[key]]
            out[kept[key]] = replace(first, equivalents=first.equivalents + (label(c.strategy),))
        else:
            kept[key] = len(out)
            out.append(c)
    return out


SURE_FIT = 0.97
"""A candidate whose estimated memory is at most this share of the device's fits in the simulation
too (the evaluator's memory is at least the simulation's, ZeRO-3's at least 97% of it)."""


EXHAUSTIVE_CANDIDATES = 300
"""Spaces where at most this many candidates fit are timed whole, without the lower-bound pruning
(about a second of the evaluator on the 2-core development machine, benchmarks/bench_predict.py):
the same candidates are simulated either way, the record then holds every estimate."""


def _prune(objective: str, top: int, capacity: float) -> Prune:
    """What the search must keep for the simulations `optimize` runs (`dlsim.plan.search.Prune`)."""
    return Prune(objective, top, _band(APPROXIMATE_TOLERANCE), tolerance=EVALUATOR_TOLERANCE,
                 approximate_tolerance=APPROXIMATE_TOLERANCE, sure_fit_bytes=SURE_FIT * capacity,
                 exhaustive_below=EXHAUSTIVE_CANDIDATES)


def _to_simulate(evals: list[Evaluation], objective: str, top: int, cap: int) -> list[Evaluation]:
    """The candidates to simulate (see the module docstring), best estimate first."""
    def value(e: Evaluation) -> float:
        return e.peak_memory_bytes if objective == "memory" else e.iteration_time_s

    order = sorted(evals, key=lambda e: (value(e), e.iteration_time_s if objective == "memory" else e.peak_memory_bytes))
    best = value(order[0])
    chosen = order[:top]
    seen = {id(e) for e in chosen}
    for e in order[top:]:
        if len(chosen) >= max(cap, top):
            break
        tol = APPROXIMATE_TOLERANCE if e.approximate else EVALUATOR_TOLERANCE
        if value(e) <= best * _band(tol) and id(e) not in seen:
            chosen.append(e)
            seen.add(id(e))
    return chosen


def optimize_stacks(model: Model | str | Path, cluster: Cluster | str | Path, stacks: Sequence[str],
                    **options: Any) -> dict[str, Any]:
    """`optimize` once per software stack in `stacks` (the same search space and options): the record
    of a stack comparison, ``kind: stack_comparison``, with each stack's best strategy and full
    optimize record, the stacks ranked by their best (simulated) iteration time. The stack changes
    what is fused, overlapped and reduced, so it can change which strategy wins, not only its time."""
    names = list(dict.fromkeys(stacks))
    if len(names) < 2:
        raise SpecError("--stacks needs at least two stacks to compare, e.g. --stacks pytorch,megatron-core",
                        field="stacks")
    model, cluster = as_model(model, options.pop("overrides", None)), as_cluster(cluster)
    results = {name: optimize(model, cluster, stack=name, **options) for name in names}
    rows = []
    for name, r in results.items():
        best = r.best
        rows.append({"stack": name, "version": (r.stack or {}).get("version", ""), "label": label(best.strategy),
                     "iteration_time_s": best.time_s, "memory_bytes": best.memory_bytes,
                     "mfu": best.result.mfu, "strategy": best.strategy.to_dict()})
    rows.sort(key=lambda x: x["iteration_time_s"])
    fastest = rows[0]["iteration_time_s"]
    for row in rows:
        row["slowdown"] = row["iteration_time_s"] / fastest - 1 if fastest else 0.0
    return {"schema_version": SCHEMA_VERSION, "kind": "stack_comparison", "model": model.name,
            "cluster": cluster.name, "stacks": rows, "results": {n: r.to_dict() for n, r in results.items()}}
