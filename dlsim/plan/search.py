"""Strategy search space: the candidates `dlsim optimize` weighs, and why the others were dropped.

Candidates for N devices and a fixed global batch B: every dp × tp × pp = N (tp within a node by
default and dividing the attention heads; pp × virtual_stages at most the model's cut points),
pp dividing the repeated blocks where the stack splits them uniformly (`pipeline_split`),
every micro-batch size dividing B / dp (up to `max_microbatch_size`) with the count that makes B,
schedule 1F1B (pp > 1 also interleaved with v = 2, 3, 4 where the repeated blocks divide pp·v,
GPipe only when asked), recomputation none / selective / full, sequence parallelism on and off
when tp > 1 (with it, tensor-parallel overlap off and on where the software stack runs it,
`SearchSpace.tp_comm_overlap`), ZeRO 0-3 when dp > 1, and for a model with mixture-of-experts layers the expert-parallel
degree ep (every divisor of dp that divides each layer's experts; with ZeRO 0-2, the stages dlsim
models beside expert parallelism); when asked (`cp`, `hybrid_shard`, `offload` of the space), the
context-parallel degree (dp = N / (tp·pp·cp), the sequence cut into 2·cp chunks), the spatial-parallel
degree of an image model (dp = N / (pp·spatial), with tp 1: the sample × spatial hybrid), hybrid sharding of
ZeRO 1-3 and offload to host memory (estimates flagged approximate where the evaluator does not price
them: the simulation decides). `fixed` pins any of these (or sets any other strategy field for every
candidate). What cannot be built is dropped while enumerating, what cannot fit is dropped
by the evaluator's memory (`dlsim.plan.evaluate`, the simulator's memory functions) before any
timing; every drop is counted under its reason, so that an empty result can say which limit
ruled everything out.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
import gc
import multiprocessing as mp
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

from dlsim.errors import SpecError
from dlsim.plan.evaluate import Evaluation, Evaluator
from dlsim.plan.partition import single_tensor_cuts
from dlsim.plan.blocks import recompute_layers
from dlsim.spec.model import Model
from dlsim.spec.strategy import Strategy, make_strategy, validate_strategy

SEARCHED = ("dp", "tp", "pp", "microbatch_size", "num_microbatches", "schedule", "virtual_stages", "recompute",
            "sequence_parallel", "zero", "ep", "cp", "hybrid_shard", "offload", "tp_comm_overlap", "spatial")
"""Strategy fields the search varies (any of them can be fixed)."""

OUT_OF_MEMORY = "out of memory"


@dataclass(frozen=True)
class SearchSpace:
    """What to search over (see the module docstring)."""

    gpus: int
    global_batch: int
    devices_per_node: int
    schedules: tuple[str, ...] = ("1f1b", "interleaved")
    virtual_stages: tuple[int, ...] = (2, 3, 4)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    zero: tuple[int, ...] = (0, 1, 2, 3)
    sequence_parallel: tuple[bool, ...] = (False, True)
    max_microbatch_size: int = 8
    tp_across_nodes: bool = False
    fixed: dict[str, Any] = field(default_factory=dict)
    cp: tuple[int, ...] = (1,)
    hybrid_shard: tuple[bool, ...] = (False,)
    offload: tuple[str, ...] = ("none",)
    spatial: tuple[int, ...] = (1,)
    tp_comm_overlap: tuple[bool, ...] = (False,)
    """Tensor-parallel overlap choices of the candidates with sequence parallelism (`dlsim.plan.tpoverlap`):
    (False, True) where the software stack runs it."""
    zero_grad_reduce: str = "reduce_scatter"
    """The gradient collective of the ZeRO-1 candidates without hybrid sharding (the software stack's,
    `dlsim.plan.zero.gradient_collective`); the other stages reduce-scatter."""

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "global_batch": self.global_batch, "schedules": list(self.schedules),
                "virtual_stages": list(self.virtual_stages), "recompute": list(self.recompute),
                "zero": list(self.zero), "sequence_parallel": list(self.sequence_parallel),
                "max_microbatch_size": self.max_microbatch_size,
                "tp_within_node": not self.tp_across_nodes, "fixed": dict(self.fixed), "cp": list(self.cp),
                "hybrid_shard": list(self.hybrid_shard), "offload": list(self.offload),
                "tp_comm_overlap": list(self.tp_comm_overlap), "spatial": list(self.spatial),
                "zero_grad_reduce": self.zero_grad_reduce}


@dataclass
class SearchOutcome:
    """Candidates that fit (evaluated), the drops by reason, the closest miss on memory."""

    evaluations: list[Evaluation]
    dropped: Counter
    enumerated: int
    closest_oom: tuple[float, float, Strategy] | None = None  # (need, limit, strategy)
    pruned: int = 0
    """Candidates that fit but were not timed: the evaluator's lower bound shows they can be neither
    among the kept best nor on the Pareto front (`Prune`)."""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _heads(model: Model) -> list[int]:
    out = []
    for layer in model.layers:
        if layer.type in ("attention", "mla"):
            for key in ("heads", "kv_heads"):
                if layer.attrs.get(key):
                    out.append(int(layer.attrs[key]))
    return out


def _blocks(model: Model) -> int:
    """Repeated-block instances (transformer layers), or layers for a model without blocks."""
    inst = {v for v in recompute_layers(model).values() if v is not None}
    return len(inst) or len(model.layers)


def candidates(model: Model, space: SearchSpace, dropped: Counter) -> Iterator[Strategy]:
    """Every buildable strategy of `space` (drops counted in `dropped` by reason)."""
    fixed = dict(space.fixed)
    unknown = set(fixed) - set(Strategy.__dataclass_fields__)
    if unknown:
        raise SpecError(f"unknown strategy field {sorted(unknown)[0]!r} in --fix", field="fix")
    constant = {k: v for k, v in fixed.items() if k not in SEARCHED}
    N, B = space.gpus, space.global_batch
    heads = _heads(model)
    experts = [int(layer.attrs["experts"]) for layer in model.layers if layer.type == "moe"]
    units = len(single_tensor_cuts(model)) + 1
    blocks = _blocks(model)
    uniform = fixed.get("pipeline_split") == "uniform" and "stage_partition" not in fixed

    def allowed(name: str, value: Any) -> bool:
        if name in fixed and fixed[name] != value:
            dropped[f"--fix {name}={fixed[name]}"] += 1
            return False
        return True

    cps = (fixed["cp"],) if "cp" in fixed else space.cp
    spatials = (fixed["spatial"],) if "spatial" in fixed else space.spatial
    tokens = model.input_shape[0] if model.input_kind == "tokens" else 0
    image = model.input_kind == "tensor" and len(model.input_shape) == 3
    for tp in _divisors(N):
        if not allowed("tp", tp):
            continue
        if tp > space.devices_per_node and not space.tp_across_nodes:
            dropped[f"tp beyond one node ({space.devices_per_node} devices)"] += 1
            continue
        if any(h % tp for h in heads):
            dropped["tp does not divide the attention heads"] += 1
            continue
        for pp, cp, sp in ((pp, cp, sp) for pp in _divisors(N // tp) for cp in cps for sp in spatials):
            if (N // (tp * pp)) % (cp * sp):
                dropped["cp x spatial does not divide the devices left by tp x pp"] += 1
                continue
            if cp > 1 and (not tokens or tokens % (2 * cp)):
                dropped["cp does not split the sequence into 2 x cp chunks"] += 1
                continue
            if sp > 1 and (not image or tp > 1 or cp > 1):
                dropped["spatial needs an image model, tp 1 and cp 1"] += 1
                continue
            dp = N // (tp * pp * cp * sp)
            if not (allowed("pp", pp) and allowed("dp", dp)):
                continue
            if pp > units:
                dropped[f"pp beyond the model's {units} cut points"] += 1
                continue
            if uniform and blocks % pp:
                dropped["the stack's uniform pipeline split: pp does not divide the blocks"] += 1
                continue
            if B % dp:
                dropped["global batch not divisible by dp"] += 1
                continue
            per = B // dp
            for mbs in _divisors(per):
                if mbs > space.max_microbatch_size and "microbatch_size" not in fixed:
                    continue
                m = per // mbs
                if not (allowed("microbatch_size", mbs) and allowed("num_microbatches", m)):
                    continue
                for s in _schedules(space, fixed, dict(constant, cp=cp, spatial=sp), dropped, allowed, dp, tp, pp, mbs,
                                    m, units, blocks):
                    for x in _expert_degrees(s, experts, dropped, allowed):
                        yield from _sharding_and_offload(x, space, fixed, dropped)


def _expert_degrees(s: Strategy, experts: list[int], dropped: Counter, allowed) -> Iterator[Strategy]:
    """`s` with every expert-parallel degree of the space (only ep = 1 for a model without experts):
    divisors of dp dividing every layer's expert count, ep > 1 with ZeRO 0-2."""
    for ep in (_divisors(s.dp) if experts else [1]):
        if not allowed("ep", ep):
            continue
        if any(e % ep for e in experts):
            dropped["ep does not divide the experts"] += 1
        elif ep > 1 and s.zero == 3:
            dropped["ep > 1 with ZeRO-3"] += 1
        elif ep == 1:
            yield s
        else:
            try:
                yield validate_strategy(replace(s, ep=ep))
            except SpecError as exc:
                dropped[f"invalid: {exc}"] += 1


