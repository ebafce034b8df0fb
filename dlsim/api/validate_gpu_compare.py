"""What `dlsim validate gpu` measured, set against dlsim: predicted training steps, kernel-family efficiencies.

Everything here is computed again from the run's records and the calibrated profile's tables each time
the report is written, so a report written after a phase, after a cut run, or later on another machine
(`--report-only`) says the same about the same measurements.

* Networks (`network_rows`): each measured training step against dlsim's prediction of the same step
  (`dlsim.api.simulate.simulate` on one device: dp = tp = pp = 1, one micro-batch of the case's batch,
  the case's training dtype, Adam, the case's fused kernels: ``flash_attention`` for the SDPA networks)
  with (a) the built-in profile of the device and (b) the profile this run calibrated. Errors are
  signed relative errors (predicted − measured) / measured. dlsim prices eager kernels; a compiled step
  is set against the same prediction, so its error shows what compilation gains.
* Kernel families (`family_rows`): for each kernel measured, the fraction of the built-in profile's peak
  it attained (FLOP/s on matrix units for GEMMs and attention, bytes/s of memory for the memory-bound
  kernels) against the fraction the built-in profile assumes at that size (`dlsim.cost.roofline`:
  `compute_efficiency`, `memory_efficiency`), and the built-in profile's time for the kernel (roofline,
  launch overhead included) against the measured time. Per family the medians over its kernels and the
  values at its largest kernel (where the built-in profiles' stated efficiencies are measured).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from dlsim.api.models import as_cluster, as_model
from dlsim.cost.layers import Gemm, layer_cost
from dlsim.cost.pricing import gemm_bytes, price_pass
from dlsim.cost.roofline import compute_efficiency, memory_efficiency, peak, roofline_time
from dlsim.errors import DlsimError, one_line
from dlsim.io.kernel_tables import read_table
from dlsim.spec.cluster import Cluster, Device
from dlsim.units import DTYPE_BYTES
from dlsim.validate.gpu_suite import StepCase, prepared_model

DIFFER = 0.2
"""A family whose built-in efficiency is off the measured one by more than this share is listed as a
difference in the report."""


def rel(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or not measured > 0:
        return None
    return (predicted - measured) / measured


def case_model(case: StepCase, device: str) -> Any:
    return prepared_model(as_model(case.model, case.override_map), case, device)


STACK = "pytorch"
"""The software stack of the predictions (stacks/pytorch.yaml: eager PyTorch, SDPA, Adam); the case sets the
dtype and the fused kernels, the run its optimizer implementation (fused Adam where PyTorch has it)."""


def predict_step(case: StepCase, device: str, cluster: Cluster | str | Path,
                 optimizer_impl: str = "fused") -> dict[str, Any]:
    """dlsim's prediction of one training step of `case` on one device of `cluster` (module docstring)."""
    try:
        from dlsim.api.simulate import simulate  # the simulator needs simpy, which a GPU machine may lack
        r = simulate(case_model(case, device), cluster, dp=1, tp=1, pp=1, microbatch_size=case.batch,
                     global_batch=case.batch, dtype=case.dtype, optimizer="adam", fused_kernels=case.fused,
                     stack=STACK, optimizer_impl=optimizer_impl)
    except (DlsimError, ImportError) as exc:
        return {"error": one_line(exc)}
    return {"step_s": r.iteration_time_s, "measured_share": r.measured_share, "peak_memory_bytes": r.peak_memory_bytes,
            "flops": r.flops_per_iteration}


def _state(profile: Path) -> tuple:
    """What a calibrated profile's prediction depends on: its files' sizes and times."""
    return tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in profile.iterdir() if f.is_file()))


