"""`validate_gpu()`: calibrate and validate on one GPU in one command, within a time budget (issue 33).

One run, in phases of decreasing value (`dlsim.validate.gpu_suite.PHASES`), each appending what it
measures as it measures it:

1. device: what it runs on (`dlsim.calibrate.compute_hostinfo`: name, memory, multiprocessors, compute
   capability, clocks, driver, CUDA, cuBLAS, cuDNN, torch), whether FP8 GEMMs run
   (`dlsim.calibrate.cuda_calls.fp8_support`), which built-in profile describes the device
   (`builtin_profile`), and the networks' batches (halved until dlsim's predicted peak memory fits);
2. gemm: the GEMM curve, square n×n×n in bf16, fp16 and (where it runs) fp8, and every GEMM of the
   networks' training steps (the transformer and classifier shapes, bf16);
3. steps: real eager training steps of the networks (`dlsim.validate.gpu_steps`, each in a fresh process);
4. kernels: the networks' other kernels (memory-bound, convolutions, the Adam step over their tensors);
5. families: element-wise, normalisation, softmax and dropout sweeps, the fused Adam step by size,
   scaled dot-product attention forward and backward with each backend, copies;
6. compiled: the networks' training steps under ``torch.compile``, as long as the budget lasts.

The kernels of phases 2, 4 and 5 are timed by the calibration itself (`calibrate_tasks`: the same
timer, CUDA events on a GPU, after warm-up, a cache flush before each call, in a fresh random order)
into a NEW profile directory beside the report, ``OUT/validation-gpu-<device>/<device>-measured/``: the
built-in profiles learn nothing from a run; a measured table becomes a profile only there. A rerun into
the same OUT resumes that calibration (its rows are kept) and measures the steps again.

Files (OUT, default ``reports/``): ``validation-gpu-<device>/records.jsonl`` (every record of every run,
appended and fsynced as measured), the calibrated profile, and ``validation-gpu-<device>.md`` and
``.json``, rewritten after every phase and every step measurement from the latest run's records
(`summarize`; `report_gpu` rewrites them later from the files alone). A run cut short by the budget or
by the machine keeps everything it measured; the report says what was not reached.
"""

from __future__ import annotations

import datetime
import json
import math
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlsim.api.calibrate_compute import calibrate_tasks, plan
from dlsim.api.models import as_model, profiles
from dlsim.api.validate_gpu_compare import (
    STACK,
    builtin_device,
    calibrated_kernels,
    family_rows,
    network_rows,
    predict_step,
    record_kernels,
    safely,
)
from dlsim.calibrate.compute_plan import (
    DEFAULT_CONV_ALGORITHM,
    GemmTask,
    OptimizerTask,
    memory_sweep,
    optimizer_sweep,
    square_gemms,
)
from dlsim.calibrate.compute_timer import check_device, set_threads
from dlsim.errors import DlsimError, SpecError
from dlsim.io.files import write_atomic
from dlsim.io.jsonl import JsonLinesWriter, read_records
from dlsim.validate.gpu_steps import COMPILE_BACKENDS, measure_case
from dlsim.validate.gpu_suite import (
    COMPILE_ORDER,
    MEMORY_SHARE,
    Budget,
    Scale,
    StepCase,
    scale_for,
    step_cases,
)

SCHEMA_VERSION = 1
KIND = "validate-gpu"
FAMILY_OPS = ("relu", "gelu", "add", "layernorm", "rmsnorm", "softmax", "dropout")
FAMILY_DTYPE = "bf16"
GEMM_DTYPES = ("bf16", "fp16")
CPU_BUILTIN = "cpu-epyc-2core"
RECORDS = "records.jsonl"


