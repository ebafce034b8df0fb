"""Strategy comparison figures (matplotlib Agg), drawn from records alone.

`comparison_figure` draws a ``comparison`` record (`dlsim.api.compare`): per strategy the iteration
time split into compute, recomputation, exposed communication, pipeline bubble and idle in
seconds, the peak memory of its fullest device by kind against the device capacity, and the
throughput; strategies that cannot be built or do not fit are marked, with their reason below.
`scaling_figure` draws a comparison with ``scaling``: throughput, speedup and parallel efficiency
against GPUs (ideal lines) and the iteration time split per GPU count. `simulation_figure` draws one
``simulation`` record: the split per simulated device and its memory against capacity.

Every figure's titles, axis labels and legend entries are returned by `figure_text` and written into
a PNG's ``Description`` metadata by `save_figure`, so that a saved figure says what it shows.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from dlsim.report.comm_plots import _pyplot
from dlsim.report.strategy_fields import field_text, varying_fields

GIB = 2.0 ** 30
PARTS = (("compute", "compute", "#4c72b0"), ("recompute", "recomputation", "#8172b2"),
         ("exposed_comm", "exposed communication", "#dd8452"), ("bubble", "pipeline bubble", "#c9b38a"),
         ("idle", "idle", "#bbbbbb"))
MEMORY = (("weights", "weights", "#4c72b0"), ("gradients", "gradients", "#55a868"),
          ("optimizer", "optimizer state", "#4fa3a5"), ("activations", "activations", "#da8bc3"),
          ("other", "other (workspace, buffers)", "#bbbbbb"))
CAPACITY_COLOR = "#c44e52"
MAX_REASON_CHARS = 150


def figure_text(fig: Any) -> list[str]:
    """Every title, axis label, legend entry, row name (y tick labels that are not numbers) and note
    of `fig`, in drawing order."""
    out: list[str] = []
    if getattr(fig, "_suptitle", None) is not None and fig._suptitle.get_text():
        out.append(fig._suptitle.get_text())
    for ax in fig.axes:
        for text in (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()):
            if text:
                out.append(text)
        legend = ax.get_legend()
        if legend is not None:
            out.extend(t.get_text() for t in legend.get_texts())
        for tick in ax.get_yticklabels():
            label = tick.get_text()
            if label and not label.replace("\u2212", "-").replace(".", "", 1).lstrip("-").isdigit() \
                    and "$" not in label:
                out.append(label.replace("\n", " "))
        out.extend(t.get_text() for t in ax.texts if t.get_text() and not t.get_text().strip()[:1].isdigit())
    for legend in fig.legends:
        out.extend(t.get_text() for t in legend.get_texts())
    out.extend(t.get_text() for t in fig.texts if t.get_text() and t is not getattr(fig, "_suptitle", None))
    return out


def save_figure(fig: Any, path: str | Path) -> None:
    """Write `fig` to `path` (format from the suffix) atomically; a PNG carries `figure_text` as metadata."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower() or ".png"
    meta = None
    if suffix == ".png":
        texts = figure_text(fig)
        meta = {"Title": texts[0] if texts else "", "Description": "\n".join(texts), "Software": "dlsim"}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=130, bbox_inches="tight", metadata=meta)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _seconds_unit(longest: float) -> tuple[str, float]:
    return ("ms", 1e-3) if 0 < longest < 1.0 else ("s", 1.0)


