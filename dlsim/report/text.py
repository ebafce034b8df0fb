"""Plain-text tables drawn from result records (dicts), for the terminal."""

from __future__ import annotations

from typing import Any, Sequence

from dlsim.units import format_bytes, format_count, format_params, format_time


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[bool] | None = None) -> str:
    """A fixed-width table; `right[i]` right-aligns column i (numbers)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    right = right or [False] * len(headers)
    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right)).rstrip()
    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _shape(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def models_table(rows: list[dict]) -> str:
    return table(["model", "params", "layers", "input", "dtype", "description"],
                 [[r["name"], format_params(r["params"]), r["layers"], _shape(r["input"]), r["dtype"], r["description"]]
                  for r in rows], [False, True, True, False, False, False])


def profiles_table(rows: list[dict]) -> str:
    """`dlsim profiles`: `memory` is the device's, `usable` what a training process can hold in tensors (the
    memory less the profile's `memory_reserved_gib` for the CUDA context and the allocator), the capacity
    every result measures its peak against."""
    return table(["profile", "device", "devices", "nodes x per node", "memory", "usable", "intra-node", "inter-node",
                  "measured"],
                 [[r["name"], r["device"], r["devices"], f"{r['nodes']} x {r['devices_per_node']}",
                   format_bytes(r["memory_bytes"]), format_bytes(r.get("memory_usable_bytes", r["memory_bytes"])),
                   r["intra_node"], r["inter_node"] or "-", ",".join(r["measured_tables"]) or "-"] for r in rows],
                 [False, False, True, False, True, True, False, False, False])


def model_table(rec: dict) -> str:
    """`dlsim model show`: one row per layer, then totals."""
    rows = []
    for layer in rec["layers"]:
        p = layer["passes"]
        rows.append([layer["name"], layer["type"], _shape(layer["out_shape"]), format_params(layer["params"]),
                     format_count(layer["forward_flops"]),
                     f"{format_count(p['forward']['work'])}/{p['forward']['depth']}",
                     f"{format_count(p['backward_data']['work'])}/{p['backward_data']['depth']}",
                     f"{format_count(p['backward_weight']['work'])}/{p['backward_weight']['depth']}",
                     format_bytes(layer["activation_bytes"])])
    body = table(["layer", "type", "output", "params", "fwd FLOPs", "W/D y", "W/D dx", "W/D dw", "activations"],
                 rows, [False, False, False, True, True, True, True, True, True])
    head = (f"{rec['model']}  batch {rec['batch']}  {rec['dtype']}  input {_shape(rec['input_shape'])}"
            f"{_assumed_note(rec)}\n")
    active = rec.get("active_params", rec["params"])
    used = f" ({format_params(active)} active per token)" if active != rec["params"] else ""
    foot = (f"\ntotal: {format_params(rec['params'])} parameters ({rec['params']:,}){used}, "
            f"forward {format_count(rec['forward_flops'])}FLOP, training step {format_count(rec['training_flops'])}FLOP, "
            f"work W {format_count(rec['work'])}, forward depth D {rec['forward_depth']}, "
            f"activations {format_bytes(rec['activation_bytes'])}")
    return head + body + foot


def _assumed_note(rec: dict) -> str:
    """`` (assumed: batch 32, dtype fp32 (the model's), optimizer adam)`` for the defaults a run filled in."""
    assumed = rec.get("assumed") or {}
    parts = [f"{k} {assumed[k]}" + (" (the model's)" if k == "dtype" else "") for k in ("batch", "dtype", "optimizer")
             if k in assumed]
    return f"  [defaults: {', '.join(parts)}]" if parts else ""


def estimate_table(rec: dict, top: int | None = None) -> str:
    """`dlsim estimate`: per-layer forward/backward times with provenance, then totals and memory."""
    layers = rec["layers"]
    total = rec["iteration_time_s"] or 1.0
    shown = sorted(layers, key=lambda r: -r["time_s"])[:top] if top else layers
    src = {"measured": "M", "interpolated": "I", "extrapolated": "X", "model": "R"}
    rows = []
    for r in shown:
        f, bx, bw = r["forward"], r["backward_data"], r["backward_weight"]
        tags = "".join(src[e["source"]] for e in (f, bx, bw))
        rows.append([r["name"], r["type"], format_time(f["time_s"]), format_time(bx["time_s"]),
                     format_time(bw["time_s"]), format_time(r["time_s"]), f"{100 * r['time_s'] / total:.1f}%", tags])
    body = table(["layer", "type", "forward", "bwd data", "bwd weight", "total", "share", "src"], rows,
                 [False, False, True, True, True, True, True, False])
    mem = rec["memory_bytes"]
    by = rec["time_by_source_s"]
    shares = ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by.items() if v > 0)
    fits = "fits" if rec["fits_in_memory"] else "DOES NOT FIT"
    lines = [
        f"{rec['model']} on one {rec['device']} ({rec['cluster']}), batch {rec['batch']}, {rec['dtype']}, {rec['optimizer']}"
        + _assumed_note(rec),
        "",
        body if not top else body + f"\n({len(layers) - len(shown)} more layers; --all shows every layer)",
        "",
        f"forward {format_time(rec['forward_time_s'])}, backward {format_time(rec['backward_time_s'])}, "
        f"optimizer step {format_time(rec['optimizer_time_s'])}",
        f"iteration time {format_time(rec['iteration_time_s'])}  ->  {rec['throughput_samples_per_s']:.1f} samples/s, "
        f"{format_count(rec['achieved_flops_per_s'])}FLOP/s achieved",
        f"memory: weights {format_bytes(mem['weights'])} + gradients {format_bytes(mem['gradients'])} + optimizer "
        f"{format_bytes(mem['optimizer'])} + activations {format_bytes(mem['activations'])} = {format_bytes(mem['total'])} "
        f"of {format_bytes(rec['memory_capacity_bytes'])} usable ({fits})",
        f"time by source: {shares}  (src: M measured, I interpolated, X extrapolated, R roofline model)",
    ]
    lines += [f"note: {n}" for n in rec.get("notes", [])]
    return "\n".join(lines)
