"""`validate_model()` and `validate_kernels()`: dlsim's predictions against real PyTorch runs.

`validate_model` builds the model in PyTorch (`dlsim.validate.torch_model`), times real training
iterations (`dlsim.validate.compute_iteration`: forward, backward, optimizer step; per layer with
hooks) and predicts the same iteration with `dlsim.api.estimate.estimate` on the given profile.
Errors are signed relative errors (predicted − measured) / measured.

`validate_kernels` times held-out GEMM and convolution shapes (`dlsim.validate.compute_heldout`)
that the profile's tables do not contain and compares them with the table lookup.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable, Mapping

from dlsim.api.estimate import estimate
from dlsim.api.models import as_cluster, as_model, check_batch, check_dtype
from dlsim.calibrate.compute_ops import conv_algorithm, conv_fn, gemm_fn, make_optimizer
from dlsim.calibrate.compute_plan import DEFAULT_CONV_ALGORITHM
from dlsim.calibrate.compute_timer import STATISTICS, KernelTimer, check_device, set_threads, warm_allocator
from dlsim.cost.layers import layer_cost
from dlsim.cost.pricing import price_pass
from dlsim.errors import SpecError
from dlsim.io.kernel_tables import load_kernel_times, read_meta_defaults, read_table
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.validate.compute_heldout import conv_layer, heldout_convs, heldout_gemms
from dlsim.validate.compute_iteration import measure_iteration

SCHEMA_VERSION = 1


def rel_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured > 0 else float("nan")


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
                   attention: str = "math", statistic: str = "median", retain_memory: bool = True) -> dict[str, Any]:
    """Predicted vs measured training iteration of `model` (see the module docstring); a result record.

    `retain_memory` runs the iterations with the C allocator keeping freed memory, the regime the
    kernel tables were measured in (`dlsim.calibrate.compute_timer.retain_freed_memory`); False
    keeps the C library's defaults (glibc: large blocks re-faulted every iteration)."""
    model, cluster = as_model(model, overrides), as_cluster(cluster)
    batch, dtype = check_batch(batch), check_dtype(dtype, model)
    if repeats < 1 or warmup < 0:
        raise SpecError("repeats must be >= 1 and warmup >= 0", field="repeats")
    if statistic not in STATISTICS:
        raise SpecError(f"unknown statistic {statistic!r} (use {' or '.join(STATISTICS)})", field="statistic")
    check_device(device)
    threads_used = set_threads(threads)
    retained = warm_allocator() if retain_memory else False
    predicted = estimate(model, cluster, batch, dtype=dtype, optimizer=optimizer)
    measured = measure_iteration(model, batch, make_optimizer, device=device, dtype=dtype, optimizer=optimizer,
                                 warmup=warmup, repeats=repeats, per_layer=per_layer, attention=attention)
    pred = predicted.to_dict()
    measured_layers, mph = measured.layers(statistic), measured.phases(statistic)
    tag = {"measured": "M", "interpolated": "I", "extrapolated": "X", "model": "R"}
    layers = []
    for t in predicted.layers:
        mf, mb = measured_layers.get(t.name, (float("nan"), float("nan")))
        pf, pb = t.forward.seconds, t.backward_data.seconds + t.backward_weight.seconds
        layers.append({"name": t.name, "type": t.type, "predicted_forward_s": pf, "measured_forward_s": mf,
                       "predicted_backward_s": pb, "measured_backward_s": mb, "predicted_s": pf + pb,
                       "measured_s": mf + mb, "error": rel_error(pf + pb, mf + mb),
                       "source": "".join(tag[e.source.value] for e in (t.forward, t.backward_data, t.backward_weight))})
    total = mph["iteration"]
    big = [r["error"] for r in layers if r["measured_s"] == r["measured_s"] and r["measured_s"] >= 0.01 * total]
    weighted = sum(abs(r["predicted_s"] - r["measured_s"]) for r in layers if r["measured_s"] == r["measured_s"])
    phases = {"iteration": (pred["iteration_time_s"], mph["iteration"]),
              "forward": (pred["forward_time_s"], mph["forward"]),
              "backward": (pred["backward_time_s"], mph["backward"]),
              "optimizer": (pred["optimizer_time_s"], mph["optimizer"])}
    return {
        "schema_version": SCHEMA_VERSION, "kind": "validate-model", "model": model.name, "cluster": cluster.name,
        "device": device, "batch": batch, "dtype": dtype, "optimizer": optimizer,
        "optimizer_impl": measured.optimizer_impl, "threads": threads_used, "repeats": repeats,
        "statistic": statistic, "allocator": "retain freed memory" if retained else "C library default",
        "predicted": {f"{k}_s": p for k, (p, _) in phases.items()},
        "measured": {**{f"{k}_s": m for k, (_, m) in phases.items()},
                     "iteration_samples_s": list(measured.iteration_samples), "spread": measured.spread},
        "error": {k: rel_error(p, m) for k, (p, m) in phases.items()},
        "time_by_source_s": pred["time_by_source_s"], "measured_share": pred["measured_share"],
        "per_layer": {"layers_over_1pct": error_summary(big),
                      "time_weighted_abs_error": weighted / max(sum(r["measured_s"] for r in layers
                                                                    if r["measured_s"] == r["measured_s"]), 1e-30),
                      "measured_layer_sum_s": sum(r["measured_s"] for r in layers if r["measured_s"] == r["measured_s"])},
        "layers": layers, "notes": pred["notes"],
    }