def _short(text: str, limit: int = MAX_REASON_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _memory_parts(memory: Mapping[str, float]) -> dict[str, float]:
    known = {k for k, _, _ in MEMORY if k != "other"}
    parts = {k: float(memory.get(k, 0.0)) for k in known}
    parts["other"] = sum(float(v) for k, v in memory.items() if k not in known)
    return parts


def _fullest(entry: Mapping[str, Any]) -> Mapping[str, Any] | None:
    devices = entry.get("devices") or []
    return max(devices, key=lambda d: d["peak_memory_bytes"] / max(d["capacity_bytes"], 1.0)) if devices else None


def _label(entry: Mapping[str, Any], varying: Sequence[str] = ()) -> str:
    gpus = entry.get("gpus")
    s = entry.get("strategy") or {}
    name = str(entry["name"]).split()
    shape = " ".join([f"{k}{s[k]}" for k in ("dp", "tp", "pp") if s and f"{k}{s[k]}" not in name]
                     + [f"{k}={field_text(s[k])}" for k in varying if k in s and f"{k}={field_text(s[k])}" not in name])
    inside = ", ".join(x for x in (shape, f"{gpus} GPUs" if gpus else "") if x)
    return f"{entry['name']} ({inside})" if inside else str(entry["name"])


def _status_note(entry: Mapping[str, Any]) -> str:
    return "cannot be built" if entry.get("limit") == "build" else "does not fit in memory"


def _time_panel(ax: Any, rows: Sequence[Mapping[str, Any]], unit: tuple[str, float], title: str) -> None:
    """Stacked horizontal bars of the five parts (seconds), one per row; rows without a breakdown marked."""
    name, scale = unit
    longest = max((sum((r.get("breakdown_s") or {}).values())) for r in rows) / scale
    for i, r in enumerate(rows):
        bd = r.get("breakdown_s")
        if not bd:
            ax.text(0.01 * (longest or 1), i, "cannot be built (reason below)", va="center", fontsize=8,
                    color="#555555", style="italic")
            continue
        left = 0.0
        fits = r.get("feasible", True)
        for key, label, color in PARTS:
            width = bd.get(key, 0.0) / scale
            ax.barh(i, width, left=left, color=color, height=0.7, label=label if i == _first_bar(rows) else None,
                    alpha=1.0 if fits else 0.45, hatch=None if fits else "//", edgecolor="white" if fits else "#666666",
                    linewidth=0.3)
            left += width
        ax.text(left, i, f" {left:.4g} {name}", va="center", fontsize=7, color="black" if fits else CAPACITY_COLOR)
    ax.set_xlim(0, (longest or 1) * 1.35)
    ax.set_xlabel(f"time per iteration ({name})")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)


def _row_labels(ax: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    """Row names on the y axis; infeasible rows in red with what rules them out."""
    labels = [r["label"] if r.get("feasible", True) else f"{r['label']}\n{_status_note(r)}" for r in rows]
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    for tick, r in zip(ax.get_yticklabels(), rows):
        if not r.get("feasible", True):
            tick.set_color(CAPACITY_COLOR)
    ax.set_ylim(len(rows) - 0.5, -0.5)


def _first_bar(rows: Sequence[Mapping[str, Any]]) -> int:
    return next((i for i, r in enumerate(rows) if r.get("breakdown_s")), -1)


def _memory_panel(ax: Any, rows: Sequence[Mapping[str, Any]], title: str,
                  xlabel: str = "peak memory of the fullest device (GiB)") -> None:
    """Stacked memory by kind (GiB) of each row's fullest device, the device capacity as a red mark."""
    first = next((i for i, r in enumerate(rows) if r.get("memory_bytes")), -1)
    cap_labelled = False
    top = 0.0
    for i, r in enumerate(rows):
        mem = r.get("memory_bytes")
        if not mem:
            if r.get("memory_note"):  # e.g. parameter-server workers: said, not drawn as zero
                ax.text(0.02, i, r["memory_note"], va="center", fontsize=7, color="#555555", style="italic",
                        transform=ax.get_yaxis_transform())
            continue
        parts = _memory_parts(mem)
        left = 0.0
        for key, label, color in MEMORY:
            width = parts[key] / GIB
            ax.barh(i, width, left=left, color=color, height=0.7, label=label if i == first else None,
                    edgecolor="white", linewidth=0.3)
            left += width
        cap = r["capacity_bytes"] / GIB
        ax.vlines(cap, i - 0.45, i + 0.45, color=CAPACITY_COLOR, linewidth=2,
                  label=None if cap_labelled else f"device capacity ({cap:.3g} GiB usable)")
        cap_labelled = True
        over = left > cap
        ax.text(left, i, f" {left:.3g} GiB" + (f" (+{left - cap:.3g} over)" if over else ""), va="center",
                fontsize=7, color=CAPACITY_COLOR if over else "black")
        top = max(top, left, cap)
    ax.set_xlim(0, (top or 1) * 1.4)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)


def _rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    varying = varying_fields(record["entries"])
    for e in record["entries"]:
        dev = _fullest(e)
        rows.append({**e, "label": _label(e, varying), "memory_bytes": dev["memory_bytes"] if dev else None,
                     "capacity_bytes": dev["capacity_bytes"] if dev else e.get("capacity_bytes", 0.0)})
    return rows