def _sharding_and_offload(s: Strategy, space: SearchSpace, fixed: dict, dropped: Counter) -> Iterator[Strategy]:
    """`s` with every hybrid-sharding choice (only with ZeRO 1-3 and dp x cp > 1) and offload of the space."""
    hybrids = (fixed["hybrid_shard"],) if "hybrid_shard" in fixed else space.hybrid_shard
    offloads = (fixed["offload"],) if "offload" in fixed else space.offload
    for hybrid in hybrids:
        if hybrid and (not s.zero or s.dp_cp == 1):
            dropped["hybrid sharding needs ZeRO 1-3 over dp x cp > 1"] += 1
            continue
        for off in offloads:
            if not hybrid and off == "none":
                yield s
                continue
            # the stack's ZeRO-1 all-reduce (`SearchSpace.zero_grad_reduce`) is not hybrid sharding's
            x = replace(s, zero_grad_reduce="reduce_scatter") if hybrid and "zero_grad_reduce" not in fixed else s
            try:
                yield validate_strategy(replace(x, hybrid_shard=hybrid, offload=off))
            except SpecError as exc:
                dropped[f"invalid: {exc}"] += 1


def _schedules(space, fixed, constant, dropped, allowed, dp, tp, pp, mbs, m, units, blocks) -> Iterator[Strategy]:
    options: list[tuple[str, int]] = []
    schedules = space.schedules if "schedule" not in fixed else (fixed["schedule"],)
    for sched in schedules:
        if sched == "interleaved":
            if pp < 2:
                continue
            vs = space.virtual_stages if "virtual_stages" not in fixed else (fixed["virtual_stages"],)
            for v in vs:
                if v < 2:
                    continue
                if m % pp:
                    dropped["interleaved schedule needs num_microbatches divisible by pp"] += 1
                elif blocks % (pp * v) or pp * v > units:
                    dropped["interleaved: pp x virtual_stages does not divide the layers"] += 1
                else:
                    options.append((sched, v))
        elif pp > 1 or sched == "1f1b":
            if allowed("virtual_stages", 1):
                options.append((sched, 1))
    for sched, v in options:
        for rec in space.recompute:
            if not allowed("recompute", rec):
                continue
            for sp in (space.sequence_parallel if tp > 1 else (False,)):
                if not allowed("sequence_parallel", sp):
                    continue
                overlaps = (fixed["tp_comm_overlap"],) if "tp_comm_overlap" in fixed else space.tp_comm_overlap
                for overlap in (overlaps if sp else (False,)):
                    if not allowed("tp_comm_overlap", overlap):
                        continue
                    for zero in (space.zero if dp > 1 else (0,)):
                        if not allowed("zero", zero):
                            continue
                        reduce = {"zero_grad_reduce": space.zero_grad_reduce} \
                            if zero == 1 and "zero_grad_reduce" not in constant else {}
                        try:
                            yield make_strategy(dp=dp, tp=tp, pp=pp, microbatch_size=mbs, num_microbatches=m,
                                                schedule=sched, virtual_stages=v, recompute=rec, sequence_parallel=sp,
                                                zero=zero, tp_comm_overlap=overlap, **reduce, **constant)
                        except SpecError as exc:
                            dropped[f"invalid: {exc}"] += 1


