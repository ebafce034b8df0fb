"""`calibrate_compute()`: measure a device's kernels into a hardware profile directory.

Writes (in `out`): ``gemm.csv``, ``conv.csv``, ``memory.csv``, ``device.csv`` (rows appended as they
are measured; a rerun resumes), ``meta.yaml`` (device, library versions, date, command, every run),
and ``profile.yaml``: a new one with the measured and fitted roofline parameters, or, when one
exists, only the table entries it lacks (nothing a user wrote is replaced).
"""

from __future__ import annotations

import datetime
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import yaml

from dlsim.api.models import as_model, check_batch
from dlsim.calibrate.compute_fit import GemmFit, MemoryFit, efficiency_curve, fit_gemm, fit_memory
from dlsim.calibrate.compute_plan import (CONV_ALGORITHMS, DEFAULT_CONV_ALGORITHM, GemmTask, Task, gemm_grid, memory_sweep,
                                          model_tasks, optimizer_sweep)
from dlsim.calibrate.compute_passes import run_passes
from dlsim.calibrate.compute_run import Backend, RunSummary
from dlsim.calibrate.compute_timer import DEVICES, KernelTimer, cache_flusher, check_device, set_threads, warm_allocator
from dlsim.calibrate.alloc_probe import allocator_in_use
from dlsim.calibrate.compute_hostinfo import host_description
from dlsim.errors import SpecError
from dlsim.cost.pricing import WHOLE_KERNEL_OPS
from dlsim.io.files import write_atomic
from dlsim.io.kernel_tables import read_table
from dlsim.io.profile_write import add_tables, write_new_profile
from dlsim.io.yamlfile import read_yaml
from dlsim.spec.model import Model
from dlsim.progress import PHASE_DONE
from dlsim.units import GBYTE_PER_S, GFLOPS, GIB, MIB, TFLOPS, US

TABLES = {"gemm": "gemm.csv", "conv": "conv.csv", "memory": "memory.csv"}
WARM_TABLES = {"gemm_warm": "gemm-warm.csv", "conv_warm": "conv-warm.csv", "memory_warm": "memory-warm.csv"}
WARM_CHOICES = ("auto", "none", "all")
"""Which models' kernels are also timed warm (back to back, no flush): those whose training step the
estimate prices partly warm (`warm_matters`), none, or all given."""


WARM_REACH = 8
"""Warm rows are timed for steps up to this many times the last-level cache: beyond it a kernel is
priced within 1/8 of its warm-cold gap of cold (`dlsim.cost.lookup.CacheAwareKernelTimes`)."""


def warm_matters(model: Any, batch: int, dtype: str, cache_bytes: float, optimizer: str = "adam") -> tuple[bool, float]:
    """Whether a training step of `model` is priced partly from warm tables, its working set
    (`dlsim.cost.memory.training_working_set`) being at most `WARM_REACH` times `cache_bytes`; and
    the working set in bytes."""
    from dlsim.cost.layers import layer_cost
    from dlsim.cost.memory import training_working_set
    costs = {layer.name: layer_cost(layer, batch, dtype) for layer in model.layers}
    ws = training_working_set(model, costs, batch, dtype, optimizer)
    return ws <= WARM_REACH * cache_bytes, ws


def framework_param_sizes(model: Any) -> tuple[int, ...] | None:
    """The model's parameter tensors as PyTorch holds them (built on the meta device: no memory),
    or None when PyTorch cannot build it."""
    try:
        from dlsim.validate.torch_model import build_torch_model
        net = build_torch_model(model, device="meta")
    except (ImportError, SpecError):
        return None
    return tuple(p.numel() for p in net.parameters())


def _resolved(name: str | Model, overrides: Mapping[str, Any] | None) -> tuple[Model, set[str]]:
    """The model `name` with the `overrides` it has a parameter for applied, and those overrides' keys."""
    model = as_model(name)
    own = {k: v for k, v in (overrides or {}).items() if k in model.params_used}
    return (as_model(name, own) if own and not isinstance(name, Model) else model), set(own)