def _where(record: Mapping[str, Any]) -> str:
    batch = record.get("global_batch")
    scaling = record.get("scaling")
    tail = ""
    if scaling == "strong":
        tail = f", global batch {batch or 'of each strategy'} fixed"
    elif scaling == "weak":
        tail = f", global batch growing with the GPUs{f' from {batch}' if batch else ''}"
    elif batch:
        tail = f", global batch {batch}"
    fixed = f"; every strategy: {record['fixed']}" if record.get("fixed") else ""
    return f"{record['model']} on {record['cluster']} ({record.get('device', 'device')}){tail}{fixed}"


def _reasons(fig: Any, rows: Sequence[Mapping[str, Any]], y: float) -> None:
    bad = [r for r in rows if not r.get("feasible", True)]
    if not bad:
        return
    lines = [f"x {_label(r)}: {_short(r.get('reason', ''))}" for r in bad[:20]]
    if len(bad) > 20:
        lines.append(f"... and {len(bad) - 20} more (see the table or the CSV)")
    fig.text(0.01, y, "Not feasible:\n" + "\n".join(lines), ha="left", va="top", fontsize=7.5, color="#333333",
             family="monospace")


def _legends_below(ax: Any, mx: Any, height: float) -> None:
    """The time and memory panels' legends under them (a panel with nothing drawn has none)."""
    for axis, ncol in ((ax, 3), (mx, 2)):
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.7 / height - 0.06), ncol=ncol,
                        frameon=False)


def comparison_figure(record: Mapping[str, Any]) -> Any:
    """Time split (s), memory against capacity and throughput per strategy of a comparison record."""
    plt = _pyplot()
    rows = _rows(record)
    n = len(rows)
    height = max(3.2, 0.42 * n + 1.8)
    fig, (ax, mx, tx) = plt.subplots(1, 3, figsize=(15, height), sharey=True,
                                     gridspec_kw={"width_ratios": [2.2, 1.5, 1.0]})
    longest = max((r.get("iteration_time_s") or 0.0) for r in rows)
    _time_panel(ax, rows, _seconds_unit(longest), "iteration time split (mean over devices)")
    _memory_panel(mx, rows, "memory per device against capacity")
    for i, r in enumerate(rows):
        tp = r.get("throughput_samples_per_s")
        if tp is None:
            continue
        fits = r.get("feasible", True)
        tx.barh(i, tp, color="#55a868" if fits else "#cccccc", height=0.7, hatch=None if fits else "//",
                edgecolor="white" if fits else "#666666", linewidth=0.3)
        mfu = r.get("model_flops_utilisation")
        tx.text(tp, i, f" {tp:.4g}" + (f" ({100 * mfu:.0f}% MFU)" if mfu else ""), va="center", fontsize=7)
    best = max((r.get("throughput_samples_per_s") or 0.0) for r in rows)
    tx.set_xlim(0, (best or 1) * 1.6)
    tx.set_xlabel("throughput (samples/s)")
    tx.set_title("throughput (model FLOPs utilisation)", fontsize=10)
    tx.grid(axis="x", alpha=0.3)
    _row_labels(ax, rows)
    _legends_below(ax, mx, height)
    fig.suptitle(f"Strategies compared: {_where(record)}", fontsize=11)
    fig.subplots_adjust(wspace=0.08, top=1 - 0.55 / height, bottom=1.3 / height)
    _reasons(fig, rows, 0.0)
    return fig