@dataclass(frozen=True)
class Prune:
    """What the caller keeps of the evaluations (`dlsim.api.optimize`): the `keep` best by
    `objective` ("time" or "memory"), every candidate whose value is within `band` × the best, and
    the Pareto front of time against memory. A candidate that, by the evaluator's lower bound of
    its time (`Evaluator.lower_bound`) and its exact memory, can be none of these is not timed."""

    objective: str
    keep: int
    band: float
    time_margin: float = 1.15
    memory_margin: float = 1 / 0.97
    """A simulated candidate's point on the front is the simulation's: a dominator that may be
    simulated must stay one when its time and memory are off their estimates by these factors (the
    evaluator's observed worst outside its validated space)."""
    tolerance: float | None = None
    approximate_tolerance: float = 0.0
    sure_fit_bytes: float = 0.0
    exhaustive_below: int = 0
    """A space where at most this many candidates fit is timed whole (every estimate in the record):
    the pruning never changes what the caller keeps, it only saves time, little on a small space."""
    """Objective time with `tolerance` (the evaluator's bound on its error, `approximate_tolerance`
    for an estimate flagged approximate): the caller simulates, beyond the `keep` best, only a
    candidate whose estimate is below (1 + its tolerance) × `upper_bound`, the least estimate /
    (1 − tolerance) of the candidates whose memory estimate is at most `sure_fit_bytes` (each
    such candidate's simulation is at most that, so the simulated optimum is too); `band` is not
    used then."""

    def tol(self, approximate: bool) -> float:
        return self.approximate_tolerance if approximate else self.tolerance  # type: ignore[return-value]