def plan(models: Sequence[str | Model] = (), batches: Sequence[int] = (), *, overrides: Mapping[str, Any] | None = None,
         device: str = "cpu", dtypes: Sequence[str] = ("fp32",), grid: bool = True,
         algorithms: Sequence[str] | None = None, only: Callable[[Any, int, str], bool] | None = None,
         framework_sizes: bool = True) -> list[Task]:
    """The kernels to measure: the generic grids (`grid`) and every kernel of each model at its batch size.

    `models` are zoo names, YAML paths or `Model`s (an imported network: exactly its kernels).
    `batches` has one batch size per model, or one for all. `overrides` (model parameters such as
    ``seq_len``) apply to each model that has the parameter; a key no model has is an error.
    `only(model, batch, dtype)` (optional) keeps the kernels of the models it accepts. Without
    `framework_sizes` the optimizer steps run over one tensor per layer instead of the tensors PyTorch
    holds (the same table keys, without building the model in PyTorch: to check what is measured).
    """
    if models and len(batches) not in (1, len(models)):
        raise SpecError(f"give one --batch for all models or one per model ({len(models)}), got {len(batches)}",
                        field="batch")
    if algorithms is not None:
        bad = [a for a in algorithms if a not in CONV_ALGORITHMS[device]]
        if bad:
            raise SpecError(f"unknown {device} convolution algorithm {bad[0]!r} "
                            f"(use {', '.join(CONV_ALGORITHMS[device])})", field="algorithm")
    tasks: list[Task] = []
    if grid:
        tasks += gemm_grid(dtypes) + memory_sweep(dtypes) + optimizer_sweep()
    used: set[str] = set()
    for i, name in enumerate(models):
        batch = check_batch(batches[i] if len(batches) > 1 else batches[0])
        model, own = _resolved(name, overrides)
        used.update(own)
        sizes = framework_param_sizes(model) if framework_sizes else None
        for dtype in dtypes:
            if only is not None and not only(model, batch, dtype):
                continue
            tasks += model_tasks(model, batch, dtype, device, algorithms, param_sizes=sizes)
    unknown = sorted(set(overrides or {}) - used)
    if models and unknown:
        raise SpecError(f"no model given has a parameter {unknown[0]!r}", field="set")
    seen, unique = set(), []
    for t in tasks:  # the same kernel needed twice (by two models, or by a model and the grid) is measured once
        key = ("gemm", t.dtype, t.gemm) if isinstance(t, GemmTask) else (type(t).__name__, t)
        if key not in seen:
            seen.add(key)
            unique.append(t)
    return unique


def _conv_points(out: Path, dtype: str, algorithm: str) -> list[tuple[float, float]]:
    """(FLOPs, seconds) of the measured convolutions run with `algorithm`, for the roofline fit
    (2 FLOP per multiply-accumulate, the same count for all three passes)."""
    rows = read_table("conv", out / TABLES["conv"])
    return [(2.0 * r.shape.with_batch(r.n).macs, r.time_s) for r in rows if r.dtype == dtype and r.algorithm == algorithm]


def _fits(out: Path, dtypes: Iterable[str], device_rows: dict[str, float],
          algorithm: str) -> tuple[dict[str, GemmFit], MemoryFit | None]:
    launch = device_rows.get("launch_overhead_s", 0.0)
    gemm = read_table("gemm", out / TABLES["gemm"])
    grid = [r for r in gemm if r.set == "grid"]
    fits = {}
    for d in dtypes:
        fit = fit_gemm(grid, d, launch) or fit_gemm(gemm, d, launch, _conv_points(out, d, algorithm))
        if fit is not None:
            fits[d] = fit
    memory = read_table("memory", out / TABLES["memory"])
    bw = device_rows.get("stream_bandwidth_bytes_per_s")
    streaming = [r for r in memory if r.dtype == "fp32" and r.pass_name != "step" and r.op not in WHOLE_KERNEL_OPS]
    mem = fit_memory(streaming, bw, launch) if bw else None
    curves: dict[str, Any] = {"matrix": {}}
    for d, fit in fits.items():
        points = [(2.0 * r.m * r.n * r.k, r.time_s) for r in grid if r.dtype == d and r.count == 1]
        curve = efficiency_curve(points, fit.peak_flops, launch)
        if curve is not None:
            curves["matrix"][d] = curve
    if bw:
        curves["memory"] = efficiency_curve([(r.bytes, r.time_s) for r in streaming], bw, launch)
    return fits, mem, curves