def scaling_figure(record: Mapping[str, Any]) -> Any:
    """Throughput, speedup and parallel efficiency against GPUs per strategy (ideal lines), and the
    iteration time split per GPU count."""
    plt = _pyplot()
    curves = record.get("scaling_curves") or {}
    rows = _rows(record)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5))
    (thr, spd), (eff, brk) = axes
    counts = sorted({r["gpus"] for r in rows if r.get("gpus")})
    colors = {name: f"C{i % 10}" for i, name in enumerate(curves)}
    baselines: set[int] = set()
    for name, pts in curves.items():
        c = colors[name]
        ok = [p for p in pts if p["feasible"] and p.get("throughput_samples_per_s")]
        oom = [p for p in pts if not p["feasible"] and p.get("throughput_samples_per_s")]
        thr.plot([p["gpus"] for p in ok], [p["throughput_samples_per_s"] for p in ok], "o-", color=c, label=name)
        if oom:
            thr.plot([p["gpus"] for p in oom], [p["throughput_samples_per_s"] for p in oom], "o", color=c,
                     markerfacecolor="none")
        unbuilt = [p["gpus"] for p in pts if not p["feasible"] and not p.get("throughput_samples_per_s")]
        if unbuilt:  # no throughput to place: an x on the bottom edge at its GPU count
            thr.plot(unbuilt, [0.03] * len(unbuilt), "x", color=c, markersize=8, clip_on=False,
                     transform=thr.get_xaxis_transform())
        sp = [p for p in pts if p.get("speedup") is not None and p["feasible"]]
        if sp:
            spd.plot([p["gpus"] for p in sp], [p["speedup"] for p in sp], "o-", color=c,
                     label=f"{name} (from {sp[0]['baseline_gpus']} GPUs)")
            eff.plot([p["gpus"] for p in sp], [100 * p["efficiency"] for p in sp], "o-", color=c, label=name)
            baselines.add(sp[0]["baseline_gpus"])
    for b in sorted(baselines):
        xs = [n for n in counts if n >= b]
        spd.plot(xs, [n / b for n in xs], "k--", linewidth=1, label=f"ideal (linear from {b} GPUs)")
    eff.axhline(100, color="k", linestyle="--", linewidth=1, label="ideal (100 %)")
    if any(not p["feasible"] and p.get("throughput_samples_per_s") for pts in curves.values() for p in pts):
        thr.plot([], [], "o", color="grey", markerfacecolor="none", label="does not fit in memory")
    if any(not p["feasible"] and not p.get("throughput_samples_per_s") for pts in curves.values() for p in pts):
        thr.plot([], [], "x", color="grey", label="not feasible (reason below)")
    if not any(p["feasible"] for pts in curves.values() for p in pts):
        for ax in (thr, spd, eff):
            ax.text(0.5, 0.5, "no feasible point (reasons below)", transform=ax.transAxes, ha="center",
                    va="center", fontsize=10, color=CAPACITY_COLOR)
    for ax in (thr, spd, eff):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        if counts:  # the same GPU range on every panel, drawn or empty
            ax.set_xlim(counts[0] / 1.25, counts[-1] * 1.25)
        ax.minorticks_off()
        ax.set_xlabel("GPUs")
        ax.grid(True, which="both", alpha=0.3)
    if any(p.get("throughput_samples_per_s") for pts in curves.values() for p in pts):
        thr.set_yscale("log")  # log axes need a positive value: left linear when nothing was simulated
    else:
        thr.set_yticks([])
    if baselines:
        spd.set_yscale("log", base=2)
    from matplotlib.ticker import FuncFormatter
    for axis in (thr.yaxis, spd.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(FuncFormatter(lambda v, _, show=axis is thr.yaxis: f"{v:.3g}" if show else ""))
    thr.set_ylabel("throughput (samples/s)")
    thr.set_title("throughput", fontsize=10)
    spd.set_ylabel("speedup (throughput / throughput at the baseline)")
    spd.set_title("speedup against GPUs", fontsize=10)
    eff.set_ylabel("parallel efficiency (%)")
    eff.set_ylim(0, max([110.0] + [100 * p["efficiency"] * 1.05 for pts in curves.values() for p in pts
                                   if p.get("efficiency")]))
    eff.set_title("parallel efficiency = speedup / GPU ratio", fontsize=10)
    for ax in (thr, spd, eff):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    _grouped_breakdown(brk, rows, counts, list(curves))
    fig.suptitle(f"{record.get('scaling', '').capitalize()} scaling: {_where(record)}", fontsize=11)
    fig.subplots_adjust(hspace=0.32, wspace=0.25)
    _reasons(fig, rows, 0.02)
    return fig


def _grouped_breakdown(ax: Any, rows: Sequence[Mapping[str, Any]], counts: Sequence[int], names: Sequence[str]) -> None:
    """Vertical stacked bars of the time split, grouped by GPU count, one bar per strategy."""
    longest = max((r.get("iteration_time_s") or 0.0) for r in rows)
    unit, scale = _seconds_unit(longest)
    k = max(len(names), 1)
    width = 0.8 / k
    labelled = False
    tags = [chr(ord("A") + j) if j < 26 else str(j) for j in range(len(names))]
    for j, name in enumerate(names):
        for g, n in enumerate(counts):
            r = next((r for r in rows if r["name"] == name and r["gpus"] == n), None)
            x = g - 0.4 + width * (j + 0.5)
            if r is None or not r.get("breakdown_s"):
                if r is not None:
                    ax.text(x, 0, "x", ha="center", va="bottom", color=CAPACITY_COLOR, fontsize=9)
                continue
            bottom = 0.0
            fits = r.get("feasible", True)
            for key, label, color in PARTS:
                h = r["breakdown_s"].get(key, 0.0) / scale
                ax.bar(x, h, bottom=bottom, width=width * 0.9, color=color, label=None if labelled else label,
                       alpha=1.0 if fits else 0.45, hatch=None if fits else "//", edgecolor=f"C{j % 10}",
                       linewidth=0.8)
                bottom += h
            labelled = True
            ax.text(x, bottom, tags[j], ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(counts)), [str(n) for n in counts])
    ax.set_xlim(-0.5, len(counts) - 0.5)  # every slot, drawn or marked x
    ax.set_xlabel("GPUs (bars: " + ", ".join(f"{t} = {n}" for t, n in zip(tags[:8], names[:8]))
                  + (", ..." if len(names) > 8 else "") + ")", fontsize=8)
    ax.set_ylim(0, (longest / scale or 1) * 1.3)
    ax.set_ylabel(f"time per iteration ({unit})")
    ax.set_title("iteration time split (hatched: does not fit; x: cannot be built)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    if labelled:
        ax.legend(fontsize=7, loc="upper center", ncol=3)


def simulation_figure(record: Mapping[str, Any], max_devices: int = 16) -> Any:
    """One simulation record: the time split per simulated device (and their mean), memory per device."""
    plt = _pyplot()
    devices = list(record.get("devices") or [])
    shown = devices[:max_devices]
    mean = {"label": "mean over all devices", "breakdown_s": {k: record["breakdown_s"][k] for k, _, _ in PARTS},
            "feasible": record.get("feasible", True), "limit": "memory"}
    rows = [mean] + [{"label": f"{d['name']}" + (f" x{d['multiplicity']}" if d.get("multiplicity", 1) > 1 else ""),
                      "breakdown_s": {k: d["breakdown_s"][k] for k, _, _ in PARTS},
                      "memory_bytes": d["memory_bytes"], "capacity_bytes": d["capacity_bytes"],
                      "feasible": d.get("fits_in_memory", True), "limit": "memory"} for d in shown]
    n = len(rows)
    height = max(3.2, 0.4 * n + 1.8)
    fig, (ax, mx) = plt.subplots(1, 2, figsize=(13, height), sharey=True, gridspec_kw={"width_ratios": [1.6, 1.2]})
    _time_panel(ax, rows, _seconds_unit(record["iteration_time_s"]), "iteration time split per simulated device")
    _memory_panel(mx, rows, "memory per device against capacity", "peak memory of the device (GiB)")
    _row_labels(ax, rows)
    _legends_below(ax, mx, height)
    unit, scale = _seconds_unit(record["iteration_time_s"])
    s = record.get("strategy") or {}
    shape = f"dp {s.get('dp')} x tp {s.get('tp')} x pp {s.get('pp')}" if s else ""
    more = f"; first {len(shown)} of {len(devices)} simulated devices" if len(devices) > len(shown) else ""
    fig.suptitle(f"{record['model']} on {record['cluster']} ({record.get('device', '')}), {shape}, global batch "
                 f"{record.get('global_batch')}: {record['iteration_time_s'] / scale:.4g} {unit} per iteration, "
                 f"{record.get('throughput_samples_per_s', 0):.4g} samples/s{more}", fontsize=10)
    fig.subplots_adjust(wspace=0.08, top=1 - 0.55 / height, bottom=1.3 / height)
    if not record.get("feasible", True):
        fig.text(0.01, -0.05 - 0.15 / height, "Not feasible: " + _short(record.get("infeasible_reason", ""), 200),
                 ha="left", va="top", fontsize=8, color=CAPACITY_COLOR)
    return fig


def close(fig: Any) -> None:
    _pyplot().close(fig)
