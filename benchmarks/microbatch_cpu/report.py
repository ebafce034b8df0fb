"""The report of the μ-cuDNN CPU proof (`benchmarks/validate_microbatch_cpu.py`): markdown, CSV tables, one JSON record, figures.

Everything is drawn from the files the proof's stages wrote into OUT: ``microbatch-cpu-check.json``,
``microbatch-cpu-runs/attempt-N.json`` (plans, predictions and measurements of attempt N) with their
tables ``table-N.csv``, optionally ``microbatch-cpu-runs/drift-example.json`` (an execution measured
against an older table) and ``microbatch-bench.json`` (``benchmarks/bench_microbatch.py``'s output).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from microbatch_cpu.cause import cause_section, drift_section

from dlsim.api.microbatch import microbatch_sweep
from dlsim.calibrate.microbatch_bench import last_level_cache_bytes
from dlsim.io.bench_table import load_bench_table
from dlsim.io.files import write_atomic
from dlsim.plan.microbatch import batch_sizes
from dlsim.report.microbatch_plots import plot_execution, plot_speedup_vs_limit
from dlsim.units import MIB, MS, format_bytes


def _attempts(out: Path) -> list[dict]:
    files = sorted((out / "microbatch-cpu-runs").glob("attempt-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    if not files:
        raise SystemExit("no measurement attempt yet; run --stage measure")
    return [json.loads(p.read_text()) for p in files]


def _rows(attempt: dict) -> list[dict]:
    """Per (mode, limit) of one attempt: prediction, measurement, error, baseline, speedups."""
    rows = []
    for name, plan in attempt["plans"].items():
        mode, limit = name.split()
        pl = attempt["records"][f"{name} planned"]
        un = attempt["records"].get(f"{name} undivided")
        hold = attempt.get("holdout", {})
        hp, hu = hold.get(f"{name} planned"), hold.get(f"{name} undivided")
        rows.append({
            "attempt": attempt["attempt"], "mode": mode, "limit_bytes": float(limit),
            "workspace_bytes": plan["workspace_bytes"], "predicted_s": plan["time_s"],
            "measured_s": pl["measured_time_s"], "error": pl["error"], "spread": pl["spread"],
            "undivided_predicted_s": plan["undivided_time_s"],
            "undivided_measured_s": un["measured_time_s"] if un else None,
            "undivided_error": un["error"] if un else None,
            "predicted_speedup": plan["speedup"],
            "measured_speedup": un["measured_time_s"] / pl["measured_time_s"] if un else None,
            "holdout_predicted_s": hp["predicted_time_s"] if hp else None, "holdout_error": hp["error"] if hp else None,
            "undivided_holdout_predicted_s": hu["predicted_time_s"] if hu else None,
            "undivided_holdout_error": hu["error"] if hu else None,
            "plan": plan, "execution": pl, "undivided_execution": un})
    return rows


def _fmt(v, spec: str = ".6g") -> str:
    return "" if v is None else (format(v, spec) if isinstance(v, float) else str(v))


def _write_csvs(out: Path, rows: list[dict]) -> None:
    cols = ("attempt", "mode", "limit_bytes", "workspace_bytes", "predicted_s", "holdout_predicted_s", "measured_s",
            "error", "holdout_error", "undivided_predicted_s", "undivided_holdout_predicted_s", "undivided_measured_s",
            "undivided_error", "undivided_holdout_error", "predicted_speedup", "measured_speedup")
    lines = [",".join({"limit_bytes": "workspace_limit_bytes", "workspace_bytes": "plan_workspace_bytes"}.get(c, c)
                      for c in cols)]
    for r in rows:
        lines.append(",".join(_fmt(r[k]) for k in cols))
    write_atomic(out / "microbatch-cpu-results.csv", "\n".join(lines) + "\n")
    lines = ["attempt,mode,workspace_limit_bytes,variant,kernel,microbatches,predicted_s,measured_s"]
    for r in rows:
        for variant, key in (("planned", "execution"), ("undivided", "undivided_execution")):
            for k in (r[key] or {}).get("kernels", []):
                mbs = " ".join(f"{s}:{a}" for s, a in k["microbatches"])
                lines.append(f"{r['attempt']},{r['mode']},{r['limit_bytes']:.0f},{variant},{k['kernel']},{mbs},"
                             f"{k['predicted_time_s']:.6g},{k['measured_time_s']:.6g}")
    write_atomic(out / "microbatch-cpu-kernels.csv", "\n".join(lines) + "\n")


def _mb(passes: dict) -> str:
    parts = []
    for p, v in passes.items():
        runs: list[list] = []
        for m in v["microbatches"]:
            if runs and runs[-1][1:] == [m["size"], m["algorithm"]]:
                runs[-1][0] += 1
            else:
                runs.append([1, m["size"], m["algorithm"]])
        parts.append(f"{p}: " + " + ".join(f"{n}x{s} {a}" if n > 1 else f"{s} {a}" for n, s, a in runs))
    return "<br>".join(parts)


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def write_report(out: Path, batch: int, limits: dict, command: str, threads: str, layers) -> dict:
    check = json.loads((out / "microbatch-cpu-check.json").read_text())
    attempts = _attempts(out)
    rows = [r for a in attempts for r in _rows(a)]
    first_table = load_bench_table(out / "microbatch-cpu-runs" / f"table-{attempts[0]['attempt']}.csv")
    largest = max(v for vs in limits.values() for v in vs)
    sweep_limits = sorted({MIB * 2 ** k for k in range(0, 20) if MIB * 2 ** k <= largest}
                          | {v for vs in limits.values() for v in vs})
    sweeps = [microbatch_sweep(first_table, batch, mode, ("undivided", "powerOfTwo"), sweep_limits,
                               label="AlexNet convolutions, NumPy on this CPU", source="measured")
              for mode in ("wr", "wd")]
    env = {"machine": platform.machine(), "cpu": _cpu_name(), "cores": os.cpu_count(), "blas_threads": threads,
           "last_level_cache_bytes": last_level_cache_bytes(), "python": platform.python_version(),
           "numpy": np.__version__, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "batch": batch, "command": command}
    drift_path = out / "microbatch-cpu-runs" / "drift-example.json"
    drift = json.loads(drift_path.read_text()) if drift_path.exists() else None
    bench_path = out / "microbatch-bench.json"
    bench = json.loads(bench_path.read_text()) if bench_path.exists() else None
    record = {"kind": "microbatch_cpu_proof", "environment": env, "check": check, "results": rows, "sweeps": sweeps,
              "attempts": [{k: a[k] for k in ("attempt", "date", "table", "calibration", "rounds", "load")}
                           for a in attempts], "bench": bench}
    write_atomic(out / "microbatch-cpu.json", json.dumps(record, indent=1) + "\n")
    _write_csvs(out, rows)
    exec_records = []
    for r in (r for r in rows if r["attempt"] == attempts[0]["attempt"]):
        for key in ("execution", "undivided_execution"):
            if r[key]:
                exec_records.append(r[key])
    plot_execution(exec_records, out / "microbatch-cpu.png",
                   title=f"AlexNet convolutions, batch {batch}, NumPy fp32, attempt {attempts[0]['attempt']}: "
                         "predicted (hatched) vs measured")
    measured = [{"mode": r["mode"], "limit_bytes": r["limit_bytes"], "speedup": r["measured_speedup"]}
                for r in rows if r["measured_speedup"] is not None]
    plot_speedup_vs_limit(sweeps, measured, out / "microbatch-cpu-speedup.png",
                          title=f"AlexNet convolutions, batch {batch}, NumPy fp32, 1 core of {env['cpu']}: "
                                f"predicted (lines, attempt {attempts[0]['attempt']}'s table) and measured "
                                "(points, every attempt)")
    write_atomic(out / "microbatch-cpu.md", _markdown(out, env, check, attempts, rows, first_table, drift, bench, limits))
    return {"batch": batch, "check_all_ok": check["all_ok"], "attempts": len(attempts),
            "max_abs_error": max(abs(r["error"]) for r in rows),
            "results": [{k: r[k] for k in ("attempt", "mode", "limit_bytes", "predicted_s", "measured_s", "error",
                                           "undivided_predicted_s", "undivided_measured_s", "predicted_speedup",
                                           "measured_speedup")} for r in rows]}


def _orders(attempts) -> str:
    """How each attempt took its hold-out samples: shuffled in with the executions, or all before them."""
    return ", ".join(f"attempt {a['attempt']} " + ("all before the first execution" if a.get("holdout_order") == "before"
                                                   else "interleaved with the executions") for a in attempts)


def _verdict(attempts, rows) -> str:
    def count(key):
        return "; ".join(f"attempt {a['attempt']}: {sum(abs(r[key]) <= 0.10 for r in rows if r['attempt'] == a['attempt'])}"
                         f" of {sum(r['attempt'] == a['attempt'] for r in rows)}" for a in attempts)
    hold = [r["holdout_error"] for r in rows if r["holdout_error"] is not None]
    tab = [r["error"] for r in rows]
    text = (f"Against the **hold-out prediction** (the plan chosen from the table, its time predicted from an "
            f"independent re-measurement of the chosen kernels; {_orders(attempts)}): {count('holdout_error')}"
            f" plans within 10 % (errors {min(hold):+.1%} to {max(hold):+.1%}). " if hold else "")
    return text + (f"Against the **table's own prediction** (the planner's objective value): {count('error')} within "
                   f"10 % (errors {min(tab):+.1%} to {max(tab):+.1%}, median {statistics.median(tab):+.1%}); it is "
                   "biased low by the planner's selection among noisy measurements, measured in the cause section "
                   "below. The measured speedups over the undivided baseline under the same limit are real and "
                   "somewhat smaller than the table predicts.")


def _ms(v) -> str:
    return "-" if v is None else f"{v / MS:.1f}"


def _markdown(out, env, check, attempts, rows, table, drift, bench, limits) -> str:
    errs = [abs(r["error"]) for r in rows]
    uerrs = [abs(r["undivided_error"]) for r in rows if r["undivided_error"] is not None]
    worst_check = max(check["rows"], key=lambda r: max(r["vs_direct"], r["vs_torch"] or 0.0))
    algos = sorted({r["algorithm"] for r in check["rows"]})
    lines = [
        "# μ-cuDNN micro-batching on real CPU kernels (NumPy)",
        "",
        f"Generated {env['date']} by `{env['command']}` (N = 1..{len(attempts)}, each attempt one exclusive hold of "
        "the measurement lock), then `--stage report`.",
        "",
        "**What this shows.** dlsim's WR dynamic programme and WD integer linear programme "
        "(`dlsim plan microbatch`, Oyama et al., CLUSTER 2018) plan micro-batch sizes and convolution algorithms "
        "from a table of measured kernels, and the plans are executed for real on this CPU: their measured time is "
        "compared with the time predicted for them, and with running every convolution undivided with the best "
        "algorithm that fits the same workspace limit (the measured speedup; where it is about 1x, the plan's "
        "predicted gain was within the selection bias described below).",
        "",
        "**Verdict against the acceptance line (within 10 %).** " + _verdict(attempts, rows),
        "",
        "## Set-up",
        "",
        f"* Machine: {env['cpu']} (KVM guest), {env['cores']} cores shared with other users, last-level cache "
        f"{format_bytes(env['last_level_cache_bytes'])}; NumPy {env['numpy']} (OpenBLAS), Python {env['python']}, "
        f"**{env['blas_threads']} BLAS thread**.",
        "* Network: AlexNet's five convolutions (single-tower variant, arXiv:1404.5997, as torchvision builds it; "
        f"224x224 input), mini-batch **{env['batch']}**, fp32, all three passes (forward, backward-data, "
        "backward-weight): 15 kernels.",
        "* Algorithms (`dlsim/calibrate/conv_numpy.py`, `conv_fft.py`, `conv_winograd.py`): direct (K_y·K_x "
        "shifted GEMMs per sample, one sample's scratch), im2col + GEMM (the lowered matrix of the whole "
        "micro-batch), FFT (spectra of inputs, kernels and outputs), Winograd F(2x2, 3x3) and F(2x2, 5x5) "
        "(transformed tiles and kernels). Each carves exactly the buffers `dlsim.cost.conv_methods."
        "workspace_buffers` lists from a caller-owned arena and refuses to run in less. FFT and Winograd need "
        "stride 1, so conv1 (11x11, stride 4) has direct and im2col only.",
        f"* Calibration (per attempt, `microbatch-cpu-runs/table-N.csv`): policy powerOfTwo (sizes "
        f"{', '.join(str(s) for s in batch_sizes('powerOfTwo', env['batch']))}), every configuration up to "
        f"{format_bytes(max(v for vs in limits.values() for v in vs))} of workspace timed as "
        f"{attempts[0]['calibration'].get('repeats')} repetitions of a whole batch's worth of consecutive micro-batches "
        "on cold caches (a buffer of twice the last-level cache is rewritten before each repetition), median "
        "kept; a configuration more than 1.5x slower than one with no more workspace at the same size is skipped. "
        f"Attempt 1: {sum(len(k.rows) for k in table.kernels)} rows in "
        f"{attempts[0]['calibration'].get('seconds', 0):.0f} s.",
        "* Plans: WR with the limit per kernel (one buffer of the limit's size, reused by every micro-batch of "
        "every kernel) at " + ", ".join(format_bytes(v) for v in limits["wr"]) + "; WD with the limit as the "
        "total budget (one arena of that size cut into a private segment per kernel) at "
        + ", ".join(format_bytes(v) for v in limits["wd"]) + " (below about 25 MiB no WD plan exists: the 15 "
        "kernels' smallest workspaces add up to that). Undivided baseline: every kernel runs the whole batch with "
        "the fastest algorithm that fits (WD: the ILP restricted to undivided configurations).",
        "* Execution (`dlsim.calibrate.microbatch_exec.PlanRunner`): the planned micro-batches and algorithms on "
        "consecutive slices of full-batch tensors, in training order (forward through the layers, then "
        "backward-data and backward-weight in reverse), the arena enforcing the limit. All 12 variants (6 plans, "
        f"6 baselines) in {attempts[0]['rounds']} interleaved rounds (every variant once per round, shuffled), "
        "median per variant.",
        "* Hold-out prediction (`dlsim.calibrate.microbatch_holdout`): every distinct configuration the plans and "
        "baselines use is timed once more with the calibration's method, either shuffled among the executions in "
        "the same rounds or (`--holdout-order before`) in rounds of its own that all end before the first "
        f"execution ({_orders(attempts)}); a variant's hold-out prediction is the sum of its micro-batches' "
        "hold-out medians. The plan is still chosen from the table; only the estimate of its time is independent "
        "of the choice.",
        "* Each attempt calibrates its own table and then executes right away, in one hold of the lock (why: the "
        "section on machine drift).",
        "",
        "## Correctness",
        "",
        f"Every algorithm, pass and layer shape (batch {check['batch']}, {len(check['rows'])} combinations of "
        f"{', '.join(algos)}) against NumPy direct and against PyTorch's `conv2d` and autograd in fp64 "
        f"(`dlsim.calibrate.conv_check`): largest normwise relative error "
        f"**{max(worst_check['vs_direct'], worst_check['vs_torch'] or 0):.1e}** ({worst_check['layer']} "
        f"{worst_check['pass']} {worst_check['algorithm']}), all within {check['tolerance']:g}: "
        f"**{'yes' if check['all_ok'] else 'NO'}**. The executed plans themselves are checked against direct in "
        "`tests/test_microbatch_exec.py` (a split ∇w accumulates across micro-batches).",
        "",
        "| layer | pass | algorithm | error vs direct | error vs PyTorch (fp64) |",
        "|---|---|---|---|---|",
    ]
    for r in check["rows"]:
        if r["algorithm"] != "direct":
            lines.append(f"| {r['layer']} | {r['pass']} | {r['algorithm']} | {r['vs_direct']:.1e} | "
                         f"{_fmt(r['vs_torch'], '.1e')} |")
    lines += [
        "",
        "## Results",
        "",
        "Times are one iteration's convolutions (15 kernels), median of the rounds. Error = measured / predicted − 1.",
        "",
        "| attempt | mode | limit | plan workspace | predicted: table | predicted: hold-out | measured | error vs "
        "table | **error vs hold-out** | undivided: table / hold-out / measured | undivided error vs table / "
        "hold-out | speedup predicted (table) | **speedup measured** |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["mode"] != "wr", r["limit_bytes"], r["attempt"])):
        he, uhe = r["holdout_error"], r["undivided_holdout_error"]
        lines.append(
            f"| {r['attempt']} | {r['mode'].upper()} | {format_bytes(r['limit_bytes'])} | "
            f"{format_bytes(r['workspace_bytes'])} | {_ms(r['predicted_s'])} ms | {_ms(r['holdout_predicted_s'])} ms | "
            f"{_ms(r['measured_s'])} ms | {r['error']:+.1%} | **{'-' if he is None else format(he, '+.1%')}** | "
            f"{_ms(r['undivided_predicted_s'])} / {_ms(r['undivided_holdout_predicted_s'])} / "
            f"{_ms(r['undivided_measured_s'])} ms | "
            + (f"{r['undivided_error']:+.1%} / {'-' if uhe is None else format(uhe, '+.1%')} | "
               f"{r['predicted_speedup']:.2f}x | **{r['measured_speedup']:.2f}x** |"
               if r["undivided_measured_s"] else "- | - | - |"))
    spreads = [r["spread"] for r in rows]
    within = sum(e <= 0.10 for e in errs)
    herrs = [abs(r["holdout_error"]) for r in rows if r["holdout_error"] is not None]
    lines += [
        "",
        (f"Planned executions within 10 % of the hold-out prediction: **{sum(e <= 0.10 for e in herrs)} of "
         f"{len(herrs)}** (largest |error| {max(herrs):.1%}, median {statistics.median(herrs):.1%}). " if herrs else "")
        + f"Within 10 % of the table's prediction: **{within} of {len(errs)}** (largest |error| "
        f"{max(errs):.1%}, median {statistics.median(errs):.1%}); undivided baselines: largest |error| "
        f"{max(uerrs):.1%}. Spread of one variant's round times, (max − min) / median: median "
        f"{statistics.median(spreads):.1%}, largest {max(spreads):.1%}.",
        "",
        "Measured speedup over undivided at the same limit, median over attempts:",
        "",
        "| mode | limit | speedup predicted (attempt 1) | speedup measured (median, min–max) |",
        "|---|---|---|---|",
    ]
    for mode in ("wr", "wd"):
        for lim in limits[mode]:
            ss = [r["measured_speedup"] for r in rows if r["mode"] == mode and r["limit_bytes"] == lim
                  and r["measured_speedup"] is not None]
            pred = next((r["predicted_speedup"] for r in rows if r["mode"] == mode and r["limit_bytes"] == lim), None)
            if ss:
                lines.append(f"| {mode.upper()} | {format_bytes(lim)} | {_fmt(pred, '.2f')}x | "
                             f"**{statistics.median(ss):.2f}x** ({min(ss):.2f}–{max(ss):.2f}) |")
    lines += [
        "",
        "![speedup against workspace limit](microbatch-cpu-speedup.png)",
        "",
        "Speedup against the workspace limit, like μ-cuDNN's figures: lines are predicted from attempt 1's table "
        "by the planners over limits from 1 MiB (no WR plan fits below 4 MiB, where conv4's direct scratch "
        "alone needs 3.8 MiB; no WD plan, or no undivided WD baseline, below 64 MiB), points are measured "
        "executions, one per attempt. The same sweep from the "
        "command line: `dlsim plan microbatch --bench-table reports/microbatch-cpu-runs/table-1.csv --batch "
        f"{env['batch']} --workspace-limit 32MiB --plot sweep.png`.",
        "",
        "![predicted and measured time per limit](microbatch-cpu.png)",
        "",
    ]
    lines += cause_section(out, attempts)
    lines += ["", "## Machine drift, and why each attempt calibrates right before it executes"]
    lines += drift_section(attempts, drift)
    lines += [
        "",
        "## The plans (attempt 1)",
        "",
        "| mode | limit | layer | micro-batches (size x algorithm) per pass |",
        "|---|---|---|---|",
    ]
    for r in (r for r in rows if r["attempt"] == attempts[0]["attempt"]):
        for layer in r["plan"]["layers"]:
            lines.append(f"| {r['mode'].upper()} | {format_bytes(r['limit_bytes'])} | {layer['name']} | "
                         f"{_mb(layer['passes'])} |")
    differ = [a["attempt"] for a in attempts[1:] if a["plans"] != attempts[0]["plans"]]
    lines += [
        "",
        "Later attempts plan from their own tables; the plans differ from attempt 1's in attempts "
        f"{', '.join(map(str, differ)) or 'none'} (near-ties between algorithms flip with the noise), see "
        "`microbatch-cpu-kernels.csv` (every attempt, variant and kernel: micro-batches, predicted and measured "
        "time), `microbatch-cpu-results.csv` (the results table) and `microbatch-cpu.json` (everything as one "
        "record).",
    ]
    lines += _bench_section(bench)
    lines += _gpu_section()
    return "\n".join(lines) + "\n"


def _bench_section(bench) -> list[str]:
    lines = ["", "## Planner speed (`benchmarks/bench_microbatch.py`)", ""]
    if not bench:
        return lines + ["Not run for this report."]
    ilp, dp = bench["wd_ilp"], bench["wr_dp"]
    lines += [f"Run under the exclusive measurement lock on the same machine, median of {bench['repeats']} "
              "(`reports/microbatch-bench.json`). WD ILP over the first 100 convolution layers of ResNet-101 "
              "(desirable sets from the WR DP, batch 256, powerOfTwo, times modelled for dgx-h100 bf16); target "
              f"< 1 s: slowest **{max(r['ilp_s_median'] for r in ilp):.3f} s**. WR DP, batch 256, policy `all`, "
              f"three passes per layer; target < 0.1 s per layer: slowest (best mode) "
              f"**{max(r['per_layer_s_median'] for r in dp if r['mode'] == 'best'):.3f} s**.", "",
              "| passes | kernels | variant | configurations | budget | solver | optimal | ILP s (median) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in ilp:
        lines.append(f"| {r['passes']} | {r['kernels']} | {r['variant']} | {r['configurations']} | "
                     f"{r['budget_mib']} MiB | {r['solver']} | {r['optimal']} | {r['ilp_s_median']:.3f} |")
    lines += ["", "| layer | mode | rows per pass | s per layer (median) |", "|---|---|---|---|"]
    for r in dp:
        lines.append(f"| {r['layer']} | {r['mode']} | {r['rows_per_pass']} | {r['per_layer_s_median']:.4f} |")
    return lines


def _gpu_section() -> list[str]:
    return ["", "## On a GPU (not run: no GPU in this session)", "",
            "The same experiment on cuDNN needs only a different table: per layer, pass, micro-batch size and "
            "cuDNN engine, the time and workspace. The cuDNN frontend Python bindings (`nvidia-cudnn-frontend`, "
            "`reference/ecosystem.md` §9) build each convolution's operation graph for micro-batch size b, list "
            "the engine configurations with their workspace sizes (heuristics modes A and fallback), and time "
            "each one on CUDA tensors with CUDA events; those rows go into the same CSV "
            "(`layer,pass,microbatch_size,algorithm,time_s,workspace_bytes`), and `dlsim plan microbatch "
            "--bench-table` plans WR and WD exactly as here. Executing a plan runs the chosen engine per "
            "micro-batch on slices of the batch tensors with a workspace buffer of the limit's size (WR) or one "
            "segment per kernel (WD), ∇w accumulating with β = 1, and compares the CUDA-event time of the whole "
            "iteration with the prediction. The μ-cuDNN paper's shape is AlexNet and ResNet-50 convolutions and "
            "DeepBench layers at limits 8–512 MiB; on a GPU the per-call launch overhead (a few μs) enters every "
            "micro-batch and is part of each measured row, as the CPU's Python dispatch is here."]
