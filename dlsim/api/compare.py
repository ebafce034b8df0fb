"""`compare()`: simulate several strategies of one model on one cluster, side by side.

Strategies come from YAML files, from a grid of strategy fields (``"dp=8,16 tp=1,2,4 pp=1,2"``), or
from both (one file as the base of the grid). Each is simulated event by event (`run_simulation`);
a strategy that cannot be built (sizes that do not divide, more devices than the cluster, a bad
field) or does not fit in memory is kept in the comparison with one line naming the limit and by
how much, never failing the whole comparison.

GPU counts. ``gpus=[N, ...]`` runs each strategy on N GPUs: ``dp = N / (tp x pp)`` (a strategy
whose tp x pp does not divide N cannot be built there) on ``ceil(N / devices per node)`` nodes of
the profile (unless `nodes` is given). Scaling studies (`scaling`): *strong* keeps the global batch
fixed (``global_batch``, or each strategy's own), *weak* grows it with the GPUs (the batch given,
or the strategy's own, is the batch at the smallest count: samples per replica stay the same).
Speedup = throughput / throughput at the strategy's smallest feasible GPU count; parallel
efficiency = speedup / (GPUs / that count); the ideal is the GPU ratio and 100 %.

Batch sizes. With a global batch given (or derived for scaling), a strategy that sets its
micro-batch size keeps it and its number of micro-batches follows
(``num_microbatches = global_batch / (dp x microbatch_size)``); one that sets only its number of
micro-batches keeps that (``microbatch_size = global_batch / (dp x num_microbatches)``); one that
sets neither gets what `dlsim simulate --global-batch` derives: one micro-batch of
``global_batch / dp`` samples per replica, an assumption the record states under ``assumed`` (per
entry and for the comparison) and the printed table below its rows.

Gradient synchronisation. `fields` sets strategy fields for every strategy (over its file and the
grid), e.g. ``sync="ssp", staleness=2``; parameter-server, asynchronous and stale-synchronous
strategies (``sync`` ps | async | ssp, from `fields`, a file or the grid) run the same simulation
as ``dlsim simulate --sync`` (`run_simulation`: many iterations of every worker against the
server shards). Their entry's time split is per iteration and worker, averaged over the workers:
compute = the replica's own simulated iteration (its tensor / pipeline parts included), exposed
communication = pulls and pushes to the servers, idle = the rest of the iteration time (waiting
for the staleness bound, for the slowest worker); bubble and recomputation are inside the
replica's iteration. That simulation reports no memory per worker: the entry says so.

The record (``kind: "comparison"``) holds per entry the summary the report draws (breakdown in
seconds, memory per simulated device and its capacity, throughput, feasibility and reason);
`dlsim.report.compare_plots` draws it and `dlsim plot` redraws it from the JSON alone.
"""

from __future__ import annotations

import itertools
import math
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import run_simulation
from dlsim.errors import DlsimError, SpecError, excerpt
from dlsim.io.strategy_yaml import strategy_fields
from dlsim.io.yamlfile import read_yaml
from dlsim.results import SCHEMA_VERSION

PARTS = ("compute", "recompute", "exposed_comm", "bubble", "idle")
MAX_ENTRIES = 1024
SCALINGS = ("strong", "weak")


def parse_grid(text: str) -> list[dict[str, Any]]:
    """``"dp=8,16 tp=1,2 schedule=1f1b,gpipe"`` → one strategy mapping per combination (YAML keys,
    file units: ``bucket_size_mib=25,50``); values read as integers, true/false or words."""
    axes: list[tuple[str, list[Any]]] = []
    for item in text.replace(";", " ").split():
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise SpecError(f"--grid needs KEY=V1,V2,... items separated by spaces, got {excerpt(item, 40)}")
        if any(k == key for k, _ in axes):
            raise SpecError(f"--grid names {key} twice")
        axes.append((key, [_scalar(v) for v in values.split(",") if v != ""]))
    if not axes:
        raise SpecError("--grid is empty (e.g. --grid \"dp=8,16 tp=1,2,4 pp=1,2\")")
    count = math.prod(len(v) for _, v in axes)
    if count > MAX_ENTRIES:
        raise SpecError(f"--grid has {count} combinations, more than {MAX_ENTRIES}")
    return [dict(zip((k for k, _ in axes), combo)) for combo in itertools.product(*(v for _, v in axes))]