def upper_bound(evaluations, prune: Prune) -> float:
    """An upper bound of the simulated optimum's time from `evaluations` (see `Prune.tolerance`)."""
    return min((e.iteration_time_s / (1 - prune.tol(bool(e.approximate))) for e in evaluations
                if e.peak_memory_bytes <= prune.sure_fit_bytes), default=float("inf"))


def search(evaluator: Evaluator, model: Model, space: SearchSpace, memory_limit: float,
           prune: Prune | None = None, jobs: int = 1) -> SearchOutcome:
    """Enumerate `space`, drop what does not fit `memory_limit` bytes per device (memory first, no
    timing for those), evaluate the rest (with `prune`, all but those the lower bound shows cannot
    matter; they are counted in `SearchOutcome.pruned`). Evaluations come in enumeration order.
    The memory and lower bounds of the candidates are computed on `jobs` forked processes where
    there are enough candidates to pay for them (`_sized`); the outcome is the same whatever `jobs`."""
    dropped: Counter = Counter()
    pool = list(candidates(model, space, dropped))
    bounded = prune is not None
    with _Workers(evaluator, pool, memory_limit, bounded, jobs) as workers:
        parts = workers.sized()
        fits: list[tuple[int, float, float]] = []
        closest = None
        for part_fits, part_oom, part_closest in parts:
            fits += part_fits
            dropped[OUT_OF_MEMORY] += part_oom
            if part_closest is not None and (closest is None or part_closest[:2] < closest[:2]):
                closest = part_closest  # (ratio, index, need): the first of the least ratio, as one pass finds it
        if len(parts) > 1:
            fits.sort()  # enumeration order
        closest_oom = None if closest is None else (closest[2], memory_limit, pool[closest[1]])
        if prune is None or len(fits) <= prune.exhaustive_below:
            return SearchOutcome(workers.evaluate([i for i, _, _ in fits]), dropped, len(pool), closest_oom)
        evaluations, skipped = _pruned(evaluator, pool, fits, prune, workers)
    return SearchOutcome(evaluations, dropped, len(pool), closest_oom, skipped)