def _curve_yaml(curve: tuple[tuple[float, ...], tuple[float, ...]], unit: float, key: str, indent: str,
                source: str) -> str:
    points: dict[str, str] = {}  # as written: 6 significant digits, sizes kept strictly increasing
    for x, v in zip(*curve):
        points.setdefault(_num(x / unit, 6), _num(v, 6))
    sizes, values = ", ".join(points), ", ".join(points.values())
    return (f"{indent}{key}: [{sizes}]   # measured: median size per log-size bin\n"
            f"{indent}value: [{values}]   # measured: median attained fraction of the peak per bin\n"
            f"{indent}source: \"{source}\"\n")


def _efficiency_yaml(curves: Mapping[str, Any], date: str) -> str:
    """The profile's `efficiency:` block from `_fits`'s curves (empty when none could be made)."""
    lines = ""
    for d, curve in curves.get("matrix", {}).items():
        lines += f"      {d}:\n" + _curve_yaml(curve, GFLOPS, "gflop", "        ",
                                               f"dlsim calibrate compute {date}: gemm.csv grid, {d}")
    if lines:
        lines = "    matrix:\n" + lines
    if curves.get("memory"):
        lines += "    memory:\n" + _curve_yaml(curves["memory"], MIB, "mib", "      ",
                                               f"dlsim calibrate compute {date}: memory.csv")
    return "  efficiency:   # attained fraction of the peaks by kernel size (dlsim.calibrate.compute_fit)\n" + lines \
        if lines else ""


def _device_rows(out: Path) -> dict[str, float]:
    import csv
    with open(out / "device.csv") as handle:
        return {r["quantity"]: float(r["value"]) for r in csv.DictReader(handle)}


def _num(x: float, digits: int = 4) -> str:
    """A float as YAML reads it back as a float (YAML 1.1 wants a dot in 1.0e-09)."""
    text = f"{x:.{digits}g}"
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text


def _profile_text(name: str, host: dict, fits: dict[str, GemmFit], mem: MemoryFit | None, dev: dict[str, float],
                  date: str, tables: Mapping[str, str] = TABLES, curves: Mapping[str, Any] | None = None) -> str:
    """A new profile.yaml whose every number is measured here or fitted to what was measured."""
    ref = fits.get("fp32") or next(iter(fits.values()))
    peak = ", ".join(f"{d}: {_num(f.peak_flops / TFLOPS)}" for d, f in fits.items())
    vector = dev.get("elementwise_flops_per_s", ref.peak_flops) / ref.efficiency
    bw = dev["stream_bandwidth_bytes_per_s"]
    return f"""# Measured by `dlsim calibrate compute` on {date}: {host['device']}, {host['threads']} threads,
# torch {host['torch']}. Every number below is measured on this machine or fitted to its measured tables
# (see meta.yaml, gemm.csv, conv.csv, memory.csv, device.csv); none is a datasheet value.
name: {name}
description: {host['device']} ({host['threads']} threads), measured kernel tables
nodes: 1
devices_per_node: 1
device:
  name: {host['device']}
  # measured: best GEMM throughput in gemm.csv per data type
  peak_tflops: {{{peak}}}
  # measured: softmax at 5 FLOP/element (device.csv elementwise_flops_per_s) / compute_efficiency
  vector_tflops: {{fp32: {_num(vector / TFLOPS)}}}
  memory_gib: {_num(host['memory_bytes'] / GIB)}   # read from the OS (MemTotal / device properties)
  # measured: STREAM add, torch.add(a, b, out=c) on 3 x 128 MiB (device.csv)
  memory_bandwidth_gbytes_per_s: {_num(bw / GBYTE_PER_S)}
  # measured: one tiny operator with autograd recording (device.csv)
  launch_overhead_us: {_num(dev['launch_overhead_s'] / US)}
  # fitted to the {ref.rows} GEMMs of gemm.csv (median error {ref.median_abs_rel_error:.1%}), dlsim.calibrate.compute_fit
  compute_efficiency: {_num(ref.efficiency)}
  half_efficiency_gflop: {_num(ref.half_flops / GFLOPS)}
  # fitted to the memory-bound kernels of memory.csv{f' (median error {mem.median_abs_rel_error:.1%})' if mem else ''}
  memory_efficiency: {_num(mem.efficiency if mem else 1.0)}
{_efficiency_yaml(curves or {}, date)}intra_node:
  # one device: no link is used. `dlsim calibrate comm` measures real links.
  name: none
  latency_us: 0
  bandwidth_gbytes_per_s: {_num(bw / GBYTE_PER_S)}
tables: {{{', '.join(f'{k}: {v}' for k, v in tables.items())}}}
"""


