"""`run_sweep()`: price every point of a sweep spec, appending each result as it finishes.

Each point is simulated (`dlsim.api.simulate`), or with ``analytic`` priced by the analytic
evaluator (`dlsim.api.analytic`; a strategy it does not model is simulated, its record saying why);
every record names the engine that priced it (``engine``), and a results file resumed by a sweep
with the other engine keeps those records but neither reuses nor counts them (`record_key`).

Results go to a JSON-lines file, one record per point keyed by its stable id
(`dlsim.io.sweep_spec.point_id`), through `dlsim.io.results_log.ResultsLog`: one sweep at a time
holds the file (a lock naming its process; a second sweep on it is refused), the parent process
alone writes, and each finished batch of records is one ``os.write`` of whole lines followed by
``fsync``, so a sweep killed at any moment (SIGKILL included) leaves whole lines and at most one
truncated last line. A restart checks every line like any input (`check_record`: a damaged line,
a NaN, a record whose point is not its id's, is refused naming the line), drops the truncated
tail, skips the ids already there (of its engine) and prices the rest: no result is lost, none is written
twice (a batch that a lost Dask scheduler makes run twice is recorded once).

Backends: a local process pool (`jobs` workers, the default), or Dask distributed
(`dlsim.api.sweep_dask`, the only module that imports dask) given a scheduler address or a number
of local workers. Each worker keeps the models and clusters it has loaded and their scenario
builders (`dlsim.api.simulate.Builders`: measured tables, layer tables, comm prices, the evaluator),
so that a point costs its own strategy's pricing and nothing more.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dlsim.api.gcpause import paused_gc
from dlsim.errors import DlsimError, InfeasibleError, SpecError, excerpt
from dlsim.io.files import check_output
from dlsim.io.results_log import ResultsLog, Resumed, read_log
from dlsim.io.runfiles import run_scope
from dlsim.io.sweep_spec import SweepPoint, SweepSpec

RECORD_KIND = "sweep_point"


# ----------------------------------------------------------------------------------------- workers
_MODELS: dict[str, Any] = {}
_CLUSTERS: dict[tuple[str, int | None], Any] = {}


def _model(name: str) -> Any:
    if name not in _MODELS:
        from dlsim.api.models import as_model
        _MODELS[name] = as_model(name)
    return _MODELS[name]


def _cluster(name: str, nodes: int | None) -> Any:
    key = (name, nodes)
    if key not in _CLUSTERS:
        from dlsim.api.limits import check_nodes_limit
        from dlsim.api.models import as_cluster
        base = _CLUSTERS.get((name, None)) or as_cluster(name)
        _CLUSTERS[(name, None)] = base
        _CLUSTERS[key] = base if nodes is None else replace(base, nodes=check_nodes_limit(nodes, base.devices_per_node))
    return _CLUSTERS[key]


_BUILDERS: list[Any] = []


def _builders() -> Any:
    """The worker's kept scenario builders (`dlsim.api.simulate.Builders`): a point on a model and
    cluster already seen reuses their measured tables, layer tables, partitions, remembered comm
    prices and analytic evaluator; same numbers as fresh builders (a test holds the records equal)."""
    if not _BUILDERS:
        from dlsim.api.simulate import Builders
        _BUILDERS.append(Builders())
    return _BUILDERS[0]


def reason_kind(reason: str) -> str:
    """A reason without its numbers and names, to count reasons alike: ``out of memory on rank#``..."""
    if reason.startswith("out of memory"):
        return "out of memory"
    text = reason
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"\([^)]*\)", "", text)
    text = re.sub(r"\d+(\.\d+)?", "#", text)
    return " ".join(text.split())[:70]


ENGINES = ("simulation", "analytic")
"""How a sweep prices its points: the event simulation, or the analytic evaluator (`--analytic`)."""


def record_engine(rec: dict[str, Any]) -> str:
    """The engine a sweep asked for when it wrote `rec`: ``analytic`` for the evaluator's records and
    for the simulations it fell back to (``analytic_refused`` says why), else ``simulation`` (records
    written before sweeps had engines were all simulated)."""
    return "analytic" if rec.get("engine") == "analytic" or "analytic_refused" in rec else "simulation"


def record_key(rec: dict[str, Any]) -> tuple[str, str]:
    """What a resumed record stands for: its point's id and the engine asked for (`record_engine`),
    so that one file may hold a point priced by each engine and neither is taken for the other."""
    return rec["id"], record_engine(rec)