def _scalar(text: str) -> Any:
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    if text.lower() in ("true", "false", "on", "off"):
        return text.lower() in ("true", "on")
    try:
        return float(text)
    except ValueError:
        return text


def grid_name(point: Mapping[str, Any]) -> str:
    """``{"dp": 8, "tp": 2, "schedule": "gpipe"}`` → ``"dp8 tp2 schedule=gpipe"``."""
    short = {"dp", "tp", "pp"}
    return " ".join(f"{k}{v}" if k in short else f"{k}={v}" for k, v in point.items())


def _fields_for(fields: Mapping[str, Any], gpus: int | None, global_batch: int | None) -> dict[str, Any]:
    """make_strategy fields of one run: dp from the GPU count, micro-batches from the global batch."""
    out = dict(fields)
    if gpus is not None:
        tp, pp, cp, sp = out.get("tp", 1), out.get("pp", 1), out.get("cp", 1), out.get("spatial", 1)
        if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (tp, pp, cp, sp)):
            raise SpecError(f"tp, pp, cp and spatial must be positive integers, got tp={tp!r} pp={pp!r} cp={cp!r} "
                            f"spatial={sp!r}")
        cp *= sp  # the ranks that split each sample: context-parallel or spatial (one of them is 1)
        dp, rest = divmod(gpus, tp * pp * cp)
        if rest or dp == 0:
            what = f"tp x pp = {tp} x {pp}" if cp == 1 else f"tp x pp x cp = {tp} x {pp} x {cp}"
            raise SpecError(f"{what} = {tp * pp * cp} does not divide {gpus} GPUs (remainder {gpus % (tp * pp * cp)})")
        out["dp"] = dp
    if global_batch is not None:
        if "microbatch_size" in out:  # kept; the count follows
            out.pop("num_microbatches", None)
        out["global_batch"] = global_batch  # with neither set: as simulate derives (see batch_assumption)
    return out


ASSUMED_MICROBATCH = ("as dlsim simulate derives it from a global batch: one micro-batch of global batch / dp "
                      "samples per replica, or with a pipeline micro-batches of 1 sample (set microbatch_size or "
                      "num_microbatches to choose)")


def batch_assumption(fields: Mapping[str, Any], global_batch: int | None) -> dict[str, str]:
    """What a run assumes about its micro-batches: nothing when the strategy sets a micro-batch size
    or count (or no global batch is imposed), else `ASSUMED_MICROBATCH`."""
    if global_batch is None or "microbatch_size" in fields or "num_microbatches" in fields:
        return {}
    return {"microbatch_size": ASSUMED_MICROBATCH}


def _own_batch(fields: Mapping[str, Any]) -> int | None:
    """The global batch a strategy's own fields describe (None when they do not parse)."""
    from dlsim.spec.strategy import make_strategy
    try:
        return make_strategy(**fields).global_batch
    except (DlsimError, TypeError):
        return None