def device_slug(device: str, name: str) -> str:
    """``cpu``, or the GPU's name in lower case with dashes (``NVIDIA H200`` -> ``nvidia-h200``)."""
    return "cpu" if device == "cpu" else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def builtin_profile(device: str, name: str, given: str | None = None) -> tuple[str | None, str]:
    """The built-in profile that describes the device `name` and why: the one given; on a CPU the profile
    dlsim measured on this project's machines; on a GPU the built-in profile whose device names the same
    model (H200, A100, ...), the first of several in name order (they come from the same datasheets)."""
    if given:
        return given, "given with --builtin"
    if device == "cpu":
        return CPU_BUILTIN, ("dlsim has no datasheet profile of a CPU; cpu-epyc-2core is the built-in profile measured "
                             "on this project's 2-core machines (its meta.yaml records that host)")
    tokens = [t for t in re.findall(r"[A-Z]+\d+[A-Z]*", name.upper()) if t not in ("NVIDIA", "AMD")]
    for token in tokens:
        hits = sorted(p["name"] for p in profiles() if token in re.findall(r"[A-Z]+\d+[A-Z]*", p["device"].upper()))
        if hits:
            extra = f" (also {', '.join(hits[1:])})" if len(hits) > 1 else ""
            return hits[0], f"its device is the {token} ({_device_name(hits[0])}){extra}"
    return None, f"no built-in profile names a {name}: prediction (a) is not made"


def _device_name(profile: str) -> str:
    from dlsim.api.models import as_cluster
    return as_cluster(profile).device.name


class RunLog:
    """The run's records: appended to records.jsonl at once (fsynced) and kept for the report."""

    def __init__(self, path: Path, run: str, budget: Budget):
        self.writer, self.run, self.budget, self.records = JsonLinesWriter(path), run, budget, []

    def add(self, rec: dict[str, Any]) -> dict[str, Any]:
        rec = {**rec, "run": self.run, "at_s": round(self.budget.elapsed(), 3)}
        self.writer.append([rec])
        self.records.append(rec)
        return rec


def fit_batch(case: StepCase, device: str, memory_bytes: float, cluster: str | None) -> tuple[StepCase, str | None]:
    """`case` with its batch halved until dlsim's predicted peak memory is at most `MEMORY_SHARE` of the
    device's (`cluster` prices it; memory does not depend on the device's speed), and a note when halved."""
    from dataclasses import replace
    if cluster is None:
        return case, None
    batch = case.batch
    while True:
        got = predict_step(replace(case, batch=batch), device, cluster)
        if "error" in got:
            return case, f"{case.key}: batch {batch} not checked against the device's memory ({got['error']})"
        if got["peak_memory_bytes"] <= MEMORY_SHARE * memory_bytes or batch == 1:
            break
        batch //= 2
    note = f"{case.key}: batch {case.batch} -> {batch} (predicted memory)" if batch != case.batch else None
    return replace(case, batch=batch), note


def _phase(log: RunLog, name: str, started: float, status: str = "done", **detail: Any) -> None:
    log.add({"kind": "phase", "phase": name, "status": status, "seconds": round(time.monotonic() - started, 3),
             **detail})


def _steps_status(log: RunLog, mode: str) -> str:
    """"stopped" when the budget cut a step measurement of `mode`, else "done"."""
    cut = any(r.get("kind") == "step" and r["mode"] == mode and r["status"] == "cut" for r in log.records)
    return "stopped" if cut else "done"


def _calibration(log: RunLog, phase: str, rec: dict[str, Any]) -> str:
    log.add({"kind": "calibration", "phase": phase, **{k: rec.get(k) for k in (
        "tasks", "measured", "already_measured", "failed", "stopped", "seconds", "profile", "warnings")}})
    return "stopped" if rec.get("stopped") else "done"