def _warm_plan(models: Sequence[str | Model], batches: Sequence[int], device: str, warm: str, flush_cache: bool,
               framework_sizes: bool = True, **kw: Any) -> tuple[list[Task], dict[str, float]]:
    """The kernels also timed warm (see `calibrate_compute`) and the working set of each model they belong to."""
    warm_models: dict[str, float] = {}
    if warm == "none" or not models or not flush_cache:
        return [], warm_models
    from dlsim.calibrate.compute_timer import last_level_cache_bytes
    cache = float(last_level_cache_bytes(device))

    def keep(model: Any, batch: int, dtype: str) -> bool:
        fits, ws = warm_matters(model, batch, dtype, cache)
        if fits or warm == "all":
            warm_models[f"{model.name} batch {batch} {dtype}"] = ws
        return fits or warm == "all"
    return plan(models, batches, device=device, grid=False, only=keep, framework_sizes=framework_sizes, **kw), warm_models


def _finished(out: Path, device: str, tasks: Sequence[Task], warm_tasks: Sequence[Task], threads: int | None,
              models: Sequence[Model]) -> dict[str, Any] | None:
    """The record of a calibration in `out` that already holds every row this one would measure (tables,
    warm tables, device rows and, on a CPU, the host probes it needs), its meta.yaml and profile.yaml;
    None when anything is missing. Reads only: no file is created or changed."""
    from dlsim.api.host_probes import needs, present
    from dlsim.calibrate.compute_run import DEVICE_QUANTITIES, missing, read_keys
    meta_path = out / "meta.yaml"
    if not meta_path.is_file() or not (out / "profile.yaml").is_file():
        return None
    meta = read_yaml(meta_path) or {}
    recorded = (meta.get("timing") or {}).get("threads")
    if not isinstance(recorded, int) or (threads is not None and threads != recorded) or \
            (device == "cpu" and not meta.get("host")):
        return None
    if missing(tasks, out) or missing(warm_tasks, out, "-warm"):
        return None
    device_rows = read_keys(out / "device.csv", "device")
    if any((q,) not in device_rows for q in DEVICE_QUANTITIES):
        return None
    if device == "cpu" and not present(lambda q: (q,) in device_rows, needs(models, recorded)):
        return None
    return {"kind": "calibrate-compute", "out": str(out), "device": (meta.get("device") or {}).get("device", device),
            "tasks": len(tasks) + len(warm_tasks), "measured": 0, "already_measured": len(tasks) + len(warm_tasks),
            "failed": [], "dropped_partial_lines": [], "seconds": 0.0, "nothing_to_do": True,
            "profile": [f"unchanged: every kernel and probe this calibration needs is already in {out} "
                        f"(measured with {recorded} threads; nothing was measured or written)"],
            "fitted": meta.get("fitted", {}), "measured_device": meta.get("measured", {}), "warnings": []}