def network_rows(cases: Iterable[StepCase], steps: Mapping[tuple[str, str], dict[str, Any]], device: str,
                 builtin: str | None, calibrated: Path | None,
                 cache: dict[tuple, Any] | None = None) -> list[dict[str, Any]]:
    """One row per case and mode measured (or cut): the measured step, both predictions and their errors.
    `cache` keeps predictions between calls (a calibrated profile's until its files change)."""
    rows, cache = [], {} if cache is None else cache

    def predicted(case: StepCase, cluster: str | Path, key: tuple, impl: str) -> dict[str, Any]:
        key = (case, str(cluster), key, impl)
        if key not in cache:
            cache[key] = predict_step(case, device, cluster, impl)
        return cache[key]

    for case in cases:
        impl = next((r["optimizer_impl"] for m in ("eager", "compiled") if (r := steps.get((case.key, m)))
                     and r.get("optimizer_impl") in ("fused", "foreach")), "fused")
        preds = {"builtin": predicted(case, builtin, (), impl) if builtin else {"error": "no built-in profile"},
                 "calibrated": predicted(case, calibrated, _state(calibrated), impl) if calibrated else
                 {"error": "no calibrated profile yet (the GEMM phase did not finish)"}}
        for mode in ("eager", "compiled"):
            rec = steps.get((case.key, mode))
            if rec is None:
                continue
            measured = rec.get("step_s") if rec.get("status") == "measured" else None
            flops = preds["builtin"].get("flops") or preds["calibrated"].get("flops")
            rows.append({
                "case": case.key, "label": case.label, "mode": mode, "batch": case.batch, "status": rec.get("status"),
                "reason": rec.get("reason"), "measured_step_s": measured, "spread": rec.get("spread"),
                "first_step_s": rec.get("first_step_s"), "timed_steps": rec.get("timed_steps"),
                "peak_memory_bytes": rec.get("peak_memory_bytes"), "graph_breaks": rec.get("graph_breaks"),
                "model_flops_per_s": flops / measured if flops and measured else None,
                **{f"predicted_{k}_s": p.get("step_s") for k, p in preds.items()},
                **{f"error_{k}": rel(p.get("step_s"), measured) for k, p in preds.items()},
                **{f"prediction_{k}_note": p["error"] for k, p in preds.items() if "error" in p},
                "measured_share_calibrated": preds["calibrated"].get("measured_share"),
                "predicted_peak_memory_bytes": preds["builtin"].get("peak_memory_bytes")})
    return rows


def _kernel(family: str, dtype: str, size: float, time_s: float, attained: float, assumed: float,
            builtin_s: float, unit_rate: float) -> dict[str, Any]:
    return {"family": family, "dtype": dtype, "size": size, "time_s": time_s, "rate": unit_rate,
            "measured_fraction": attained, "builtin_fraction": assumed, "builtin_s": builtin_s,
            "builtin_error": rel(builtin_s, time_s)}


def gemm_kernels(rows: Iterable[Any], dev: Device) -> list[dict[str, Any]]:
    """GEMM rows as kernels: size FLOPs, attained and assumed fractions of the matrix peak."""
    out = []
    for r in rows:
        g = Gemm(r.m, r.n, r.k, r.count)
        square = r.m == r.n == r.k and r.count == 1
        family = f"gemm-square-{r.dtype}" if square and r.set == "grid" else f"gemm-networks-{r.dtype}"
        p = peak(dev, r.dtype, True)
        builtin = roofline_time(g.flops, gemm_bytes(g, DTYPE_BYTES[r.dtype]), dev, r.dtype, matrix=True).seconds
        out.append(_kernel(family, r.dtype, g.flops, r.time_s, g.flops / (r.time_s * p),
                           compute_efficiency(g.flops / max(r.count, 1), dev, r.dtype), builtin, g.flops / r.time_s))
    return out


def memory_kernels(rows: Iterable[Any], dev: Device, sets: tuple[str, ...] = ("grid",)) -> list[dict[str, Any]]:
    """Memory-bound rows (operator sweeps, optimizer steps) as kernels: size bytes, attained and assumed
    fractions of the memory bandwidth."""
    out = []
    for r in rows:
        if r.set not in sets or r.bytes <= 0:
            continue
        step = r.pass_name == "step"
        family = f"{r.op}-step" if step else f"{r.op}-{'fwd' if r.pass_name == 'forward' else 'bwd'}-{r.dtype}"
        kernel = None if step else f"{r.op}.{r.pass_name}"
        builtin = roofline_time(r.flops, r.bytes, dev, "fp32" if step else r.dtype, matrix=False, kernels=1,
                                kernel=kernel).seconds
        out.append(_kernel(family, r.dtype, r.bytes, r.time_s, r.bytes / (r.time_s * dev.memory_bandwidth),
                           memory_efficiency(r.bytes, dev, kernel), builtin, r.bytes / r.time_s))
    return out