def _price(point: SweepPoint, engine: str, model_only: bool, memo: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(figures, what the record says about how they were priced) of one point; raises as `prepare`,
    the simulation and the evaluator do."""
    from dlsim.api.simulate import prepare, simulate_prepared
    from dlsim.io.sweep_fields import simulate_fields
    fields, given = simulate_fields(dict(point.fields))
    model = _model(point.model)
    nodes = None
    if point.gpus is not None:
        cluster = _cluster(point.cluster, None)
        tp, pp = int(fields.get("tp", 1)), int(fields.get("pp", 1))
        cp = int(fields.get("cp", 1)) * int(fields.get("spatial", 1))  # the ranks splitting each sample
        if point.gpus % (tp * pp * cp):
            what = f"tp x pp = {tp} x {pp}" if cp == 1 else f"tp x pp x cp = {tp} x {pp} x {cp}"
            raise InfeasibleError(f"{what} = {tp * pp * cp} does not divide {point.gpus} GPUs "
                                  f"(remainder {point.gpus % (tp * pp * cp)})")
        fields["dp"] = point.gpus // (tp * pp * cp)
        nodes = max(1, math.ceil(point.gpus / cluster.devices_per_node))
    cluster = _cluster(point.cluster, nodes)
    p = prepare(model, cluster, measured=not model_only, global_batch=point.global_batch, given=given,
                builders=_builders() if memo else None, **fields)
    how: dict[str, Any] = {"engine": engine}
    if engine == "analytic":
        from dlsim.api.analytic import estimate_prepared
        from dlsim.plan.evaluate import supports
        refused = supports(p.strategy)
        if not refused:
            d = estimate_prepared(p)
            return d, {**how, "approximate": d["approximate"], "tolerance": d["tolerance"]}
        how = {"engine": "simulation", "analytic_refused": refused}
    return simulate_prepared(p).result.to_dict(), how


@paused_gc
def evaluate_point(point: SweepPoint, model_only: bool = False, memo: bool = True,
                   engine: str = "simulation") -> dict[str, Any]:
    """The record of one point (never raises): its figures priced by `engine` (``simulation``, or
    ``analytic``: the evaluator, falling back to the simulation for what it does not model, the record
    saying so), or why it could not run. `memo` keeps the worker's scenario builders across points
    (`_builders`; the same numbers)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}")
    rec: dict[str, Any] = {"id": point.id, "kind": RECORD_KIND, "point": point.to_dict(), "engine": engine}
    try:
        d, how = _price(point, engine, model_only, memo)
    except InfeasibleError as exc:
        return {**rec, "status": "infeasible", "reason": str(exc)}
    except DlsimError as exc:
        return {**rec, "status": "invalid", "reason": str(exc)}
    except Exception as exc:  # a bug: recorded, not fatal to the sweep
        return {**rec, "status": "error", "reason": f"bug: {type(exc).__name__}: {exc}"[:300]}
    feasible = bool(d.get("feasible", True))
    strategy = d["strategy"]
    out = {**rec, **how, "status": "ok" if feasible else "infeasible",
           "reason": "" if feasible else d["infeasible_reason"],
           "dp": strategy.get("dp"), "devices": strategy.get("dp", 1) * strategy.get("tp", 1) * strategy.get("pp", 1),
           "throughput_samples_per_s": d["throughput_samples_per_s"]}
    for key in ("iteration_time_s", "peak_memory_bytes", "model_flops_utilisation", "measured_share",
                "breakdown_s", "simulated_time_s", "updates"):
        if key in d:
            out[key] = d[key]
    return out


def failed_records(points: list[SweepPoint], reason: str, engine: str = "simulation") -> list[dict[str, Any]]:
    """Records of points that could not be run at all (a backend's failure, not the point's)."""
    return [{"id": p.id, "kind": RECORD_KIND, "point": p.to_dict(), "engine": engine, "status": "error",
             "reason": reason[:300]} for p in points]


def evaluate_chunk(points: list[SweepPoint], model_only: bool = False,
                   engine: str = "simulation") -> list[dict[str, Any]]:
    """Records of a batch of points, in order (a worker's task)."""
    return [evaluate_point(p, model_only, engine=engine) for p in points]