def calibrate_compute(out: str | Path, *, device: str = "cpu", models: Sequence[str | Model] = (), batches: Sequence[int] = (1,),
                      overrides: Mapping[str, Any] | None = None, dtypes: Sequence[str] = ("fp32",), grid: bool = True,
                      algorithms: Sequence[str] | None = None, threads: int | None = None, repeats: int = 5,
                      flush_cache: bool = True, statistic: str = "median", warm: str = "auto", passes: int = 1,
                      reuse_probes: bool = True, command: str = "",
                      progress: Callable[[int, int, str, str], None] | None = None) -> dict[str, Any]:
    """Measure kernels into the profile directory `out` (see the module docstring); returns a summary record.

    `warm` ("auto", "none", "all"): the kernels of the models whose training step the estimate
    prices partly from warm tables ("auto": `warm_matters`), of none, or of all given models are
    also timed warm (back to back, no flush) into the ``-warm`` tables, which
    `dlsim.cost.lookup.CacheAwareKernelTimes` mixes with the cold ones.

    `passes` > 1 times every kernel once per pass, in a fresh random order each pass, and keeps the
    `statistic` over the passes (`dlsim.calibrate.compute_passes`: time-correlated noise of a shared
    machine then cannot shift a whole region of a table).

    On a CPU the host probes the models' predictions need run first (`dlsim.api.host_probes`), each
    taken from this host's cache when it was measured here before (`reuse_probes`). A calibration whose
    every row is already in `out` returns at once and writes nothing (``nothing_to_do`` in the record)."""
    if warm not in WARM_CHOICES:
        raise SpecError(f"unknown warm choice {warm!r} (use {', '.join(WARM_CHOICES)})", field="warm")
    if passes < 1:
        raise SpecError(f"passes must be at least 1, got {passes}", field="passes")
    if device not in DEVICES:
        check_device(device)  # the one-line error for an unknown device
    out = Path(out)
    kw = dict(overrides=overrides, dtypes=dtypes, algorithms=algorithms)
    model_objects = [_resolved(m, overrides)[0] for m in models]
    keys = plan(models, batches, device=device, grid=grid, framework_sizes=False, **kw)
    warm_keys, _ = _warm_plan(models, batches, device, warm, flush_cache, framework_sizes=False, **kw)
    done = _finished(out, device, keys, warm_keys, threads, model_objects)
    if done is not None:
        return done
    check_device(device)
    tasks = plan(models, batches, device=device, grid=grid, **kw)
    threads_used = set_threads(threads)
    backend = Backend.create(device)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    timer = KernelTimer(device, repeats=repeats, flush=cache_flusher(device) if flush_cache else None,
                        statistic=statistic, events=True)
    from dlsim.calibrate.health import LoadWatch, quantisation_warning
    watch = LoadWatch(threads=threads_used or 1).start()
    probes, grid_record = None, None
    if device == "cpu":  # the host probes first (the kernels are timed in the allocator regime they run in)
        from dlsim.api.host_grid import grid_params, grid_tasks, keep_grid, reuse_grid
        from dlsim.api.host_probes import needs, run_probes
        from dlsim.calibrate.compute_run import open_tables
        from dlsim.calibrate.host_probe import host_key
        from dlsim.io.host_cache import HostCache
        cache = HostCache(host_key())
        warm_allocator()
        probes = run_probes(open_tables(out)["device"], needs(model_objects, threads_used), reuse=reuse_probes,
                            cache=cache, progress=progress)
        if progress:
            progress(0, len(tasks), "probes", PHASE_DONE)
        generic = grid_tasks(tasks)
        if generic:  # the generic grid: this host's, measured once (dlsim.api.host_grid)
            gparams = grid_params(generic, dtypes=dtypes, threads=threads_used, repeats=repeats, flush=flush_cache,
                                  statistic=statistic, passes=passes)
            copied, entry = reuse_grid(out, generic, gparams, cache) if reuse_probes else (0, None)
            grid_record = {"kernels": len(generic), "copied_from_host_cache": copied,
                           **({"measured": entry.measured, "cache": str(entry.path)} if entry is not None else {})}
    from dlsim.calibrate.compute_run import missing
    todo = missing(tasks, out)
    summary: RunSummary = run_passes(todo, out, backend, timer, passes, statistic=statistic, progress=progress)
    summary.skipped += len(tasks) - len(todo)
    if grid_record is not None and not grid_record["copied_from_host_cache"]:
        kept = keep_grid(out, generic, gparams, cache, summary.seconds)
        grid_record["kept_in_host_cache"] = str(kept.path) if kept is not None else None
    warm_tasks, warm_models = _warm_plan(models, batches, device, warm, flush_cache, **kw)
    if warm_tasks:
        warm_timer = KernelTimer(device, repeats=repeats, flush=None, statistic=statistic, events=True)
        w = run_passes(warm_tasks, out, backend, warm_timer, passes, suffix="-warm", statistic=statistic,
                       device_params=False, progress=progress)
        summary.measured += w.measured
        summary.skipped += w.skipped
        summary.failed += w.failed
        summary.seconds += w.seconds
        summary.times += w.times
        tasks = tasks + warm_tasks
    warnings = [w for w in (quantisation_warning(summary.times), watch.warning()) if w]
    run = {"models": [m if isinstance(m, str) else m.name for m in models], "batches": list(batches),
           "overrides": dict(overrides or {}), "dtypes": list(dtypes), "grid": grid, "passes": passes,
           "warm": warm, "warm_models_working_set_bytes": warm_models}
    method = (f"{statistic} of single calls, each after a cache flush" if flush_cache else
              f"{statistic} over blocks of back-to-back calls") + ", after two warm-up calls" + \
        (f"; {statistic} over {passes} shuffled passes" if passes > 1 else "") + f" ({timer.method})"
    extra = {**({"probes": probes.to_dict()} if probes is not None else {}),
             **({"grid_rows": grid_record} if grid_record is not None else {})}
    return _record(out, device, dtypes, threads_used, summary, len(tasks), started, command, run, warnings,
                   extra, reuse_probes, {"repeats": repeats, "passes": passes, "threads": threads_used, "flush_cache": flush_cache,
                    "statistic": statistic, "method": method,
                    "warm_tables": f"{statistic} over blocks of back-to-back calls (no flush), for the kernels of "
                                   "models whose training step is at most 8x the last-level cache"})


