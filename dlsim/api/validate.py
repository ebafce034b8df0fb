"""`validate_model()` and `validate_kernels()`: dlsim's predictions against real PyTorch runs.

`validate_model` builds the model in PyTorch (`dlsim.validate.torch_model`), times real training
iterations (`dlsim.validate.compute_iteration`: forward, backward, optimizer step; per layer with
hooks) and predicts the same iteration with `dlsim.api.estimate.estimate` on the given profile.
Errors are signed relative errors (predicted − measured) / measured.

`validate_kernels` times held-out GEMM and convolution shapes (`dlsim.validate.compute_heldout`)
that the profile's tables do not contain and compares them with the table lookup.
"""

from __future__ import annotations

import functools
import re
import math
import random
import statistics
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from dlsim.api.estimate import estimate
from dlsim.api.models import as_cluster, as_model, check_batch, check_dtype
from dlsim.calibrate.compute_ops import conv_algorithm, conv_fn, gemm_fn, make_optimizer
from dlsim.calibrate.compute_plan import DEFAULT_CONV_ALGORITHM
from dlsim.calibrate.compute_timer import (STATISTICS, KernelTimer, cache_flusher, check_device, set_threads,
                                           warm_allocator)
from dlsim.cost.allocation import FreshPageSplit
from dlsim.cost.layers import layer_cost
from dlsim.cost.lookup import GEMM_METHODS
from dlsim.cost.pricing import price_pass
from dlsim.errors import SpecError, excerpt
from dlsim.units import DTYPE_BYTES
from dlsim.io.allocator_table import allocator_cost
from dlsim.io.kernel_tables import load_kernel_times, read_meta_defaults, read_table
from dlsim.progress import PHASE_RUNNING, PHASE_WAITING
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.validate.compute_heldout import conv_layer, heldout_convs, heldout_gemms, nearest_measured
from dlsim.validate.compute_iteration import IterationRunner, interleaved_iterations, measure_iteration
from dlsim.api.validate_workers import WorkerRunner

SCHEMA_VERSION = 1


def rel_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured > 0 else float("nan")


def _finite(x: float | None) -> float | None:
    """`x`, or None where it is not a finite number (a time not measured, an error of a zero time): a record
    says what it does not know instead of holding NaN, which no JSON reader accepts."""
    return x if x is not None and math.isfinite(x) else None


def error_summary(errors: list[float]) -> dict[str, float]:
    """Median, 90th percentile and worst absolute relative error."""
    a = sorted(abs(e) for e in errors if e == e)
    if not a:
        return {"count": 0}
    p90 = a[min(len(a) - 1, int(round(0.9 * (len(a) - 1))))]
    return {"count": len(a), "median_abs": statistics.median(a), "p90_abs": p90, "max_abs": a[-1],
            "mean_signed": statistics.fmean(e for e in errors if e == e)}


def validate_model(model: Model | str | Path, cluster: Cluster | str | Path, batch: int, *, device: str = "cpu",
                   dtype: str | None = None, optimizer: str = "adam", repeats: int = 5, warmup: int = 2,
                   per_layer: bool = True, threads: int | None = None, overrides: Mapping[str, Any] | None = None,
                   attention: str = "math", statistic: str = "median", allocator: str = "default",
                   progress: Callable[[int, int, str, str], None] | None = None) -> dict[str, Any]:
    """Predicted vs measured training iteration of `model` (see the module docstring); a result record.
    `progress` hears of every training step (`measure_iteration`, `dlsim.progress.Progress.callback`).

    `allocator` is the process measured and predicted: ``default`` (the C library as it comes; glibc
    maps large tensors afresh every step and the prediction charges that, `dlsim.cost.allocation`),
    ``retained`` (freed memory kept, `dlsim.calibrate.compute_timer.retain_freed_memory`, the regime
    the kernel tables were timed in) or the name of an allocator preloaded into this process."""
    model, cluster = as_model(model, overrides), as_cluster(cluster)
    batch, dtype = check_batch(batch), check_dtype(dtype, model)
    if repeats < 1 or warmup < 0:
        raise SpecError("repeats must be >= 1 and warmup >= 0", field="repeats")
    if statistic not in STATISTICS:
        raise SpecError(f"unknown statistic {statistic!r} (use {' or '.join(STATISTICS)})", field="statistic")
    check_device(device)
    set_threads(threads)
    regime = set_allocator(allocator)
    predicted = estimate(model, cluster, batch, dtype=dtype, optimizer=optimizer, allocator=regime)
    measured = measure_iteration(model, batch, make_optimizer, device=device, dtype=dtype, optimizer=optimizer,
                                 warmup=warmup, repeats=repeats, per_layer=per_layer, attention=attention,
                                 progress=progress)
    return _model_record(model, cluster, batch, device, dtype, optimizer, predicted, measured, statistic, regime,
                         repeats)