# ------------------------------------------------------------------------------------ results file
STATUSES = ("ok", "infeasible", "invalid", "error")
_FINITE_FIELDS = ("iteration_time_s", "throughput_samples_per_s", "peak_memory_bytes", "model_flops_utilisation",
                  "measured_share", "simulated_time_s")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_record(rec: dict[str, Any]) -> str | None:
    """Why a resumed sweep record cannot be trusted, or None: a known status and a reason, the point
    as a mapping, and for a point that ran, finite non-negative figures (a positive iteration time)."""
    status = rec.get("status")
    if status not in STATUSES:
        return f"status {excerpt(status, 30)} is not one of {', '.join(STATUSES)}"
    if not isinstance(rec.get("point"), dict):
        return "point is not a mapping"
    if not isinstance(rec.get("reason", ""), str):
        return "reason is not a string"
    if rec.get("engine", "simulation") not in ENGINES:
        return f"engine {excerpt(rec.get('engine'), 30)} is not one of {', '.join(ENGINES)}"
    if not isinstance(rec.get("analytic_refused", ""), str):
        return "analytic_refused is not a string"
    for key in _FINITE_FIELDS:
        value = rec.get(key)
        if value is not None and (not _finite(value) or value < 0):
            return f"{key} is {excerpt(value, 30)}, not a finite non-negative number"
    breakdown = rec.get("breakdown_s")
    if breakdown is not None and (not isinstance(breakdown, dict)
                                  or not all(_finite(v) and v >= 0 for v in breakdown.values())):
        return "breakdown_s is not a mapping of finite non-negative seconds"
    if status == "ok":
        for key in ("iteration_time_s", "throughput_samples_per_s"):
            if not _finite(rec.get(key)):
                return f"a point that ran needs {key}"
        if rec["iteration_time_s"] <= 0:
            return f"iteration_time_s is {rec['iteration_time_s']}, not positive"
    return None


def read_results(path: Path | str, repair: bool = False, engine: str = "simulation") -> dict[str, dict[str, Any]]:
    """The validated records of a results file by id, those a sweep with `engine` wrote
    (`record_engine`; `dlsim.io.results_log.read_log`: a damaged line is a `SpecError` naming it);
    with `repair` a truncated last line (a killed sweep's) is cut off."""
    records = read_log(path, RECORD_KIND, check_record, repair=repair, key=record_key).records
    return {rid: rec for (rid, used), rec in records.items() if used == engine}


def _check_points(path: Path, resumed: Resumed, points: list[SweepPoint]) -> None:
    """A resumed record of one of the spec's points describes that point (not one edited by hand)."""
    for p in points:
        for engine in ENGINES:
            rec = resumed.records.get((p.id, engine))
            if rec is not None and rec["point"] != json.loads(json.dumps(p.to_dict())):
                raise SpecError(f"the record of point {p.id} describes another point; fix or delete that line and "
                                "run again", path=path, field=f"line {resumed.lines[(p.id, engine)]}")


# ---------------------------------------------------------------------------------------- the sweep
@dataclass
class SweepOutcome:
    spec: SweepSpec
    out: Path
    total: int
    resumed: int
    computed: int
    backend: str
    records: list[dict[str, Any]] = field(default_factory=list)
    engine: str = "simulation"
    other_engine: int = 0
    """Records of the spec's points that a sweep with the other engine wrote, kept in the file, not used."""

    @property
    def fallbacks(self) -> Counter:
        """Points of an analytic sweep simulated instead, by the evaluator's reason (`supports`)."""
        return Counter(r["analytic_refused"] for r in self.records if "analytic_refused" in r)


def _chunks(points: list[SweepPoint], size: int) -> Iterator[list[SweepPoint]]:
    for i in range(0, len(points), size):
        yield points[i:i + size]