def calibrate_tasks(out: str | Path, tasks: Sequence[Task], *, device: str = "cpu", dtypes: Sequence[str] = ("fp32",),
                    threads: int | None = None, repeats: int = 5, flush_cache: bool = True, statistic: str = "median",
                    seed: int | None = None, stop: Callable[[], bool] | None = None,
                    command: str = "", run: Mapping[str, Any] | None = None,
                    progress: Callable[[int, int, str, str], None] | None = None) -> dict[str, Any]:
    """Measure the given `tasks` (kernels planned by the caller) into the profile directory `out`, exactly
    as `calibrate_compute` measures its plan: the same timer (CUDA events on a GPU), resumable tables,
    meta.yaml and a new profile.yaml fitted on the `dtypes` measured (or only the tables added to an
    existing one). With `seed` the tasks run in that seeded random order; `stop()` (a time budget) is
    asked before each kernel; `run` adds fields to meta.yaml's
    entry for this run. Returns the summary record of `calibrate_compute`, with ``stopped`` (kernels
    left unmeasured)."""
    from dlsim.calibrate.compute_passes import shuffled
    from dlsim.calibrate.compute_run import run_calibration
    out = Path(out)
    check_device(device)
    threads_used = set_threads(threads)
    backend = Backend.create(device)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    timer = KernelTimer(device, repeats=repeats, flush=cache_flusher(device) if flush_cache else None,
                        statistic=statistic, events=True)
    order = shuffled(tasks, seed) if seed is not None else list(tasks)
    summary = run_calibration(order, out, backend, timer, progress=progress, stop=stop)
    from dlsim.calibrate.health import quantisation_warning
    warnings = [w for w in (quantisation_warning(summary.times),) if w]
    method = (f"{statistic} of single calls, each after a cache flush" if flush_cache else
              f"{statistic} over blocks of back-to-back calls") + ", after two warm-up calls" + \
        (f", kernels in a random order (seed {seed})" if seed is not None else "") + f" ({timer.method})"
    rec = _record(out, device, dtypes, threads_used, summary, len(tasks), started, command,
                  {"dtypes": list(dtypes), "seed": seed, "stopped": summary.stopped, **dict(run or {})}, warnings,
                  {}, True, {"repeats": repeats, "passes": 1, "threads": threads_used, "flush_cache": flush_cache,
                   "statistic": statistic, "method": method})
    rec["stopped"] = summary.stopped
    return rec