def record_kernels(records: Iterable[Mapping[str, Any]], dev: Device) -> list[dict[str, Any]]:
    """The SDPA-backend and copy records as kernels (attention against the matrix peak, copies against
    the memory bandwidth)."""
    from dlsim.calibrate.compute_plan import sdpa_layer
    out = []
    for r in records:
        if r.get("status") != "measured":
            continue
        t, dtype = r["time_s"], r["dtype"]
        if r["op"] == "sdpa":
            batch, heads, steps, width = r["shape"]
            layer = sdpa_layer(heads, steps, width, dtype, bool(r.get("causal", True)))
            cost = getattr(layer_cost(layer, batch, dtype), r["pass"])
            builtin = price_pass(cost, "sdpa", r["pass"], dev, dtype).seconds
            p = peak(dev, dtype, True)
            family = f"{r['family']}-{'fwd' if r['pass'] == 'forward' else 'bwd'}-{dtype}"
            out.append(_kernel(family, dtype, r["flops"], t, r["flops"] / (t * p),
                               compute_efficiency(r["flops"], dev, dtype), builtin, r["flops"] / t))
        else:
            builtin = roofline_time(0.0, r["bytes"], dev, dtype, matrix=False, kernel="copy.forward").seconds
            out.append(_kernel(f"copy-{dtype}", dtype, r["bytes"], t, r["bytes"] / (t * dev.memory_bandwidth),
                               memory_efficiency(r["bytes"], dev, "copy.forward"), builtin, r["bytes"] / t))
    return out


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def family_rows(kernels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per family: kernel count, medians, and the largest kernel's values (module docstring)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for k in kernels:
        by.setdefault(k["family"], []).append(k)
    out = []
    for family, ks in by.items():
        ks.sort(key=lambda k: k["size"])
        top = ks[-1]
        matrix = family.startswith(("gemm", "sdpa"))
        row = {"family": family, "kernels": len(ks), "size_unit": "FLOP" if matrix else "bytes",
               "rate_unit": "FLOP/s" if matrix else "bytes/s",
               "measured_fraction_median": _median([k["measured_fraction"] for k in ks]),
               "builtin_fraction_median": _median([k["builtin_fraction"] for k in ks]),
               "builtin_error_median": _median([k["builtin_error"] for k in ks]),
               "largest_size": top["size"], "largest_rate": top["rate"],
               "largest_measured_fraction": top["measured_fraction"],
               "largest_builtin_fraction": top["builtin_fraction"],
               "largest_builtin_error": top["builtin_error"], "best_rate": max(k["rate"] for k in ks)}
        ratio = rel(row["largest_builtin_fraction"], row["largest_measured_fraction"])
        row["builtin_vs_measured"] = ratio
        row["differs"] = ratio is not None and abs(ratio) > DIFFER
        out.append(row)
    return sorted(out, key=lambda r: r["family"])


def calibrated_kernels(profile_dir: Path, dev: Device) -> list[dict[str, Any]]:
    """The calibrated profile's GEMM rows and swept memory-bound rows as kernels."""
    out: list[dict[str, Any]] = []
    gemm, memory = profile_dir / "gemm.csv", profile_dir / "memory.csv"
    if gemm.exists():
        out += gemm_kernels(read_table("gemm", gemm), dev)
    if memory.exists():
        out += memory_kernels(read_table("memory", memory), dev)
    return out


def builtin_device(builtin: str | None) -> Device | None:
    return as_cluster(builtin).device if builtin else None


def safely(fn: Callable[[], Any], default: Any) -> tuple[Any, str | None]:
    """`fn()`, or `default` and the error in one line (a report is written whatever one part lacks)."""
    try:
        return fn(), None
    except (DlsimError, ImportError, OSError, ValueError) as exc:
        return default, one_line(exc)