def _conv_default(cluster: Cluster) -> str | None:
    return read_meta_defaults(Path(cluster.source).parent).get("conv_algorithm") if cluster.source else None


def validate_kernels(cluster: Cluster | str | Path, *, device: str = "cpu", dtype: str = "fp32", gemms: int = 40,
                     convs: int = 20, seed: int = 0, threads: int | None = None, repeats: int = 5,
                     statistic: str = "median", progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Held-out GEMM and convolution shapes: measured now vs looked up in `cluster`'s tables."""
    cluster = as_cluster(cluster)
    if "gemm" not in cluster.tables:
        raise SpecError("has no gemm table to validate (run dlsim calibrate compute first)", path=cluster.source)
    check_device(device)
    threads_used = set_threads(threads)
    import torch
    dev = torch.device(device)
    timer = KernelTimer(device, repeats=repeats, statistic=statistic)
    warm_allocator()
    tables, _ = load_kernel_times(cluster)
    nearest, _ = load_kernel_times(cluster, gemm_method="nearest")
    gemm_rows = []
    for g in heldout_gemms(read_table("gemm", cluster.tables["gemm"]), dtype, gemms, seed):
        t = timer.time(gemm_fn(g, dtype, dev)).seconds
        est, alt = tables.gemm(g, dtype), nearest.gemm(g, dtype)
        gemm_rows.append({"m": g.m, "n": g.n, "k": g.k, "measured_s": t, "predicted_s": est.seconds,
                          "source": est.source.value, "error": rel_error(est.seconds, t),
                          "nearest_error": rel_error(alt.seconds, t)})
        if progress:
            progress(f"gemm {g.m}x{g.n}x{g.k}: measured {t:.3g} s, predicted {est.seconds:.3g} s ({est.source.value})")
    conv_rows = []
    algo = _conv_default(cluster)
    if "conv" in cluster.tables and convs > 0:
        rows = read_table("conv", cluster.tables["conv"])
        for pass_name, shape, n, kind in heldout_convs([r for r in rows if r.dtype == dtype], algo, convs, seed):
            cost = layer_cost(conv_layer(shape), n, dtype)
            est = price_pass(getattr(cost, pass_name), "conv2d", pass_name, cluster.device, dtype, tables, cost.conv)
            with conv_algorithm(algo or DEFAULT_CONV_ALGORITHM[device]):
                fn, _ = conv_fn(shape, n, pass_name, dtype, dev)
                t = timer.time(fn).seconds
            conv_rows.append({"pass": pass_name, "shape": shape.signature, "n": n, "kind": kind, "measured_s": t,
                              "predicted_s": est.seconds, "source": est.source.value, "error": rel_error(est.seconds, t)})
            if progress:
                progress(f"conv {pass_name} {shape.signature} n{n} ({kind}): measured {t:.3g} s, predicted "
                         f"{est.seconds:.3g} s ({est.source.value})")
    by_kind = {k: error_summary([r["error"] for r in conv_rows if r["kind"] == k]) for k in ("new-batch", "new-geometry")}
    return {"schema_version": SCHEMA_VERSION, "kind": "validate-kernels", "cluster": cluster.name, "device": device,
            "dtype": dtype, "threads": threads_used, "seed": seed, "statistic": statistic,
            "gemm": {"summary": error_summary([r["error"] for r in gemm_rows]),
                     "nearest_summary": error_summary([r["nearest_error"] for r in gemm_rows]), "rows": gemm_rows},
            "conv": {"summary": error_summary([r["error"] for r in conv_rows]), "by_kind": by_kind,
                     "algorithm": algo, "rows": conv_rows}}