def _record(out: Path, device: str, dtypes: Sequence[str], threads_used: int, summary: RunSummary, tasks: int,
            started: str, command: str, run: Mapping[str, Any], warnings: list[str], extra: Mapping[str, Any],
            reuse_probes: bool, timing: Mapping[str, Any]) -> dict[str, Any]:
    """meta.yaml (this run appended to its runs), the fits, and profile.yaml (new, or its tables added) of
    a calibration into `out`; the summary record. `extra` (the host probes and grid rows of a CPU run) goes
    into both; `reuse_probes`: the host's reference speeds may come from its cache."""
    dev = _device_rows(out)
    fits, mem, curves = _fits(out, dtypes, dev, DEFAULT_CONV_ALGORITHM[device])
    host = host_description(device, threads_used)
    meta_path = out / "meta.yaml"
    meta = (read_yaml(meta_path) or {}) if meta_path.exists() else {}
    host_block = meta.get("host")
    if device == "cpu":  # the host the tables were measured on (dlsim.calibrate.host_probe); kept from the first run
        from dlsim.calibrate.host_probe import compare_hosts, host_record
        if host_block is None:
            from dlsim.api.host_probes import reference_speeds
            host_block = host_record(threads_used, lambda t: reference_speeds(t, reuse=reuse_probes)[0])
        elif not (same := compare_hosts(host_block, speeds=None)).same:
            warnings.append(f"this run added rows on a host other than the one meta.yaml records (differs in "
                            f"{', '.join(same.differences)}): the tables now mix two hosts")
    runs = list(meta.get("runs", [])) + [{
        "date": started, "command": command or " ".join(sys.argv), **run, "threads": threads_used,
        "flush_cache": timing["flush_cache"], "statistic": timing["statistic"], "tasks": tasks,
        "measured": summary.measured, "already_measured": summary.skipped, "failed": summary.failed,
        "seconds": round(summary.seconds, 1), **extra, **({"warnings": warnings} if warnings else {})}]
    meta = {"device": host, **({"host": host_block} if host_block else {}),
            "defaults": {"conv_algorithm": DEFAULT_CONV_ALGORITHM[device]},
            "conv_algorithms": list(CONV_ALGORITHMS[device]),
            "measured": {k: v for k, v in dev.items()},
            "fitted": {**{f"gemm_{d}": asdict(f) for d, f in fits.items()}, **({"memory": asdict(mem)} if mem else {})},
            "timing": dict(timing),
            "allocator": {"tables": "retained: mallopt(M_MMAP_MAX, 0) and mallopt(M_TRIM_THRESHOLD, INT_MAX) "
                                    "(dlsim.calibrate.compute_timer.warm_allocator); kernels timed without page faults",
                          "fresh_memory": "device.csv fresh_memory_s_per_byte_t<threads>: a default glibc process's "
                                          "cost per fresh byte; heap_refault_fraction: the share of a step's "
                                          "allocated bytes it faults in again; charged by the estimate (allocator "
                                          "default)" if device == "cpu" else "not measured",
                          "process": allocator_in_use()},
            "runs": runs, **{k: meta[k] for k in ("checks",) if k in meta}}
    write_atomic(meta_path, yaml.safe_dump(meta, sort_keys=False, width=120))
    profile = out / "profile.yaml"
    tables = {**TABLES, **{k: v for k, v in WARM_TABLES.items() if (out / v).exists()}}
    if profile.exists():
        changes = add_tables(profile, tables)
    elif fits:
        write_new_profile(profile, _profile_text(out.name, host, fits, mem, dev, started, tables, curves))
        changes = ["profile.yaml: written"]
    else:
        changes = ["profile.yaml: not written (too few GEMM or convolution rows to fit the roofline; run with the grid)"]
    return {"kind": "calibrate-compute", "out": str(out), "device": host["device"], "tasks": tasks,
            "measured": summary.measured, "already_measured": summary.skipped, "failed": summary.failed,
            "dropped_partial_lines": summary.dropped_partial, "seconds": summary.seconds, "profile": changes,
            **extra, "fitted": meta["fitted"], "measured_device": meta["measured"], "warnings": warnings}
