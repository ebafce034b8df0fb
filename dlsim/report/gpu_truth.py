"""The Markdown report of `dlsim validate gpu`, drawn from its summary record alone.

Sections: the device; the budget and its phases (and what was not reached); each network's training
step measured against dlsim's predictions with the built-in and the calibrated profile; each kernel
family's attained fraction of the built-in profile's peak against the fraction the built-in profile
assumes; where the two differ; what could not run.
"""

from __future__ import annotations

from typing import Any, Sequence

from dlsim.units import format_bytes, format_time


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[bool] | None = None) -> str:
    """A GitHub Markdown table (`right`: which columns align right)."""
    align = ["---:" if r else "---" for r in (right or [False] * len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pct(x: float | None, signed: bool = True) -> str:
    return "n/a" if x is None else (f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%")


def secs(x: float | None) -> str:
    return "n/a" if x is None else format_time(x)


def rate(x: float | None, unit: str) -> str:
    """A rate in FLOP/s (as TFLOP/s) or bytes/s (as GB/s)."""
    if x is None:
        return "n/a"
    return f"{x / 1e12:.3g} TFLOP/s" if unit == "FLOP/s" else f"{x / 1e9:.3g} GB/s"


def size(x: float, unit: str) -> str:
    """A kernel's size in FLOP (as GFLOP) or bytes."""
    return f"{x / 1e9:.3g} GFLOP" if unit == "FLOP" else format_bytes(x)


def _device(s: dict[str, Any]) -> list[str]:
    f = s.get("facts") or {}
    keys = (("device", "device"), ("memory", "memory_bytes"), ("multiprocessors", "multiprocessors"),
            ("compute capability", "compute_capability"), ("L2 cache", "l2_cache_bytes"),
            ("max SM clock (MHz)", "sm_clock_max_mhz"), ("max memory clock (MHz)", "memory_clock_max_mhz"),
            ("power limit (W)", "power_limit_w"), ("driver", "driver"), ("CUDA", "cuda"), ("cuBLAS", "cublas"),
            ("cuDNN", "cudnn"), ("torch", "torch"), ("CPU", "cpu"), ("threads", "threads"))
    rows = [[name, format_bytes(f[k]) if k.endswith("bytes") and f.get(k) else f[k]] for name, k in keys
            if f.get(k) not in (None, "")]
    fp8 = s.get("fp8") or {}
    rows.append(["FP8 GEMM", ("yes: " if fp8.get("supported") else "no: ") + str(fp8.get("why", "n/a"))])
    b = s.get("builtin_profile") or {}
    return ["## Device", "", md_table(["", ""], rows), "",
            f"Built-in profile: **{b.get('name') or 'none'}** ({b.get('why', '')}). Calibrated profile (new, this "
            f"run's tables): `{s['calibrated_profile']}`" + ("" if s.get("calibrated_profile_written") else
                                                               " (no profile.yaml: too few GEMMs measured)") + "."]


def _budget(s: dict[str, Any]) -> list[str]:
    rows = [[p["phase"], p["status"], secs(p["seconds"])] for p in s["phases"]]
    rows += [[name, "not reached", ""] for name in s["not_reached"]]
    cal = [f"- {c['phase']}: {c['measured']} kernels measured, {c['already_measured']} kept from an earlier run, "
           f"{len(c['failed'] or [])} failed, {c['stopped'] or 0} left by the budget" for c in s["calibration"]]
    return ["## Budget", "", f"Budget {secs(s['budget_s'])}, used {secs(s['elapsed_s'])}"
            f"{'' if s['finished'] else ' (the run did not finish: this report holds what it measured)'}.", "",
            md_table(["phase", "status", "time"], rows, [False, False, True]), "", *cal]


def _networks(s: dict[str, Any]) -> list[str]:
    rows = []
    for n in s["networks"]:
        what = f"{n['label']}, batch {n['batch']}"
        if n["status"] != "measured":
            rows.append([what, n["mode"], f"{n['status']}: {n.get('reason') or ''}", "", "", "", "", ""])
            continue
        rows.append([what, n["mode"], secs(n["measured_step_s"]) + f" (±{pct(n['spread'], False)})",
                     secs(n["predicted_builtin_s"]), pct(n["error_builtin"]), secs(n["predicted_calibrated_s"]),
                     pct(n["error_calibrated"]), rate(n["model_flops_per_s"], "FLOP/s")])
    notes = sorted({f"- {n['case']}: {k.removeprefix('prediction_').removesuffix('_note')}: {v}" for n in s["networks"]
                    for k, v in n.items() if k.endswith("_note") and v})
    compiled = [n for n in s["networks"] if n["mode"] == "compiled" and n["status"] == "measured"]
    extra = [f"- {n['case']} compiled: first step (compilation) {secs(n['first_step_s'])}"
             + (f", {n['graph_breaks']} graph breaks" if n.get("graph_breaks") else "") for n in compiled]
    return ["## Training steps", "",
            "Measured: median of the timed steps (zero_grad, forward and loss, backward, Adam step; the device "
            "synchronised at phase boundaries), ± the spread (max - min) / median. Predicted: `dlsim simulate` of the "
            "same step on one device with (a) the built-in profile and (b) the calibrated one; error = (predicted - "
            "measured) / measured. dlsim prices eager kernels: a compiled step is set against the same prediction.",
            "", md_table(["network", "mode", "measured", "built-in", "error", "calibrated", "error",
                          "model FLOP/s"], rows, [False, False, True, True, True, True, True, True]), "",
            *extra, *notes]


def _families(s: dict[str, Any]) -> list[str]:
    fams = s["kernel_families"]
    if not fams:
        return ["## Kernel families", "", "No kernel was measured (or no built-in profile to compare with)."]
    rows = [[f["family"], f["kernels"], size(f["largest_size"], f["size_unit"]), rate(f["largest_rate"], f["rate_unit"]),
             pct(f["largest_measured_fraction"], False), pct(f["largest_builtin_fraction"], False),
             pct(f["measured_fraction_median"], False), pct(f["builtin_fraction_median"], False),
             pct(f["builtin_error_median"])] for f in fams]
    differ = [f"- {f['family']}: the built-in profile assumes {pct(f['largest_builtin_fraction'], False)} of its "
              f"peak at the largest kernel, measured {pct(f['largest_measured_fraction'], False)}"
              for f in fams if f["differs"]]
    b = (s.get("builtin_profile") or {}).get("name") or "the built-in profile"
    return ["## Kernel families", "",
            f"Attained fraction of {b}'s peak (matrix FLOP/s for GEMMs and attention, memory bytes/s for the rest) "
            f"against the fraction {b} assumes for the same kernel (`dlsim.cost.roofline`), at the family's largest "
            "kernel and as the median over its kernels; built-in time error = (roofline time with launch overhead "
            "- measured) / measured, median. Each kernel timed with the calibration's timer (CUDA events on a GPU) "
            "after a cache flush, in a random order.", "",
            md_table(["family", "kernels", "largest", "rate there", "measured", "built-in", "measured (median)",
                      "built-in (median)", "built-in time error"], rows, [False] + [True] * 8), "",
            "### Where the built-in profile and the measurement differ (by more than 20% at the largest kernel)", "",
            *(differ or ["- nowhere"]),
            "", "These differences are reported, not applied: the built-in profile changes only by hand, from "
            "published sources; the calibrated profile beside this report holds what was measured."]


def markdown(s: dict[str, Any]) -> str:
    """The report (module docstring)."""
    unavailable = [f"- {u}" for u in s.get("unavailable_kernels", [])]
    lines = [f"# GPU truth: {(s.get('facts') or {}).get('device', s['device'])}", "",
             f"Generated by `dlsim validate gpu` (run {s['run']}): `{s.get('command') or ''}`.", "",
             *_device(s), "", *_budget(s), "", *_networks(s), "", *_families(s), ""]
    if unavailable:
        lines += ["## Kernels that could not run here", "", *unavailable, ""]
    if s.get("notes"):
        lines += ["## Notes", "", *(f"- {n}" for n in s["notes"]), ""]
    return "\n".join(lines)