PARALLEL_MIN_CANDIDATES = 1000
"""Fewer candidates than this are sized and evaluated in one process (forks cost more than they save)."""
_SHARED: list = []
"""(evaluator, candidates, memory limit, with lower bounds) for the forked workers."""


class _Workers:
    """The candidates' sizing and evaluation, in this process or on `jobs` forked ones. The candidates
    that share a layer table (tensor-parallel degree, sequence parallelism, micro-batch size, ...) go
    to one worker, the groups spread so that the workers size about as many candidates (largest group
    first, to the worker with the fewest), so that each table, its partitions and what is priced on
    them are made by one process; a worker evaluates, as far as the shares stay even, the candidates
    it sized, whose caches serve it again. Results come in the order asked, the same whatever `jobs`."""

    def __init__(self, evaluator: Evaluator, pool: list[Strategy], memory_limit: float, bounded: bool, jobs: int):
        self.args = (evaluator, pool, memory_limit, bounded)
        self.jobs = jobs if len(pool) >= PARALLEL_MIN_CANDIDATES and "fork" in mp.get_all_start_methods() else 1
        self.executors: list[ProcessPoolExecutor] = []
        self.shares: list[list[int]] = [list(range(len(pool)))]
        self.owners: list[int] = [0] * len(pool)
        if self.jobs > 1:
            groups: dict[tuple, list[int]] = {}
            for i, s in enumerate(pool):
                groups.setdefault(_table_group(s), []).append(i)
            self.shares = [[] for _ in range(self.jobs)]
            for ids in sorted(groups.values(), key=lambda ids: (-len(ids), ids[0])):
                w = min(range(self.jobs), key=lambda w: (len(self.shares[w]), w))
                self.shares[w] += ids
                for i in ids:
                    self.owners[i] = w
            for share in self.shares:
                share.sort()

    def __enter__(self) -> "_Workers":
        if self.jobs > 1:
            _SHARED[:] = self.args
            gc.freeze()  # the workers leave the inherited heap untouched (no copy-on-write by the collector)
            self.executors = [ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("fork"))
                              for _ in range(self.jobs)]
        return self

    def __exit__(self, *exc) -> None:
        if self.executors:
            for ex in self.executors:
                ex.shutdown()
            gc.unfreeze()
            _SHARED.clear()

    def owner(self, i: int) -> int:
        """The worker of candidate `i`."""
        return self.owners[i]

    def sized(self) -> list[tuple]:
        """`_sized` over all candidates, one share per worker (fits in enumeration order within each)."""
        if not self.executors:
            return [_sized(*self.args, 0, len(self.args[1]))]
        futures = [ex.submit(_sized_share, self.shares[w]) for w, ex in enumerate(self.executors)]
        return [f.result() for f in futures]

    def evaluate(self, indices: list[int]) -> list[Evaluation]:
        """The evaluations of candidates `indices`, each by its owner."""
        if not self.executors:
            return [_evaluate_candidate(i, self.args) for i in indices]
        mine: dict[int, list[int]] = {w: [] for w in range(self.jobs)}
        fair = -(-len(indices) // self.jobs)  # each worker's share; its own candidates first
        spill = []
        for i in indices:
            w = self.owner(i)
            (mine[w] if len(mine[w]) < fair else spill).append(i)
        for i in spill:
            min(mine.values(), key=len).append(i)
        mine = {w: ids for w, ids in mine.items() if ids}
        futures = {w: self.executors[w].submit(_evaluate_candidates, ids) for w, ids in mine.items()}
        got = {i: e for w, f in futures.items() for i, e in zip(mine[w], f.result())}
        return [got[i] for i in indices]

    @property
    def batch(self) -> int:
        """Candidates a round of `_pruned` evaluates at most."""
        return EVALUATION_BATCH * self.jobs if self.executors else 1


def _table_group(s: Strategy) -> tuple:
    """What a candidate's layer table depends on among the searched fields (`ScenarioBuilder.base_table`)."""
    return (s.tp, s.sequence_parallel, s.microbatch_size, s.tp_comm_overlap, s.cp, s.spatial, s.ep)


def _sized_share(indices: list[int]) -> tuple:
    evaluator, pool, limit, bounded = _SHARED
    return _sized_indices(evaluator, pool, limit, bounded, indices)


def _evaluate_candidate(i: int, shared: tuple | None = None) -> Evaluation:
    evaluator, pool = (shared or _SHARED)[:2]
    return evaluator.evaluate(pool[i])


def _evaluate_candidates(indices: list[int]) -> list[Evaluation]:
    return [_evaluate_candidate(i) for i in indices]


def _sized(evaluator: Evaluator, pool: list[Strategy], memory_limit: float, bounded: bool, first: int,
           end: int) -> tuple[list[tuple[int, float, float]], int, tuple[float, int, float] | None]:
    """Candidates first..end sized (`_sized_indices`)."""
    return _sized_indices(evaluator, pool, memory_limit, bounded, range(first, end))


def _sized_indices(evaluator: Evaluator, pool: list[Strategy], memory_limit: float, bounded: bool,
                   indices) -> tuple[list[tuple[int, float, float]], int, tuple[float, int, float] | None]:
    """Candidates `indices` (ascending) sized: (index, peak memory, lower bound of the time or 0) of
    those that fit, the count out of memory, and the closest miss as (need / limit, index, need). A
    candidate whose memory floor is over the limit and no closer to it than the closest miss so far is
    not sized further (it can be neither)."""
    fits = []
    oom = 0
    closest: tuple[float, int, float] | None = None
    for i in indices:
        s = pool[i]
        if closest is not None and evaluator.memory_floor(s) >= closest[0] * memory_limit:
            oom += 1
            continue
        need = evaluator.peak_memory(s)
        if need > memory_limit:
            oom += 1
            if closest is None or need / memory_limit < closest[0]:
                closest = (need / memory_limit, i, need)
            continue
        fits.append((i, need, evaluator.lower_bound(s) if bounded else 0.0))
    return fits, oom, closest


def _pruned(evaluator: Evaluator, pool: list[Strategy], fits: list[tuple[int, float, float]], prune: Prune,
            workers: _Workers) -> tuple[list[Evaluation], int]:
    """Evaluate the candidates `fits` ((index in `pool`, peak memory, lower bound)) in ascending order
    of the objective's lower bound, skipping a candidate X
    when (1) an evaluated candidate is faster than X's lower bound with no more memory, by the
    margins (X is off the Pareto front), (2) at least `keep` evaluated candidates come before X by the objective, and (3)
    X's bound on the objective exceeds `band` × the best value evaluated (objective time with a
    `tolerance`: X's lower bound is at least (1 + X's tolerance) × the evaluated `upper_bound`,
    X's tolerance the approximate one where `Evaluator.maybe_approximate` says its estimate may be
    flagged). The best value and the upper bound only fall and the evaluated set only grows as the
    search goes on, so no skipped candidate could have been kept by the final evaluations (nor
    lowered the upper bound).

    With parallel `workers` the next `EVALUATION_BATCH` per worker not skipped yet are evaluated at
    once, then taken in order by the same rule (one skipped by an evaluation earlier in its batch is
    dropped: the skips only grow, so every candidate the rule keeps was evaluated): the same
    evaluations as one process makes."""
    by_memory = prune.objective == "memory"
    rows = [((need, lb) if by_memory else (lb, need), i, pool[i], need, lb) for i, need, lb in fits]
    rows.sort(key=lambda r: (r[0], r[1]))
    state = _PruneState(evaluator, prune)
    out: list[tuple[int, Evaluation]] = []
    j = 0
    while j < len(rows):
        chosen, k = [], j
        while k < len(rows) and len(chosen) < workers.batch:
            if not state.skips(rows[k][2], rows[k][3], rows[k][4]):
                chosen.append(k)
            k += 1
        got = dict(zip(chosen, workers.evaluate([rows[r][1] for r in chosen])))
        for r in range(j, k):
            _, i, s, need, lb = rows[r]
            if r in got and (r == chosen[0] or not state.skips(s, need, lb)):
                out.append((i, got[r]))
                state.add(got[r])
        j = k
    out.sort(key=lambda x: x[0])
    return [e for _, e in out], len(rows) - len(out)


EVALUATION_BATCH = 6
"""Candidates per process evaluated at once by `_pruned` (more: fewer round trips, more evaluations
that an earlier one in the batch would have skipped)."""


class _PruneState:
    """What `_pruned` has learnt from the evaluations so far: the objective values, the upper bound,
    the Pareto front widened by the margins; `skips` says whether a candidate can still matter."""

    def __init__(self, evaluator: Evaluator, prune: Prune):
        self.evaluator, self.prune = evaluator, prune
        self.by_memory = prune.objective == "memory"
        self.by_bound = not self.by_memory and prune.tolerance is not None
        self.upper = float("inf")
        self.front_t: list[float] = []  # the evaluated Pareto front, widened by the margins: time ascending,
        self.front_m: list[float] = []  # memory descending
        self.values: list[float] = []  # the evaluated objective values, ascending

    def skips(self, s: Strategy, need: float, lb: float) -> bool:
        prune, values = self.prune, self.values
        if len(values) < prune.keep:
            return False
        bound = need if self.by_memory else lb
        j = bisect_left(self.front_t, lb) - 1  # the front point fastest below lb has the least memory there
        if self.by_bound:
            beyond = bound >= self.upper * (1 + prune.tol(self.evaluator.maybe_approximate(s)))
        else:
            beyond = bound > values[0] * prune.band
        return j >= 0 and self.front_m[j] <= need and bisect_left(values, bound) >= prune.keep and beyond

    def add(self, e: Evaluation) -> None:
        prune, values = self.prune, self.values
        value = e.peak_memory_bytes if self.by_memory else e.iteration_time_s
        insort(values, value)
        t, m = e.iteration_time_s, e.peak_memory_bytes
        if self.by_bound:
            self.upper = min(self.upper, upper_bound([e], prune))
            inside = value < self.upper * (1 + prune.tol(bool(e.approximate)))
        else:
            inside = value <= values[0] * prune.band
        if bisect_left(values, value) < prune.keep or inside:
            # it may be simulated and its point move: a dominator by the margins. A candidate outside
            # (not among the best `keep`, beyond the band) stays outside as the search goes on.
            t, m = t * prune.time_margin, m * prune.memory_margin
        front_t, front_m = self.front_t, self.front_m
        j = bisect_right(front_t, t)
        if j == 0 or front_m[j - 1] > m:  # not dominated: insert, drop the points it dominates
            k = j
            while k < len(front_t) and front_m[k] >= m:
                k += 1
            front_t[j:k] = [t]
            front_m[j:k] = [m]