def set_allocator(allocator: str) -> str:
    """Put this process in the allocator regime `allocator` (see `validate_model`); the regime in effect."""
    from dlsim.calibrate.alloc_probe import allocator_in_use
    from dlsim.cost.allocation import REGIMES
    in_use = allocator_in_use()
    if allocator not in REGIMES:
        raise SpecError(f"unknown allocator {allocator!r} (use {', '.join(REGIMES)})", field="allocator")
    if allocator == "retained":
        return "retained" if warm_allocator() else in_use
    if allocator == "default":
        return "default" if in_use == "glibc" else in_use
    if allocator != in_use:
        raise SpecError(f"allocator {allocator} is not loaded in this process (start it with LD_PRELOAD=lib"
                        f"{allocator}.so)", field="allocator")
    return allocator


def validate_models(entries: Sequence[tuple[str | Model, int, Mapping[str, Any]]], cluster: Cluster | str | Path, *,
                    rounds: int = 5, device: str = "cpu", optimizer: str = "adam", per_layer_repeats: int = 3,
                    threads: int | None = None, attention: str = "math", statistic: str = "min",
                    min_round_s: float = 0.3, isolate: bool = True, allocator: str = "default",
                    progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """`validate_model` for several (model, batch, overrides) at once, their iterations timed in round
    robin (`dlsim.validate.compute_iteration.interleaved_iterations`): drift of a shared machine hits
    all models alike. With `isolate` (default) each model runs in a process of its own
    (`dlsim.api.validate_workers`), as a training job does; otherwise all in this process.
    One record per model, as `validate_model` gives."""
    cluster = as_cluster(cluster)
    if rounds < 1:
        raise SpecError("rounds must be >= 1", field="rounds")
    if statistic not in STATISTICS:
        raise SpecError(f"unknown statistic {statistic!r} (use {' or '.join(STATISTICS)})", field="statistic")
    check_device(device)
    threads_used = set_threads(threads)
    regime = set_allocator(allocator)
    models = [as_model(m, o) for m, _, o in entries]
    batches = [check_batch(b) for _, b, _ in entries]
    runners: list[Any] = []
    try:
        for m, b, (_, _, o) in zip(models, batches, entries):
            runners.append(WorkerRunner(m, b, overrides=o, device=device, optimizer=optimizer, attention=attention,
                                        threads=threads_used, retain_memory=regime == "retained") if isolate else
                           IterationRunner(m, b, make_optimizer, device=device, dtype=m.dtype, optimizer=optimizer,
                                           attention=attention))
        measured = interleaved_iterations(runners, rounds, min_round_s=min_round_s, per_layer_repeats=per_layer_repeats,
                                          progress=(lambda r, n: progress(f"round {r}/{n}")) if progress else None)
    finally:
        for run in runners:
            if isolate:
                run.close()
    out = []
    for m, b, meas in zip(models, batches, measured):
        predicted = estimate(m, cluster, b, dtype=m.dtype, optimizer=optimizer, allocator=regime)
        rec = _model_record(m, cluster, b, device, m.dtype, optimizer, predicted, meas, statistic, regime,
                            len(meas.samples))
        rec["threads"], rec["interleaved_rounds"] = threads_used, rounds
        rec["process"] = "one per model" if isolate else "shared by all models"
        out.append(rec)
    return out


def _model_record(model: Model, cluster: Cluster, batch: int, device: str, dtype: str, optimizer: str,
                  predicted: Any, measured: Any, statistic: str, regime: str, repeats: int) -> dict[str, Any]:
    """The validate-model record: predicted vs measured per phase and per layer."""
    threads_used = measured.threads
    pred = predicted.to_dict()
    measured_layers, mph = measured.layers(statistic), measured.phases(statistic)
    tag = {"measured": "M", "interpolated": "I", "extrapolated": "X", "model": "R"}
    layers = []
    for t in predicted.layers:
        mf, mb = (_finite(x) for x in measured_layers.get(t.name, (None, None)))
        pf, pb = t.forward.seconds, t.backward_data.seconds + t.backward_weight.seconds
        both = mf + mb if mf is not None and mb is not None else None
        layers.append({"name": t.name, "type": t.type, "predicted_forward_s": pf, "measured_forward_s": mf,
                       "predicted_backward_s": pb, "measured_backward_s": mb, "predicted_s": pf + pb,
                       "measured_s": both, "error": _finite(rel_error(pf + pb, both)) if both is not None else None,
                       "source": "".join(tag[e.source.value] for e in (t.forward, t.backward_data, t.backward_weight))})
    timed = [r for r in layers if r["measured_s"] is not None]
    total = mph["iteration"]
    big = [r["error"] for r in timed if r["error"] is not None and r["measured_s"] >= 0.01 * total]
    weighted = sum(abs(r["predicted_s"] - r["measured_s"]) for r in timed)
    why = ("" if timed else "not measured (--no-layers)" if not measured_layers else
           "not measured: no layer's hooks recorded a time")
    phases = {"iteration": (pred["iteration_time_s"], mph["iteration"]),
              "forward": (pred["forward_time_s"], mph["forward"]),
              "backward": (pred["backward_time_s"], mph["backward"]),
              "optimizer": (pred["optimizer_time_s"], mph["optimizer"])}
    return {
        "schema_version": SCHEMA_VERSION, "kind": "validate-model", "model": model.name, "cluster": cluster.name,
        "device": device, "batch": batch, "dtype": dtype, "optimizer": optimizer,
        "optimizer_impl": measured.optimizer_impl, "threads": threads_used, "repeats": repeats,
        "statistic": statistic, "allocator": regime, "assumed": {**pred.get("assumed", {}), "allocator": regime},
        "predicted": {f"{k}_s": p for k, (p, _) in phases.items()},
        "measured": {**{f"{k}_s": m for k, (_, m) in phases.items()},
                     "iteration_samples_s": list(measured.iteration_samples), "spread": measured.spread},
        "error": {k: _finite(rel_error(p, m)) for k, (p, m) in phases.items()},
        "time_by_source_s": pred["time_by_source_s"], "measured_share": pred["measured_share"],
        "per_layer": {"measured": bool(timed), **({"why": why} if why else {}),
                      "layers_over_1pct": error_summary(big),
                      "time_weighted_abs_error": weighted / sum(r["measured_s"] for r in timed)
                      if timed and sum(r["measured_s"] for r in timed) > 0 else None,
                      "measured_layer_sum_s": sum(r["measured_s"] for r in timed) if timed else None},
        "layers": layers, "notes": pred["notes"],
        **({"warnings": pred["warnings"]} if pred.get("warnings") else {}),
        **({"host": pred["host"]} if pred.get("host") else {}),
        **({"fresh_pages": split.to_dict()} if (split := fresh_page_split(
            cluster, predicted, mph["iteration"], measured.faulted_bytes_per_step)) is not None else {}),
    }


def fresh_page_split(cluster: Cluster, predicted: Any, measured_s: float,
                     faulted_bytes: float | None) -> FreshPageSplit | None:
    """The step's fresh pages, predicted and measured (minor faults x page size per step), set apart at the
    profile's measured cost of a fresh byte; None where the profile measured no such cost or nothing was
    counted."""
    if faulted_bytes is None:
        return None
    rate = allocator_cost(cluster, "default")[0]
    if rate.regime != "default" or rate.seconds_per_byte <= 0:
        return None
    return FreshPageSplit(predicted.iteration_time_s, predicted.fresh_pages_s, measured_s, faulted_bytes,
                          rate.seconds_per_byte)


def _conv_default(cluster: Cluster) -> str | None:
    return read_meta_defaults(Path(cluster.source).parent).get("conv_algorithm") if cluster.source else None


def _calibration_flushed(cluster: Cluster) -> bool:
    """Whether the profile's tables were timed after a cache flush (meta.yaml timing.flush_cache): held-out
    kernels are timed the same way, or the comparison measures cache state, not the lookup."""
    from dlsim.io.yamlfile import read_yaml
    meta = Path(cluster.source).parent / "meta.yaml" if cluster.source else None
    if meta is None or not meta.exists():
        return False
    return bool(((read_yaml(meta) or {}).get("timing") or {}).get("flush_cache", False))


def validate_kernels(cluster: Cluster | str | Path, *, device: str = "cpu", dtype: str = "fp32", gemms: int = 40,
                     convs: int = 20, seed: int = 0, threads: int | None = None, repeats: int = 5,
                     statistic: str = "median", passes: int = 1, anchors: int = 0,
                     progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Held-out GEMM and convolution shapes: measured now vs looked up in `cluster`'s tables.

    With `passes` > 1 every kernel is timed once per pass, the kernels in a fresh shuffled order each pass
    (seeded), and its time is the minimum (statistic min) or median over the passes: a slow drift or a
    disturbed minute of a shared machine then hits a different kernel each pass instead of one kernel's whole
    measurement — the same round-robin method as the model validation (`interleaved_iterations`).

    With `anchors` > 0 the `anchors` measured table shapes nearest to each held-out GEMM are timed too, in
    the same passes. Their drift d = exp(mean log(measured / table)) is how much slower (d > 1) the machine
    is now than when it was calibrated, near that shape; each GEMM row then also carries the drift-removed
    error predicted / (measured / d) − 1, the part of the error the lookup makes."""
    if passes < 1:
        raise SpecError(f"passes must be at least 1, got {passes}", field="passes")
    if anchors < 0:
        raise SpecError(f"anchors must be at least 0, got {anchors}", field="anchors")
    for name, value in (("gemms", gemms), ("convs", convs), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "repeats" else 0):
            raise SpecError(f"must be a {'positive' if name == 'repeats' else 'non-negative'} integer, got "
                            f"{excerpt(value, 40)}", field=name)
    if gemms == 0 and convs == 0:
        raise SpecError("nothing to validate: give --gemms or --convs a count above 0", field="gemms")
    if dtype not in DTYPE_BYTES or dtype.startswith("int"):
        raise SpecError(f"unknown dtype {excerpt(dtype, 40)} (use {', '.join(FLOAT_DTYPES)})", field="dtype")
    cluster = as_cluster(cluster)
    if "gemm" not in cluster.tables:
        raise SpecError("has no gemm table to validate (run dlsim calibrate compute first)", path=cluster.source)
    check_device(device)
    threads_used = set_threads(threads)
    import torch
    dev = torch.device(device)
    warm_allocator()
    timer = KernelTimer(device, repeats=repeats, statistic=statistic,
                        flush=cache_flusher(device) if _calibration_flushed(cluster) else None)
    tables, _ = load_kernel_times(cluster)
    alternatives = {m: load_kernel_times(cluster, gemm_method=m)[0] for m in GEMM_METHODS if m != GEMM_METHODS[0]}
    gemm_rows = []
    gemm_table = read_table("gemm", cluster.tables["gemm"])
    held = heldout_gemms(gemm_table, dtype, gemms, seed)
    near = nearest_measured(gemm_table, held, dtype, anchors) if anchors else [[] for _ in held]
    anchor_shapes = sorted({a for shapes in near for a in shapes}, key=lambda a: (a.m, a.n, a.k))
    times = _timed_in_passes([gemm_fn(g, dtype, dev) for g in held + anchor_shapes], timer, passes, statistic, seed,
                             progress, "GEMMs")
    gemm_times = times[:len(held)]
    drift_of = {a: t / tables.gemm(a, dtype).seconds for a, t in zip(anchor_shapes, times[len(held):])}
    for g, t, shapes in zip(held, gemm_times, near):
        est = tables.gemm(g, dtype)
        row = {"m": g.m, "n": g.n, "k": g.k, "measured_s": t, "predicted_s": est.seconds,
               "source": est.source.value, "method": GEMM_METHODS[0], "error": rel_error(est.seconds, t),
               **{f"{m}_error": rel_error(alt.gemm(g, dtype).seconds, t) for m, alt in alternatives.items()}}
        if shapes:
            drift = math.exp(statistics.fmean(math.log(drift_of[a]) for a in shapes))
            row.update(anchors=[[a.m, a.n, a.k] for a in shapes], drift=drift,
                       drift_removed_error=rel_error(est.seconds, t / drift))
        gemm_rows.append(row)
        if progress:
            progress(f"gemm {g.m}x{g.n}x{g.k}: measured {t:.3g} s, predicted {est.seconds:.3g} s ({est.source.value})")
    conv_rows = []
    algo = _conv_default(cluster)
    if "conv" in cluster.tables and convs > 0:
        rows = read_table("conv", cluster.tables["conv"])
        held_convs = heldout_convs([r for r in rows if r.dtype == dtype], algo, convs, seed)
        with conv_algorithm(algo or DEFAULT_CONV_ALGORITHM[device]):
            fns = [conv_fn(shape, n, pass_name, dtype, dev)[0] for pass_name, shape, n, _ in held_convs]
            conv_times = _timed_in_passes(fns, timer, passes, statistic, seed, progress, "convolutions")
        for (pass_name, shape, n, kind), t in zip(held_convs, conv_times):
            cost = layer_cost(conv_layer(shape), n, dtype)
            est = price_pass(getattr(cost, pass_name), "conv2d", pass_name, cluster.device, dtype, tables, cost.conv)
            conv_rows.append({"pass": pass_name, "shape": shape.signature, "n": n, "kind": kind, "measured_s": t,
                              "predicted_s": est.seconds, "source": est.source.value, "error": rel_error(est.seconds, t)})
            if progress:
                progress(f"conv {pass_name} {shape.signature} n{n} ({kind}): measured {t:.3g} s, predicted "
                         f"{est.seconds:.3g} s ({est.source.value})")
    by_kind = {k: error_summary([r["error"] for r in conv_rows if r["kind"] == k]) for k in ("new-batch", "new-geometry")}
    return {"schema_version": SCHEMA_VERSION, "kind": "validate-kernels", "cluster": cluster.name, "device": device,
            "dtype": dtype, "threads": threads_used, "seed": seed, "statistic": statistic, "passes": passes,
            "flush_cache": timer.flush is not None,
            "anchors": anchors,
            "gemm": {"summary": error_summary([r["error"] for r in gemm_rows]),
                     "anchor_summary": error_summary([d - 1.0 for d in drift_of.values()]),
                     "drift_removed_summary": error_summary([r["drift_removed_error"] for r in gemm_rows
                                                             if "drift_removed_error" in r]),
                     **{f"{m}_summary": error_summary([r[f"{m}_error"] for r in gemm_rows]) for m in alternatives},
                     "rows": gemm_rows},
            "conv": {"summary": error_summary([r["error"] for r in conv_rows]), "by_kind": by_kind,
                     "algorithm": algo, "rows": conv_rows}}


def _timed_in_passes(fns: list[Callable[[], Any]], timer: Any, passes: int, statistic: str, seed: int,
                     progress: Callable[[str], None] | None = None, what: str = "kernels") -> list[float]:
    """Seconds per kernel: `timer` once per pass, kernels shuffled per pass, then min or median over passes."""
    samples: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    rng = random.Random(seed)
    for _ in range(passes):
        if passes > 1:
            rng.shuffle(order)
        for i in order:
            samples[i].append(timer.time(fns[i]).seconds)
            if progress:
                done = sum(len(s) for s in samples)
                progress(f"[{done}/{len(fns) * passes}] timing {what}")
    pick = min if statistic == "min" else statistics.median
    return [pick(s) for s in samples]


LINK_SIZES = tuple(4**e for e in range(5, 13))  # 1 KiB … 16 MiB


def fit_link(rows: list[dict[str, float]], key: str = "one_way_s", min_bytes: float = 256 * 1024) -> dict[str, float]:
    """Hockney's point-to-point model ``t(n) = α + n·β`` (Hockney, Parallel Computing 20(3), 1994;
    algorithms.md §2) from ping-pong rows: α is the one-way time of the smallest message (the
    usual ping-pong latency) and β the slope of a line through the messages of at least
    `min_bytes` (least squares on the relative error, `dlsim.calibrate.compute_fit.relative_line`).
    Small messages are left out of β because a token-bucket link (tc tbf, `burst` 64 KiB in
    `EmulatedCluster`) sends up to a bucket at line rate: only larger messages see the limited
    rate. Returns α, the bandwidth 1/β and the model's median relative error over all rows."""
    from dlsim.calibrate.compute_fit import relative_line
    rows = sorted(rows, key=lambda r: r["bytes"])
    big = [r for r in rows if r["bytes"] >= min_bytes]
    if len(big) < 2:
        raise SpecError(f"need ping-pong sizes of at least {min_bytes:.0f} bytes (two or more) to fit a bandwidth")
    beta, _ = relative_line([float(r["bytes"]) for r in big], [float(r[key]) for r in big])
    if beta <= 0:
        raise SpecError("the ping-pong times do not grow with the message size: no bandwidth to fit")
    alpha = float(rows[0][key])
    errors = [abs(alpha + beta * r["bytes"] - r[key]) / r[key] for r in rows]
    return {"latency_s": alpha, "bandwidth_bytes_per_s": 1.0 / beta, "median_abs_rel_error": statistics.median(errors),
            "large_message_median_abs_rel_error": statistics.median(errors[len(rows) - len(big):]),
            "points": len(rows), "min_bytes_for_bandwidth": min_bytes}


def ddp_profile_text(compute_profile: Path, link: dict[str, float], *, hosts: int, rate: str, name: str) -> str:
    """profile.yaml text for `hosts` emulated hosts of one device each: the device and kernel tables of
    `compute_profile` (calibrated with the thread count one rank runs) joined by a switch whose
    per-port latency and bandwidth are the fitted Hockney α and 1/β of the emulated link."""
    import yaml

    from dlsim.io.yamlfile import read_yaml
    from dlsim.units import GBYTE_PER_S, US
    base = read_yaml(compute_profile)
    if not isinstance(base, dict) or "device" not in base:
        raise SpecError("not a profile with a device", path=compute_profile)
    dev = base["device"]
    data = {"name": name, "description": f"{hosts} emulated hosts (network namespaces, tbf {rate} per port) of "
                                         f"{dev['name']}",
            "nodes": hosts, "devices_per_node": 1, "device": dev,
            "intra_node": {"name": "none", "latency_us": 0, "bandwidth_gbytes_per_s": dev["memory_bandwidth_gbytes_per_s"]},
            "inter_node": {"name": f"emulated-tbf-{rate}", "topology": "switch",
                           "latency_us": round(link["latency_s"] / US, 3),
                           "bandwidth_gbytes_per_s": round(link["bandwidth_bytes_per_s"] / GBYTE_PER_S, 6)},
            "tables": base.get("tables", {})}
    head = (f"# Written by `dlsim validate ddp`: the device and kernel tables of {compute_profile.parent.name}/\n"
            f"# (measured with the thread count of one rank) on {hosts} hosts of the emulated cluster; inter_node is the\n"
            f"# Hockney fit of a gloo ping-pong on the same emulated link ({link['points']} sizes, median error "
            f"{link['median_abs_rel_error']:.1%}).\n")
    return head + yaml.safe_dump(data, sort_keys=False, width=120)


FLOAT_DTYPES = tuple(d for d in DTYPE_BYTES if not d.startswith("int"))

TC_RATE = re.compile(r"^(\d+(\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$", re.IGNORECASE)
"""A rate as tc(8) reads it: a number and one of its units (``200mbit``, ``1gbit``, ``25mbps``)."""


def check_ddp_options(*, rate: str, optimizer: str, repeats: int, warmup: int, link_repeats: int,
                      bucket_mib: float, threads: int) -> None:
    """Every option of `validate_ddp` that can be wrong, checked before the emulated cluster is built."""
    from dlsim.api.limits import MAX_BUCKET, MIN_BUCKET
    from dlsim.calibrate.compute_ops import OPTIMIZER_NAMES
    from dlsim.units import MIB
    found = TC_RATE.match(rate) if isinstance(rate, str) else None
    if found is None or float(found.group(1)) <= 0:
        raise SpecError(f"must be a positive tc rate such as 200mbit or 1gbit, got {excerpt(rate, 40)}", field="rate")
    if optimizer not in OPTIMIZER_NAMES:
        raise SpecError(f"unknown optimizer {excerpt(optimizer, 40)} (use {', '.join(OPTIMIZER_NAMES)})",
                        field="optimizer")
    for name, value, least in (("repeats", repeats, 1), ("warmup", warmup, 0), ("link_repeats", link_repeats, 1),
                               ("threads", threads, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise SpecError(f"must be an integer of at least {least}, got {excerpt(value, 40)}", field=name)
    if isinstance(bucket_mib, bool) or not isinstance(bucket_mib, (int, float)) or not math.isfinite(bucket_mib) \
            or not MIN_BUCKET <= bucket_mib * MIB <= MAX_BUCKET:
        raise SpecError(f"must be a bucket size in MiB between {MIN_BUCKET / MIB:g} and {MAX_BUCKET / MIB:g}, got "
                        f"{excerpt(bucket_mib, 40)}", field="bucket_mib")


def validate_ddp(model: Model | str | Path, compute_profile: str | Path, batch: int, *, rate: str = "200mbit",
                 optimizer: str = "adam", repeats: int = 5, warmup: int = 2, link_repeats: int = 5,
                 sizes: tuple[int, ...] = LINK_SIZES, bucket_mib: float = 25.0, threads: int = 1,
                 overrides: Mapping[str, Any] | None = None, out_profile: str | Path | None = None,
                 statistic: str = "median", progress: Callable[[int, int, str, str], None] | None = None
                 ) -> dict[str, Any]:
    """2-host data-parallel training (torch DDP over gloo) on the emulated cluster vs dlsim's simulation.

    1. Builds a 2-host `EmulatedCluster` (prefix "dlsimd", each port limited to `rate` by tbf).
    2. Measures the link: a gloo ping-pong over `sizes` and the Hockney fit (`fit_link`), and writes
       the 2-host profile (`ddp_profile_text`) to `out_profile` (default: ``emulated-2host.yaml`` in
       the compute profile's directory).
    3. Times `repeats` DDP iterations with `batch` samples per rank (`dlsim.validate.ddp_worker`).
    4. Simulates the same iteration: ``simulate(model, profile, dp=2, microbatch_size=batch)``, the
       simulator's DDP (gradient buckets of `bucket_mib` all-reduced during the backward pass).
    Returns one record with both, the error, and the link measurement. Needs root.
    """
    from dlsim.api.simulate import simulate
    from dlsim.calibrate.compute_ops import make_optimizer
    from dlsim.calibrate.compute_timer import warm_allocator
    from dlsim.io.files import write_atomic
    from dlsim.units import MIB
    from dlsim.validate.ddp_run import run_ranks
    from dlsim.validate.emulated_cluster import EmulatedCluster
    source = model if isinstance(model, (str, Path)) else model.source
    model, batch = as_model(model, overrides), check_batch(batch)
    if statistic not in STATISTICS:
        raise SpecError(f"unknown statistic {statistic!r} (use {' or '.join(STATISTICS)})", field="statistic")
    check_ddp_options(rate=rate, optimizer=optimizer, repeats=repeats, warmup=warmup, link_repeats=link_repeats,
                      bucket_mib=bucket_mib, threads=threads)
    folder = Path(compute_profile)
    base = folder / "profile.yaml" if folder.is_dir() else folder
    if not base.exists():
        raise SpecError("no compute profile here (run dlsim calibrate compute --threads 1 first)", path=base)
    target = Path(out_profile) if out_profile else base.parent / "emulated-2host.yaml"
    from dlsim.io.files import check_output
    check_output(target, inputs=(base,), force=True, option="--out-profile")  # rewritten by each run, never an input
    pick = min if statistic == "min" else statistics.median
    say = progress or (lambda *args: None)
    say(0, 3, "building the 2-host emulated cluster", PHASE_RUNNING)
    with EmulatedCluster(hosts=2, rate=rate, prefix="dlsimd", subnet="10.231.78") as cluster:
        say(1, 3, f"measuring the link: gloo ping-pong over {len(sizes)} sizes (2 ranks)", PHASE_WAITING)
        link = run_ranks(cluster, ["--job", "link", "--sizes", ",".join(str(s) for s in sizes),
                                   "--repeats", str(link_repeats)])
        say(2, 3, f"timing {warmup} + {repeats} DDP iterations of {model.name} (2 ranks)", PHASE_WAITING)
        train = run_ranks(cluster, ["--job", "train", "--batch", str(batch), "--optimizer", optimizer,
                                    "--bucket-mib", str(bucket_mib), "--threads", str(threads),
                                    "--warmup", str(warmup), "--repeats", str(repeats)],
                          {"model": functools.partial(as_model, str(source), dict(overrides or {}) or None),
                           "make_optimizer": make_optimizer, "prepare": warm_allocator})
        emulated = cluster.describe()
    say(3, 3, "simulating the same iteration", PHASE_RUNNING)
    fit = fit_link(link["rows"], "one_way_min_s" if statistic == "min" else "one_way_s")
    write_atomic(target, ddp_profile_text(base, fit, hosts=2, rate=rate, name=f"emulated-2host-{rate}"))
    sim = simulate(model, target, dp=2, microbatch_size=batch, optimizer=optimizer,
                   bucket_size=bucket_mib * MIB).to_dict()
    samples = [sum(s) for s in train["samples_s"]]
    measured = pick(samples)
    phases = {k: pick(s[i] for s in train["samples_s"]) for i, k in enumerate(("forward", "backward", "optimizer"))}
    return {"schema_version": SCHEMA_VERSION, "kind": "validate-ddp", "model": model.name, "batch_per_rank": batch,
            "dtype": model.dtype, "assumed": {"dtype": model.dtype},
            "ranks": 2, "rate": rate, "optimizer": optimizer, "optimizer_impl": train["optimizer_impl"],
            "threads_per_rank": train["threads"], "parameters": train["parameters"], "bucket_mib": bucket_mib,
            "statistic": statistic, "profile": str(target), "emulated_cluster": emulated,
            "link": {"fit": fit, "rows": link["rows"]},
            "measured": {"iteration_s": measured, "samples_s": samples, **{f"{k}_s": v for k, v in phases.items()},
                         "spread": (max(samples) - min(samples)) / measured if measured > 0 else 0.0},
            "predicted": {"iteration_s": sim["iteration_time_s"], "breakdown_s": sim["breakdown_s"],
                          "communication_s": sim["communication_s"], "measured_share": sim["measured_share"],
                          "notes": sim["notes"]},
            "error": rel_error(sim["iteration_time_s"], measured)}