def _summary(rec: dict[str, Any]) -> dict[str, Any]:
    """What the comparison keeps of a simulation record."""
    devices = [{"name": d["name"], "multiplicity": d["multiplicity"], "peak_memory_bytes": d["peak_memory_bytes"],
                "capacity_bytes": d["capacity_bytes"], "memory_bytes": d["memory_bytes"],
                "breakdown_s": {k: d["breakdown_s"][k] for k in PARTS}} for d in rec["devices"]]
    return {"feasible": rec["feasible"], "reason": rec["infeasible_reason"], "limit": "memory" if not rec["feasible"]
            else "", "iteration_time_s": rec["iteration_time_s"], "breakdown_s": {k: rec["breakdown_s"][k] for k in PARTS},
            "throughput_samples_per_s": rec["throughput_samples_per_s"], "global_batch": rec["global_batch"],
            "tokens_per_s": rec.get("tokens_per_s"), "model_tflops_per_gpu": rec.get("model_tflops_per_gpu"),
            "model_flops_utilisation": rec["model_flops_utilisation"], "peak_memory_bytes": rec["peak_memory_bytes"],
            "capacity_bytes": min((d["capacity_bytes"] for d in rec["devices"]), default=0.0),
            "measured_share": rec["measured_share"], "strategy": rec["strategy"], "dtype": rec["dtype"],
            "stack": rec.get("stack"), "simulated_devices": rec["simulation"]["simulated_devices"], "devices": devices}


PS_MEMORY_NOTE = "memory per worker not simulated (parameter-server training)"


def _async_summary(rec: dict[str, Any]) -> dict[str, Any]:
    """What the comparison keeps of a parameter-server / async / SSP record (see the module docstring)."""
    workers = rec["workers_detail"]
    count = max(len(workers), 1)

    def per_iteration(key: str) -> float:
        return sum(w[key] / max(w["iterations"], 1) for w in workers) / count
    iteration = rec["iteration_time_s"]
    compute, comm = per_iteration("compute_s"), per_iteration("comm_s")
    breakdown = {"compute": compute, "recompute": 0.0, "exposed_comm": comm, "bubble": 0.0,
                 "idle": max(iteration - compute - comm, 0.0)}
    return {"feasible": True, "reason": "", "limit": "", "iteration_time_s": iteration, "breakdown_s": breakdown,
            "throughput_samples_per_s": rec["throughput_samples_per_s"],
            "global_batch": rec["strategy"]["global_batch"], "model_flops_utilisation": None,
            "peak_memory_bytes": None, "capacity_bytes": None, "measured_share": None, "strategy": rec["strategy"],
            "dtype": rec["dtype"], "stack": rec.get("stack"), "simulated_devices": rec["workers"], "devices": [],
            "sync": rec["sync"],
            "staleness_mean": rec["staleness_mean"], "staleness_max": rec["staleness_max"],
            "updates_per_s": rec["updates_per_s"], "memory_note": PS_MEMORY_NOTE}


def _run_one(job: dict[str, Any]) -> dict[str, Any]:
    """One entry of the comparison (runs in a worker process when a pool is used)."""
    entry = {"name": job["name"], "gpus": job["gpus"], "source": job["source"]}
    try:
        assumed = batch_assumption(job["fields"], job["global_batch"])
        if assumed:
            entry["assumed"] = assumed
        fields = _fields_for(job["fields"], None if job.get("gpus_fixed") else job["gpus"], job["global_batch"])
        sim = run_simulation(job["model"], job["cluster"], None, measured=job["measured"], nodes=job["nodes"],
                             overrides=job["overrides"], **fields)
        rec = sim.result.to_dict()
        entry.update(_async_summary(rec) if rec.get("kind") == "async_simulation" else _summary(rec))
    except DlsimError as exc:
        entry.update(feasible=False, reason=" ".join(str(exc).split()), limit="build")
    if entry.get("gpus") is None:
        s = entry.get("strategy") or job["fields"]
        sizes = [s.get(k, 1) for k in ("dp", "tp", "pp", "cp", "spatial")]
        entry["gpus"] = math.prod(sizes) if all(isinstance(x, int) for x in sizes) else None
    return entry


