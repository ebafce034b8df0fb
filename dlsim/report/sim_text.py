"""Readable summaries of simulation records (from the record alone)."""

from __future__ import annotations

from typing import Any

from dlsim.units import format_bytes, format_time

_PARTS = (("compute", "compute"), ("recompute", "recompute"), ("exposed_comm", "exposed communication"),
          ("bubble", "pipeline bubble"), ("idle", "idle"))


def _strategy_line(s: dict[str, Any]) -> str:
    parts = [f"dp {s['dp']} x tp {s['tp']} x pp {s['pp']}" + (f" x cp {s['cp']}" if s.get("cp", 1) > 1 else "")
             + (f" x spatial {s['spatial']}" + (f" ({s['spatial'] // s['spatial_w']}x{s['spatial_w']})"
                                                 if s.get("spatial_w") else "") if s.get("spatial", 1) > 1 else "")
             + (f" (ep {s['ep']})" if s.get("ep", 1) > 1 else ""),
             f"micro-batch {s['microbatch_size']} x {s['num_microbatches']}",
             f"global batch {s['global_batch']}"]
    if s["pp"] > 1:
        parts.append(s["schedule"] + (f" (v={s['virtual_stages']})" if s["virtual_stages"] > 1 else ""))
    parts.append(f"sync {s['sync']}" + (f" s={s['staleness']}" if s["sync"] == "ssp" else ""))
    if s["zero"]:
        parts.append(f"ZeRO-{s['zero']}" + (" hybrid-sharded" if s.get("hybrid_shard") else "")
                     + (" (gradients all-reduced)" if s.get("zero_grad_reduce") == "allreduce" else "")
                     + _fsdp(s))
    if s.get("offload", "none") != "none":
        parts.append(f"offload {s['offload']}")
    if s["recompute"] != "none":
        parts.append(f"recompute {s['recompute']}")
    if s["compression"]["kind"] != "none":
        parts.append(f"compression {s['compression']['kind']}")
    if s["layer_groups"]:
        parts.append("layer groups " + ", ".join(f"{g['first']}..{g['last']}: {g['parallel']}"
                                                  for g in s["layer_groups"]))
    return ", ".join(parts)


# Defaults worth a line in the summary when the user did not give them (the record lists them all).
_HEADLINE_DEFAULTS = {"recompute": None, "zero": None, "fused_kernels": None, "overlap": "dp",
                      "collective": "dp", "schedule": "pp", "sequence_parallel": "tp",
                      "grad_accumulation": "num_microbatches"}


def precision_line(rec: dict[str, Any]) -> str:
    """``precision fp32 (the model's default; --dtype to change), optimizer adam``: what ran, said in words."""
    s, assumed = rec.get("strategy", {}), rec.get("assumed") or {}
    dtype = rec.get("dtype") or s.get("dtype")
    why = " (the model's dtype; --dtype to change)" if "dtype" in assumed else ""
    return f"precision {dtype}{why}, optimizer {s.get('optimizer')}"


_WHY = {"default": ", the default for a model that names none", "the model's": ", the model's",
        "given": ""}


def stack_line(rec: dict[str, Any]) -> str | None:
    """``stack megatron-core (…), the model's; overridden: fused_kernels`` (None without a stack)."""
    st = rec.get("stack")
    if not st:
        return None
    label = f"{st['name']} ({st['version']})" if st.get("version") else st["name"]
    line = f"stack {label}{_WHY.get(st.get('chosen', 'given'), '')}"
    fused = (rec.get("strategy") or st.get("values") or {}).get("fused_kernels")
    if fused is not None:
        line += "; fused kernels " + (", ".join(fused) if fused else "none")
    if st.get("overridden"):
        line += "; you set " + ", ".join(st["overridden"])
    return line + " (--stack to change; dlsim stacks show NAME)"


def assumed_line(rec: dict[str, Any]) -> str | None:
    """The headline defaults the run assumed, or None (`--json` lists every one under ``assumed``)."""
    assumed = rec.get("assumed") or {}
    s = rec.get("strategy", {})
    shown = []
    for key, needs in _HEADLINE_DEFAULTS.items():
        if key not in assumed or (needs and s.get(needs, 1) == 1):
            continue
        value = assumed[key]
        value = "none" if value == [] else value
        shown.append(f"{key.replace('_', ' ')} {value}")
    return ("defaults assumed: " + ", ".join(shown) + " (the JSON record lists all)") if shown else None


def throughput_text(rec: dict[str, Any]) -> str:
    """``201.7 samples/s, 413.1k tokens/s, 389 TFLOP/s per GPU (model FLOPs)``."""
    out = f"{rec['throughput_samples_per_s']:.4g} samples/s"
    if rec.get("tokens_per_s"):
        out += f", {_si(rec['tokens_per_s'])} tokens/s"
    if rec.get("model_tflops_per_gpu"):
        out += f", {rec['model_tflops_per_gpu']:.4g} TFLOP/s per GPU (model FLOPs)"
    return out


def _si(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.4g}{unit}"
    return f"{x:.4g}"


BUBBLE_WARNING = 0.5
MFU_WARNING = 0.10


def advice_lines(rec: dict[str, Any]) -> list[str]:
    """Warnings for a strategy that wastes the machine: a pipeline bubble over `BUBBLE_WARNING` of the
    iteration, a model FLOPs utilisation under `MFU_WARNING`."""
    t, out = rec["iteration_time_s"], []
    s = rec.get("strategy") or {}
    bubble = rec["breakdown_s"].get("bubble", 0.0) / t if t > 0 else 0.0
    if bubble > BUBBLE_WARNING:
        out.append(f"warning: the pipeline bubble is {bubble:.0%} of the iteration ({s.get('pp')} stages, "
                   f"{s.get('num_microbatches')} micro-batches): more micro-batches or fewer stages")
    mfu = rec.get("model_flops_utilisation") or 0.0
    if 0 < mfu < MFU_WARNING:
        out.append(f"warning: model FLOPs utilisation {mfu:.1%}: the devices mostly wait (see where the time goes)")
    return out