def chunk_size(n: int, workers: int) -> int:
    """Points per task: enough to amortise a task's overhead, small enough to balance and to lose
    little on a crash."""
    return max(1, min(32, n // max(1, workers * 8)))


def _run_pool(chunks: Iterable[list[SweepPoint]], jobs: int, model_only: bool, engine: str,
              done: Callable[[list[dict[str, Any]]], None]) -> None:
    """The batches on `jobs` worker processes, each worker taking the batches of its own contiguous
    share of the points first (the points of a model and cluster are adjacent in a spec's order, so a
    worker's kept builders, tables and prices serve most of its batches instead of every worker
    pricing every model's layers and collectives), then, once its share is done, the last batches of
    the share with the most left (the balance of a shared queue, far from where that share's owner
    works). Each record is the same whichever worker prices it (`Builders`)."""
    import multiprocessing

    import dlsim.api.simulate  # noqa: F401  (loaded before the workers fork: they start warm)
    if engine == "analytic":
        import dlsim.api.analytic  # noqa: F401
    methods = multiprocessing.get_all_start_methods()
    forked = "fork" in methods
    ctx = multiprocessing.get_context("fork" if forked else None)
    batches = list(chunks)
    shares = [deque(range(w * len(batches) // jobs, (w + 1) * len(batches) // jobs)) for w in range(jobs)]

    def take(w: int) -> int | None:
        if shares[w]:
            return shares[w].popleft()
        most = max(shares, key=len)
        return most.pop() if most else None

    _BATCHES[:] = batches if forked else []  # forked workers inherit the batches: only an index is sent
    workers = [ProcessPoolExecutor(max_workers=1, mp_context=ctx) for _ in range(jobs)]
    try:
        owner: dict[Future, int] = {}
        queued = [0] * jobs
        while True:
            for w in range(jobs):
                while queued[w] < QUEUED_BATCHES:
                    i = take(w)
                    if i is None:
                        break
                    owner[workers[w].submit(_evaluate_batch, i, model_only, engine) if forked else
                          workers[w].submit(evaluate_chunk, batches[i], model_only, engine)] = w
                    queued[w] += 1
            if not owner:
                return
            finished, _ = wait(owner, return_when=FIRST_COMPLETED)
            for f in finished:
                queued[owner.pop(f)] -= 1
                done(f.result())
    finally:
        for ex in workers:
            ex.shutdown()
        _BATCHES.clear()


_BATCHES: list[list[SweepPoint]] = []
"""The batches of the running `_run_pool`, inherited by its forked workers."""


def _evaluate_batch(i: int, model_only: bool, engine: str) -> list[dict[str, Any]]:
    """`evaluate_chunk` of batch `i` of `_BATCHES` (in a forked worker)."""
    return evaluate_chunk(_BATCHES[i], model_only, engine)


QUEUED_BATCHES = 4
"""Batches submitted ahead per worker (`_run_pool`): one running, the next ones ready."""


def _run_inline(chunks: Iterable[list[SweepPoint]], model_only: bool, engine: str,
                done: Callable[[list[dict[str, Any]]], None]) -> None:
    for chunk in chunks:
        done(evaluate_chunk(chunk, model_only, engine))


def check_models(spec: SweepSpec) -> None:
    """Every model and cluster of the spec loads (one line naming the bad one, before any work)."""
    from dlsim.api.models import as_cluster, as_model
    for name in spec.models:
        try:
            _MODELS[name] = as_model(name)
        except SpecError as exc:
            raise SpecError(f"model {name!r}: {exc}", field="models") from None
    for name in spec.clusters:
        try:
            _CLUSTERS[(name, None)] = as_cluster(name)
        except SpecError as exc:
            raise SpecError(f"cluster {name!r}: {exc}", field="clusters") from None


def run_sweep(spec: SweepSpec, out: Path | str, *, jobs: int | None = None, scheduler: str | None = None,
              dask_local: int | None = None, progress: Callable[[int, int], None] | None = None,
              sync: bool = True, chunk: int | None = None, analytic: bool = False) -> SweepOutcome:
    """Simulate every point of `spec` not already in `out`, appending records as they finish.

    `analytic` prices each point with the analytic evaluator instead (`dlsim.api.analytic`,
    milliseconds a point); a point whose strategy it does not model (`dlsim.plan.evaluate.supports`)
    is simulated, its record saying why (``analytic_refused``). Every record names the engine that
    priced it; a resumed file's records of the other engine are kept there but neither reused nor
    counted (`record_key`): the points they stand for are priced again.

    `jobs` local worker processes (default: the CPU count; 1 runs in this process); `scheduler`
    (``tcp://host:port``) or `dask_local` (N local worker processes on the loopback) use Dask.
    `progress(done, total)` is called after each batch. Returns the outcome with every record of
    the spec's points (resumed and new), in the spec's order.
    """
    if scheduler and dask_local:
        raise SpecError("give a scheduler address or a local Dask cluster size, not both", field="scheduler")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise SpecError(f"must be a positive integer, got {jobs!r}", field="jobs")
    if dask_local is not None and (isinstance(dask_local, bool) or not isinstance(dask_local, int) or dask_local < 1):
        raise SpecError(f"must be a positive integer, got {dask_local!r}", field="dask_local")
    check_models(spec)
    out = Path(out)
    with run_scope():
        check_output(out, option="results", resume=True)
        with ResultsLog(out, sync=sync) as log:
            return _run_locked(spec, out, log, jobs=jobs, scheduler=scheduler, dask_local=dask_local,
                               progress=progress, chunk=chunk, engine="analytic" if analytic else "simulation")


def _run_locked(spec: SweepSpec, out: Path, log: ResultsLog, *, jobs: int | None, scheduler: str | None,
                dask_local: int | None, progress: Callable[[int, int], None] | None,
                chunk: int | None, engine: str) -> SweepOutcome:
    """`run_sweep` once the results file is this run's alone."""
    existing = read_log(out, RECORD_KIND, check_record, repair=True, key=record_key)
    points = list(spec.points())
    _check_points(out, existing, points)
    mine = {rid: rec for (rid, used), rec in existing.records.items() if used == engine}
    other = sum((p.id, e) in existing.records for p in points for e in ENGINES if e != engine)
    todo = [p for p in points if p.id not in mine]
    resumed = len(points) - len(todo)
    records = {p.id: mine[p.id] for p in points if p.id in mine}
    total = len(points)
    workers = dask_local or jobs or os.cpu_count() or 1
    size = chunk or chunk_size(len(todo), workers)
    count = [resumed]

    def done(recs: list[dict[str, Any]]) -> None:
        fresh = [r for r in recs if r["id"] not in records]
        log.append(fresh)
        for r in fresh:
            records[r["id"]] = r
        count[0] += len(fresh)
        if progress is not None:
            progress(count[0], total)

    if progress is not None:
        progress(resumed, total)
    if scheduler or dask_local:
        from dlsim.api.sweep_dask import run_dask
        backend = f"dask {scheduler}" if scheduler else f"dask local ({dask_local} workers)"
        lost = run_dask(_chunks(todo, size), functools.partial(evaluate_chunk, engine=engine), spec.model_only, done,
                        scheduler=scheduler, local_workers=dask_local, fail=functools.partial(failed_records, engine=engine))
        if lost["resubmitted"] or lost["split"]:
            backend += (f"; {lost['resubmitted']} batches submitted again after the scheduler was lost, "
                        f"{lost['split']} split after their workers died")
    elif workers == 1 or len(todo) <= size:
        backend = "in process"
        _run_inline(_chunks(todo, size), spec.model_only, engine, done)
    else:
        backend = f"process pool ({workers} workers)"
        _run_pool(_chunks(todo, size), workers, spec.model_only, engine, done)
    return SweepOutcome(spec, out, total, resumed, len(todo), backend, [records[p.id] for p in points], engine, other)


# ------------------------------------------------------------------------------------------ summary
def _label(rec: dict[str, Any], keys: Iterable[str]) -> str:
    point = rec["point"]
    parts = [f"dp={rec.get('dp')}"] if rec.get("dp") is not None else []
    parts += [f"{k}={point[k]}" for k in keys if k in point and k != "dp"]
    return " ".join(parts)


def summarize(spec: SweepSpec, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Best point per model x cluster x gpus (highest throughput), counts by status, infeasible
    counts by reason (numbers and names stripped)."""
    keys = [k for k, _ in spec.grid]
    groups: dict[tuple, dict[str, Any]] = {}
    status = Counter(r["status"] for r in records)
    reasons = Counter(reason_kind(r["reason"]) for r in records if r["status"] != "ok")
    for r in records:
        p = r["point"]
        g = groups.setdefault((p["model"], p["cluster"], p["gpus"]),
                              {"model": p["model"], "cluster": p["cluster"], "gpus": p["gpus"], "points": 0,
                               "feasible": 0, "best": None})
        g["points"] += 1
        if r["status"] == "ok":
            g["feasible"] += 1
            best = g["best"]
            if best is None or (r["throughput_samples_per_s"], -r["iteration_time_s"]) > (
                    best["throughput_samples_per_s"], -best["iteration_time_s"]):
                g["best"] = r
    best_rows = []
    for g in groups.values():
        b = g.pop("best")
        g.update({"best_strategy": _label(b, keys) if b else "", "global_batch": b["point"]["global_batch"] if b else None,
                  "iteration_time_s": b["iteration_time_s"] if b else None,
                  "throughput_samples_per_s": b["throughput_samples_per_s"] if b else None,
                  "peak_memory_bytes": b.get("peak_memory_bytes") if b else None,
                  "best_id": b["id"] if b else None})
        best_rows.append(g)
    return {"kind": "sweep_summary", "name": spec.name, "points": len(records), "status": dict(status),
            "infeasible_by_reason": dict(reasons.most_common()), "best": best_rows}