def _strategy_sources(strategies: Sequence[str | Path], grid: str | None,
                      fixed_axes: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, source, make_strategy fields) of every strategy asked for."""
    base: list[tuple[str, str, dict[str, Any]]] = []
    for path in strategies:
        path = Path(path)
        base.append((path.stem, str(path), strategy_fields(read_yaml(path) or {}, path)))
    if grid is None:
        if not base:
            raise SpecError("give strategies to compare: --strategy FILE (repeatable) or --grid \"dp=8,16 tp=1,2\"")
        names = [n for n, _, _ in base]
        return [(n if names.count(n) == 1 else f"{n} ({src})", src, f) for n, src, f in base]
    if len(base) > 1:
        raise SpecError("--grid takes at most one --strategy file, its base")
    out = []
    points = parse_grid(grid)
    varying = [k for k in points[0] if len({repr(p[k]) for p in points}) > 1] or list(points[0])
    fixed_axes.update({k: points[0][k] for k in points[0] if k not in varying})
    for point in points:
        fields = dict(base[0][2]) if base else {}
        if "num_microbatches" in point or "microbatch_size" in point:
            fields.pop("global_batch", None)
        fields.update(strategy_fields(point, "--grid"))
        out.append((grid_name({k: point[k] for k in varying}), base[0][1] if base else "--grid", fields))
    return out


def compare(model: str | Path, cluster: str | Path, strategies: Sequence[str | Path] = (), *,
            grid: str | None = None, gpus: Sequence[int] | None = None, scaling: str | None = None,
            global_batch: int | None = None, nodes: int | None = None, measured: bool = True,
            overrides: Mapping[str, Any] | None = None, jobs: int = 1,
            on_entry: Any = None, fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The comparison record (see the module docstring). `jobs` > 1 simulates on a process pool;
    `on_entry(entry)` is called as each entry is done (in order); `fields` (strategy keywords, e.g.
    ``sync="ssp", staleness=2``) are set for every strategy."""
    if scaling is not None and scaling not in SCALINGS:
        raise SpecError(f"unknown scaling {scaling!r} (use strong, weak)", field="scaling")
    counts = sorted(set(gpus)) if gpus else []
    for n in counts:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SpecError(f"GPU counts must be positive integers, got {n!r}", field="gpus")
    if scaling and len(counts) < 2:
        raise SpecError("a scaling study needs at least two GPU counts (--gpus 8,16,32)", field="gpus")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise SpecError(f"must be a positive integer, got {jobs!r}", field="jobs")
    if global_batch is not None and (isinstance(global_batch, bool) or not isinstance(global_batch, int)
                                     or global_batch < 1):
        raise SpecError(f"must be a positive integer, got {global_batch!r}", field="global_batch")
    model_obj, cluster_obj = as_model(model, overrides), as_cluster(cluster)  # bad input fails here, once
    fixed_axes: dict[str, Any] = {}
    sources = _strategy_sources(strategies, grid, fixed_axes)
    if fields:
        from dlsim.spec.strategy import Strategy
        common = dict(fields)
        unknown = sorted(set(common) - set(Strategy.__dataclass_fields__))
        if unknown:
            raise SpecError(f"unknown strategy field {unknown[0]!r}", field="fields")
        if grid is not None:
            both = sorted(set(common) & set(parse_grid(grid)[0]))
            if both:
                raise SpecError(f"{both[0]} is set for every strategy and varied by --grid: give it once",
                                field=both[0])
        sources = [(n, src, {**f, **common}) for n, src, f in sources]
        fixed_axes.update(fields)
    grid_dp = grid is not None and any(item.partition("=")[0] == "dp" for item in grid.replace(";", " ").split())
    if grid_dp and scaling:
        raise SpecError("a scaling study sets dp = GPUs / (tp x pp): leave dp out of --grid", field="grid")
    per_node = cluster_obj.devices_per_node
    jobs_list: list[dict[str, Any]] = []
    for name, source, fields in sources:
        own = _own_batch(fields)
        for n in counts or [None]:
            if grid_dp and n is not None:  # dp in the grid: keep the combinations using n GPUs
                if fields.get("dp", 1) * fields.get("tp", 1) * fields.get("pp", 1) != n:
                    continue
            job = {"name": name, "source": source, "fields": fields, "gpus": n, "global_batch": global_batch,
                   "model": model, "cluster": cluster, "overrides": dict(overrides or {}), "measured": measured,
                   "nodes": nodes if nodes is not None or n is None else max(1, -(-n // per_node))}
            if grid_dp:
                job["gpus_fixed"] = True
            if scaling == "strong" and global_batch is None:
                job["global_batch"] = own
            elif scaling == "weak":
                b0 = global_batch if global_batch is not None else own
                if b0 is not None:
                    batch, rest = divmod(b0 * n, counts[0])
                    job["global_batch"] = batch
                    if rest:
                        job["bad"] = (f"weak scaling from {b0} samples on {counts[0]} GPUs gives a fractional "
                                      f"global batch {b0 * n / counts[0]:.6g} on {n} GPUs")
            jobs_list.append(job)
    if not jobs_list:
        raise SpecError(f"no --grid combination uses {', '.join(map(str, counts))} GPUs (dp x tp x pp)", field="grid")
    if len(jobs_list) > MAX_ENTRIES:
        raise SpecError(f"{len(jobs_list)} simulations asked for, more than {MAX_ENTRIES}")
    entries = list(_execute(jobs_list, jobs, on_entry))
    record = {"schema_version": SCHEMA_VERSION, "kind": "comparison", "model": model_obj.name,
              "cluster": cluster_obj.name, "device": cluster_obj.device.name, "scaling": scaling,
              "gpus": counts or None, "global_batch": global_batch, "nodes": nodes,
              "fixed": " ".join(f"{k}={v}" for k, v in fixed_axes.items()), "entries": entries,
              "feasible": sum(1 for e in entries if e["feasible"]), "infeasible": sum(1 for e in entries
                                                                                      if not e["feasible"])}
    assumed = [e["name"] for e in entries if e.get("assumed")]
    if assumed:
        record["assumed"] = {"microbatch_size": f"{ASSUMED_MICROBATCH}: "
                                                f"{', '.join(dict.fromkeys(assumed))}"}
    if scaling:
        record["scaling_curves"] = scaling_curves(record)
    return record


def _execute(jobs_list: list[dict[str, Any]], jobs: int, on_entry: Any) -> Iterable[dict[str, Any]]:
    def bad(job: dict[str, Any]) -> dict[str, Any]:
        return {"name": job["name"], "gpus": job["gpus"], "source": job["source"], "feasible": False, "limit": "build",
                "reason": job["bad"]}
    if jobs == 1 or len(jobs_list) < 2:
        for job in jobs_list:
            entry = bad(job) if "bad" in job else _run_one(job)
            if on_entry:
                on_entry(entry)
            yield entry
        return
    with ProcessPoolExecutor(max_workers=min(jobs, len(jobs_list))) as pool:
        futures = [None if "bad" in job else pool.submit(_run_one, job) for job in jobs_list]
        for job, fut in zip(jobs_list, futures):
            entry = bad(job) if fut is None else fut.result()
            if on_entry:
                on_entry(entry)
            yield entry


def _overrun(entry: Mapping[str, Any]) -> tuple[float, float] | None:
    """(peak, capacity) of an out-of-memory entry's fullest device, or None without memory figures."""
    devices = [d for d in entry.get("devices") or [] if d.get("capacity_bytes")]
    if not devices:
        return None
    d = max(devices, key=lambda d: d["peak_memory_bytes"] / d["capacity_bytes"])
    return d["peak_memory_bytes"], d["capacity_bytes"]


def _where_entry(entry: Mapping[str, Any]) -> str:
    return f"{entry['name']}" + (f" on {entry['gpus']} GPUs" if entry.get("gpus") else "")


def no_feasible_reason(record: Mapping[str, Any]) -> str:
    """One line for a comparison where nothing is feasible: which limit ruled every entry out and by
    how much (out of memory: the closest entry's need against its capacity; cannot be built: the
    reason, or the first one and how many share none)."""
    from dlsim.api.sweep import reason_kind
    from dlsim.units import format_bytes
    entries = list(record["entries"])
    n = len(entries)
    names = len({e["name"] for e in entries})
    what = f"{n} points ({names} {'strategy' if names == 1 else 'strategies'} x GPU counts)" \
        if record.get("scaling") else f"{n} strategies" if n > 1 else "1 strategy"
    memory = [e for e in entries if e.get("limit") == "memory"]
    built = [e for e in entries if e.get("limit") != "memory"]
    parts = []
    if built:
        kinds = {reason_kind(str(e.get("reason", ""))) for e in built}
        first = built[0]
        share = "" if len(built) == 1 else " (every one for the same reason)" if len(kinds) == 1 else \
            f" ({len(kinds)} different reasons; see the table)"
        parts.append(f"{len(built)} cannot be built{share}: first, {_where_entry(first)}: "
                     f"{' '.join(str(first.get('reason', '')).split())}")
    if memory:
        sized = [(e, o) for e in memory if (o := _overrun(e)) is not None]
        if sized:
            e, (need, cap) = min(sized, key=lambda x: x[1][0] / x[1][1])
            parts.append(f"{len(memory)} run out of memory: the closest, {_where_entry(e)}, needs "
                         f"{format_bytes(need)} per device against {format_bytes(cap)} usable (over by "
                         f"{format_bytes(need - cap)}, {need / cap:.0%} of capacity)")
        else:
            parts.append(f"{len(memory)} run out of memory: first, {_where_entry(memory[0])}: "
                         f"{' '.join(str(memory[0].get('reason', '')).split())}")
    head = "the only strategy is not feasible" if what == "1 strategy" else f"none of the {what} is feasible"
    return f"{head}: " + "; ".join(parts)


def scaling_curves(record: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """strategy -> [{gpus, throughput, speedup, efficiency, feasible}] against its smallest feasible count."""
    out: dict[str, list[dict[str, Any]]] = {}
    by_name: dict[str, list[Mapping[str, Any]]] = {}
    for e in record["entries"]:
        by_name.setdefault(e["name"], []).append(e)
    for name, entries in by_name.items():
        entries = sorted(entries, key=lambda e: e["gpus"] or 0)
        base = next((e for e in entries if e["feasible"] and e.get("throughput_samples_per_s")), None)
        rows = []
        for e in entries:
            row = {"gpus": e["gpus"], "feasible": e["feasible"], "throughput_samples_per_s": e.get(
                "throughput_samples_per_s"), "speedup": None, "efficiency": None, "baseline_gpus": None}
            if base is not None and e.get("throughput_samples_per_s") and e["gpus"] >= base["gpus"]:
                sp = e["throughput_samples_per_s"] / base["throughput_samples_per_s"]
                row.update(speedup=sp, efficiency=sp / (e["gpus"] / base["gpus"]), baseline_gpus=base["gpus"])
            rows.append(row)
        out[name] = rows
    return out


def comparison_from_records(records: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """A comparison record from saved simulation records ``(name, record)`` (`dlsim plot A.json B.json`)."""
    entries = []
    for name, rec in records:
        summary = _async_summary if rec.get("kind") == "async_simulation" else _summary
        entry = {"name": name, "source": name, **summary(dict(rec))}
        s = rec.get("strategy") or {}
        entry["gpus"] = s.get("dp", 1) * s.get("tp", 1) * s.get("pp", 1) if s else None
        entries.append(entry)
    def joined(key: str) -> str:
        return " / ".join(dict.fromkeys(str(r.get(key, "?")) for _, r in records))
    batches = {e["global_batch"] for e in entries}
    return {"schema_version": SCHEMA_VERSION, "kind": "comparison", "model": joined("model"),
            "cluster": joined("cluster"), "device": joined("device"), "scaling": None, "gpus": None,
            "global_batch": batches.pop() if len(batches) == 1 else None, "nodes": None, "entries": entries,
            "feasible": sum(1 for e in entries if e["feasible"]),
            "infeasible": sum(1 for e in entries if not e["feasible"])}