def simulation_summary(rec: dict[str, Any]) -> str:
    """Summary of a `simulation` or `async_simulation` record. A strategy that does not fit says so on its
    peak-memory line; the reason with its numbers is the record's `infeasible_reason`, which `dlsim simulate`
    prints once, as its error line."""
    if rec.get("kind") == "async_simulation":
        return async_summary(rec)
    t = rec["iteration_time_s"]
    lines = [f"{rec['model']} on {rec['cluster']} ({rec['device']})",
             f"strategy: {_strategy_line(rec['strategy'])}"]
    if stack_line(rec):
        lines.append(stack_line(rec))
    lines.append(precision_line(rec))
    extra = assumed_line(rec)
    if extra:
        lines.append(extra)
    lines += [f"iteration time   {format_time(t)}", *advice_lines(rec),
             f"throughput       {throughput_text(rec)}",
             f"utilisation      {rec['utilisation']:.1%} of device time computing, "
             f"model FLOPs utilisation {rec['model_flops_utilisation']:.1%}",
             "where the time goes (mean over devices):"]
    bd = rec["breakdown_s"]
    for key, label in _PARTS:
        share = bd[key] / t if t > 0 else 0.0
        lines.append(f"  {label:<24}{format_time(bd[key]):>12}  {share:6.1%}")
    lines.append(f"  {'communication (total)':<24}{format_time(rec['communication_s']):>12}  "
                 f"{rec['communication_s'] / t if t else 0:6.1%}  (overlapped or not)")
    worst = max(rec["devices"], key=lambda d: d["peak_memory_bytes"] / d["capacity_bytes"])
    mem = worst["memory_bytes"]
    fits = "" if rec["feasible"] else " (DOES NOT FIT)"
    lines.append(f"peak memory      {format_bytes(rec['peak_memory_bytes'])} of "
                 f"{format_bytes(worst['capacity_bytes'])} usable on {worst['name']}{fits}")
    lines.append("  " + ", ".join(f"{k} {format_bytes(v)}" for k, v in mem.items() if v > 0))
    lines.append("per device (simulated; each stands for `x` identical ranks):")
    lines.append(f"  {'device':<28}{'x':>5}{'compute':>11}{'exp.comm':>11}{'bubble':>11}{'idle':>11}{'memory':>12}")
    for d in rec["devices"][:16]:
        b = d["breakdown_s"]
        lines.append(f"  {d['name']:<28}{d['multiplicity']:>5}{format_time(b['compute'] + b['recompute']):>11}"
                     f"{format_time(b['exposed_comm']):>11}{format_time(b['bubble']):>11}{format_time(b['idle']):>11}"
                     f"{format_bytes(d['peak_memory_bytes']):>12}")
    if len(rec["devices"]) > 16:
        lines.append(f"  ... {len(rec['devices']) - 16} more")
    cp = rec["critical_path"]
    by = ", ".join(f"{k} {format_time(v)}" for k, v in sorted(cp["time_by_category_s"].items()))
    lines.append(f"critical path    {cp['tasks_on_path']} tasks: {by}; waiting {format_time(cp['waiting_s'])}")
    lines.append(f"priced from measured data: {rec['measured_share']:.1%} of task time")
    sim = rec["simulation"]
    lines.append(f"simulated {sim['simulated_devices']} of {sim['total_devices']} devices, {sim['tasks']} tasks, "
                 f"{sim['events']} events")
    for note in rec.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)


def async_summary(rec: dict[str, Any]) -> str:
    """Summary of an `async_simulation` record."""
    lines = [f"{rec['model']} on {rec['cluster']}: parameter server, sync {rec['sync']}, {rec['workers']} workers, "
             f"{rec['strategy']['ps_shards']} shards",
             precision_line(rec),
             f"simulated time   {format_time(rec['simulated_time_s'])} for {rec['strategy']['iterations']} "
             f"iterations per worker (compute alone {format_time(rec['iteration_compute_s'])} each)",
             f"throughput       {rec['throughput_samples_per_s']:.4g} samples/s, {rec['updates_per_s']:.4g} updates/s",
             f"staleness        mean {rec['staleness_mean']:.3g}, max {rec['staleness_max']}; histogram "
             + ", ".join(f"{k}: {v}" for k, v in rec["staleness_histogram"].items())]
    lines.append(f"  {'worker':<8}{'compute':>12}{'wait':>12}{'comm':>12}")
    for w in rec["workers_detail"][:16]:
        lines.append(f"  {w['worker']:<8}{format_time(w['compute_s']):>12}{format_time(w['wait_s']):>12}"
                     f"{format_time(w['comm_s']):>12}")
    for note in rec.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _fsdp(s: dict) -> str:
    """FSDP2's units and copies of a ZeRO-3 strategy record (`dlsim.plan.fsdp`), as the summary names them."""
    if s["zero"] != 3:
        return ""
    said = []
    if s.get("fsdp_units") == "block":
        said.append("FSDP2 units of one transformer block, root and last block kept gathered for the backward")
    if s.get("fsdp_copies"):
        said.append("all-gather copy-out and reduce-scatter copy-in kernels")
    return f" ({'; '.join(said)})" if said else ""