def validate_gpu(out: str | Path = "reports", *, device: str = "cuda", budget_s: float = 480.0,
                 builtin: str | None = None, compile_backend: str = "inductor", threads: int | None = None,
                 clock: Callable[[], float] = time.monotonic, command: str = "",
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the phases (module docstring) within `budget_s` seconds; the summary record (also written as
    JSON and Markdown into `out`). `compile_backend` "none" leaves the compiled steps out."""
    if compile_backend not in (*COMPILE_BACKENDS, "none"):
        raise SpecError(f"unknown compile backend {compile_backend!r} (use {', '.join(COMPILE_BACKENDS)} or none)",
                        field="compile_backend")
    if not budget_s > 0:
        raise SpecError(f"the budget must be positive, got {budget_s!r} s", field="budget")
    check_device(device)
    if builtin is not None:
        from dlsim.api.models import as_cluster
        as_cluster(builtin)  # a profile that does not load: one line now, not a note after the run
    say = progress or (lambda _text: None)
    budget = Budget(budget_s, clock)
    threads_used = set_threads(threads)
    scale = scale_for(device, budget_s)
    from dlsim.calibrate.compute_hostinfo import host_description
    facts = host_description(device, threads_used)
    slug = device_slug(device, str(facts["device"]))
    out = Path(out)
    workdir = out / f"validation-gpu-{slug}"
    profile_dir = workdir / f"{slug}-measured"
    run = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    log = RunLog(workdir / RECORDS, run, budget)
    log.add({"kind": "run", "device": device, "budget_s": budget_s, "compile_backend": compile_backend,
             "command": command or " ".join(sys.argv), "profile_dir": profile_dir.name, "out": str(out)})

    cache: dict[tuple, Any] = {}

    def report() -> dict[str, Any]:
        return write_report(workdir, out, slug, log.records, cache)

    # 1. device facts, the built-in profile, the networks' batches
    started = time.monotonic()
    say("device: facts, FP8, built-in profile")
    from dlsim.calibrate.cuda_calls import fp8_support
    fp8 = fp8_support(device)
    builtin_name, why = builtin_profile(device, str(facts["device"]), builtin)
    cases, notes = [], []
    for case in step_cases(device):
        fitted, note = fit_batch(case, device, float(facts["memory_bytes"]), builtin_name)
        cases.append(fitted)
        notes += [note] if note else []
    dtypes = GEMM_DTYPES + (("fp8",) if fp8[0] else ())
    log.add({"kind": "device", "facts": facts, "fp8": {"supported": fp8[0], "why": fp8[1]},
             "builtin": {"name": builtin_name, "why": why}, "scale": _scale_dict(scale), "gemm_dtypes": list(dtypes),
             "cases": [c.to_dict() for c in cases], "notes": notes})
    _phase(log, "device", started)
    report()

    seed = int(time.time()) % 2**31
    common = {"device": device, "threads": threads, "repeats": scale.repeats,
              "command": command or " ".join(sys.argv)}
    models = [_model(c, device) for c in cases]
    model_plan = plan(models, [c.batch for c in cases], device=device, dtypes=(FAMILY_DTYPE,), grid=False,
                      algorithms=(DEFAULT_CONV_ALGORITHM[device],))

    # 2. the GEMM curve and the networks' GEMMs
    started = time.monotonic()
    say(f"gemm: square GEMMs in {', '.join(dtypes)} and the networks' GEMMs")
    tasks = square_gemms(dtypes, scale.gemm_sizes) + [t for t in model_plan if isinstance(t, GemmTask)]
    rec = calibrate_tasks(profile_dir, tasks, dtypes=dtypes, seed=seed, stop=budget.stop("gemm"),
                          run={"phase": "gemm"}, **common)
    _phase(log, "gemm", started, _calibration(log, "gemm", rec))
    report()

    # 3. eager training steps
    started = time.monotonic()
    for case in cases:
        say(f"steps: {case.label} (eager)")
        release(device)
        log.add(measure_case(case, "eager", budget.phase_left("steps"), **_step_args(device, compile_backend, scale,
                                                                                       threads)))
        report()
    _phase(log, "steps", started, _steps_status(log, "eager"))

    # 4. the networks' other kernels
    started = time.monotonic()
    say("kernels: the networks' memory-bound kernels, convolutions and Adam steps")
    rest = [t for t in model_plan if not isinstance(t, GemmTask) and
            not (isinstance(t, OptimizerTask) and t.optimizer != "adam")]
    rec = calibrate_tasks(profile_dir, rest, dtypes=dtypes, seed=seed + 1, stop=budget.stop("kernels"),
                          run={"phase": "kernels"}, **common)
    _phase(log, "kernels", started, _calibration(log, "kernels", rec))
    report()

    # 5. kernel families
    started = time.monotonic()
    say("families: element-wise, norms, softmax, dropout, Adam, attention backends, copies")
    tasks = memory_sweep((FAMILY_DTYPE,), FAMILY_OPS, scale.elements) + optimizer_sweep(optimizers=("adam",),
                                                                                        params=scale.adam_params)
    rec = calibrate_tasks(profile_dir, tasks, dtypes=dtypes, seed=seed + 2, stop=budget.stop("families"),
                          run={"phase": "families"}, **common)
    status = _calibration(log, "families", rec)
    status = _family_records(log, device, scale, budget) or status
    _phase(log, "families", started, status)
    report()

    # 6. compiled training steps
    started = time.monotonic()
    if compile_backend != "none":
        by_key = {c.key: c for c in cases}
        ordered = [by_key[k] for k in COMPILE_ORDER if k in by_key] + [c for c in cases if c.key not in COMPILE_ORDER]
        for case in ordered:
            say(f"compiled: {case.label} (torch.compile, {compile_backend})")
            release(device)
            log.add(measure_case(case, "compiled", budget.left(), **_step_args(device, compile_backend, scale,
                                                                                threads)))
            report()
    _phase(log, "compiled", started, "skipped" if compile_backend == "none" else _steps_status(log, "compiled"))
    log.add({"kind": "end", "seconds": round(budget.elapsed(), 3)})
    return report()


def release(device: str) -> None:
    """Give the memory this process cached back to the device before a training step runs beside it."""
    import gc

    import torch
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _model(case: StepCase, device: str) -> Any:
    from dlsim.api.validate_gpu_compare import case_model
    return case_model(case, device)


def _scale_dict(scale: Scale) -> dict[str, Any]:
    from dataclasses import asdict
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(scale).items()}


def _step_args(device: str, compile_backend: str, scale: Scale, threads: int | None) -> dict[str, Any]:
    from dlsim.calibrate.compute_ops import make_optimizer
    return {"load": as_model, "make_optimizer": make_optimizer, "device": device,
            "compile_backend": compile_backend if compile_backend != "none" else "inductor",
            "warmup": scale.warmup, "steps": scale.steps, "min_seconds": scale.min_step_s, "threads": threads}


def _family_records(log: RunLog, device: str, scale: Scale, budget: Budget) -> str | None:
    """SDPA forward and backward with each backend, and copies, timed and logged until the phase's time
    is spent; "stopped" when it was."""
    import torch

    from dlsim.calibrate.compute_timer import KernelTimer, cache_flusher
    from dlsim.calibrate.cuda_calls import SDPA_BACKENDS
    from dlsim.calibrate.kernel_families import time_copy, time_sdpa
    timer = KernelTimer(device, repeats=scale.repeats, flush=cache_flusher(device), events=True)
    dev = torch.device(device)
    work: list[Callable[[], dict[str, Any]]] = []
    for shape in scale.sdpa_shapes:
        for backend in SDPA_BACKENDS:
            if backend != "math":
                for pass_name in ("forward", "backward_data"):
                    work.append(lambda s=shape, b=backend, p=pass_name: time_sdpa(s, b, p, FAMILY_DTYPE, dev, timer))
    work += [lambda n=n: time_copy(n, FAMILY_DTYPE, dev, timer) for n in scale.elements]
    stop = budget.stop("families")
    for job in work:
        if stop():
            return "stopped"
        log.add(job())
    return None


# ------------------------------------------------------------------------------------------- the report
def latest_run(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the last run in a records file."""
    runs = [r["run"] for r in records if r.get("kind") == "run"]
    return [r for r in records if r.get("run") == runs[-1]] if runs else []


def summarize(records: list[dict[str, Any]], workdir: Path, cache: dict[tuple, Any] | None = None) -> dict[str, Any]:
    """The summary record of one run's records (see `dlsim.api.validate_gpu_compare`); `cache` keeps
    predictions between reports of one run."""
    run = next(r for r in records if r.get("kind") == "run")
    dev = next((r for r in records if r.get("kind") == "device"), None)
    device = run["device"]
    cases = [StepCase.from_dict(c) for c in dev["cases"]] if dev else []
    builtin = (dev or {}).get("builtin", {}).get("name")
    steps = {(r["case"], r["mode"]): r for r in records if r.get("kind") == "step"}
    profile_dir = workdir / run["profile_dir"]
    calibrated = profile_dir if (profile_dir / "profile.yaml").exists() else None
    notes: list[str] = list((dev or {}).get("notes", []))
    networks, err = safely(lambda: network_rows(cases, steps, device, builtin, calibrated, cache), [])
    notes += [f"networks: {err}"] if err else []
    bdev, err = safely(lambda: builtin_device(builtin), None)
    notes += [f"built-in profile: {err}"] if err else []
    kernels: list[dict[str, Any]] = []
    if bdev is not None:
        got, err = safely(lambda: calibrated_kernels(profile_dir, bdev), [])
        kernels += got
        notes += [f"calibrated tables: {err}"] if err else []
        got, err = safely(lambda: record_kernels([r for r in records if r.get("kind") == "kernel"], bdev), [])
        kernels += got
        notes += [f"kernel records: {err}"] if err else []
    phases = [r for r in records if r.get("kind") == "phase"]
    reached = {p["phase"] for p in phases}
    from dlsim.validate.gpu_suite import PHASES
    end = next((r for r in records if r.get("kind") == "end"), None)
    return {
        "schema_version": SCHEMA_VERSION, "kind": KIND, "run": run["run"], "device": device,
        "command": run.get("command"), "budget_s": run["budget_s"], "compile_backend": run.get("compile_backend"),
        "finished": end is not None, "elapsed_s": end["seconds"] if end else records[-1].get("at_s"),
        "facts": (dev or {}).get("facts", {}), "fp8": (dev or {}).get("fp8"),
        "gemm_dtypes": (dev or {}).get("gemm_dtypes"),
        "builtin_profile": (dev or {}).get("builtin"), "calibrated_profile": str(profile_dir),
        "calibrated_profile_written": calibrated is not None, "scale": (dev or {}).get("scale"),
        "phases": [{k: p.get(k) for k in ("phase", "status", "seconds")} for p in phases],
        "not_reached": [name for name, _ in PHASES if name not in reached],
        "calibration": [{k: v for k, v in r.items() if k not in ("kind", "run")} for r in records
                        if r.get("kind") == "calibration"],
        "prediction": {"how": "dlsim simulate, one device (dp = tp = pp = 1), one micro-batch of the case's batch, "
                              "the case's dtype and fused kernels, Adam as the run ran it", "stack": STACK},
        "networks": networks, "kernel_families": family_rows(kernels),
        "unavailable_kernels": sorted({f"{r['family']} {r['pass']}: {r['reason']}" for r in records
                                       if r.get("kind") == "kernel" and r.get("status") != "measured"}),
        "notes": notes,
    }


def write_report(workdir: Path, out: Path, slug: str, records: list[dict[str, Any]],
                 cache: dict[tuple, Any] | None = None) -> dict[str, Any]:
    """The summary of `records`, written as ``OUT/validation-gpu-<slug>.json`` and ``.md`` (atomically)."""
    from dlsim.report.gpu_truth import markdown
    md, js = out / f"validation-gpu-{slug}.md", out / f"validation-gpu-{slug}.json"
    summary = {**summarize(records, workdir, cache), "report_md": str(md), "report_json": str(js)}
    summary = _finite(summary)
    write_atomic(js, json.dumps(summary, indent=1, allow_nan=False) + "\n")
    write_atomic(md, markdown(summary))
    return summary


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinite float replaced by None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def report_gpu(workdir: str | Path) -> dict[str, Any]:
    """Rewrite the report of the last run recorded in `workdir` (``OUT/validation-gpu-<device>``) from its
    records and calibrated profile alone, beside it in OUT; the summary record."""
    workdir = Path(workdir)
    records = latest_run(read_records(workdir / RECORDS))
    if not records:
        raise DlsimError(f"{workdir / RECORDS}: no run recorded there (run dlsim validate gpu first)")
    slug = workdir.name.removeprefix("validation-gpu-")
    return write_report(workdir, workdir.parent, slug, records)


def report_gpu_in(out: str | Path, device: str) -> dict[str, Any]:
    """`report_gpu` of the run directory in `out` for `device` ("cpu", or the one GPU recorded there)."""
    out = Path(out)
    dirs = sorted(d for d in out.glob("validation-gpu-*") if (d / RECORDS).is_file()
                  and (d.name == "validation-gpu-cpu") == (device == "cpu"))
    if not dirs:
        raise DlsimError(f"{out}: no run of dlsim validate gpu --device {device} recorded there")
    if len(dirs) > 1:
        raise DlsimError(f"{out}: runs of several GPUs are recorded there ({', '.join(d.name for d in dirs)}); "
                         f"give --out a directory holding one")
    return report_gpu(dirs[0])
