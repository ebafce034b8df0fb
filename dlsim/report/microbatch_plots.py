"""Figures of μ-cuDNN micro-batch planning, drawn from result records (dicts) only.

* `plot_sweep`: convolution time and speedup over the undivided baseline against the workspace limit,
  one line per micro-batch policy (the shape of μ-cuDNN's figures, Oyama et al. CLUSTER 2018), from a
  ``microbatch_sweep`` record.
* `plot_execution`: predicted and measured iteration time of planned and undivided execution per
  workspace limit, from the CPU proof's execution records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from dlsim.units import MIB, MS

COLORS = {"undivided": "tab:grey", "powerOfTwo": "tab:blue", "all": "tab:orange"}


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    tmp.replace(path)


def plot_sweep(record: dict[str, Any], path: str | Path, *, marker_limit: float | None = None) -> None:
    """Two panels from a ``microbatch_sweep`` record: time (left) and speedup (right) against the limit."""
    plt = _pyplot()
    limits = [v / MIB for v in record["limits_bytes"]]
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(10, 4))
    for s in record["series"]:
        pts = [(x, t) for x, t in zip(limits, s["time_s"]) if t is not None]
        if pts:
            ax_t.plot([p[0] for p in pts], [p[1] / MS for p in pts], marker="o", label=s["policy"],
                      color=COLORS.get(s["policy"]))
        if s["policy"] != "undivided":
            sp = [(x, v) for x, v in zip(limits, s["speedup"]) if v is not None]
            if sp:
                ax_s.plot([p[0] for p in sp], [p[1] for p in sp], marker="o", label=s["policy"],
                          color=COLORS.get(s["policy"]))
    for ax in (ax_t, ax_s):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workspace limit (MiB)" + (" per kernel" if record.get("mode") == "wr" else " in total"))
        ax.grid(True, alpha=0.3)
        if marker_limit:
            ax.axvline(marker_limit / MIB, color="grey", linestyle=":", linewidth=1)
    ax_t.set_ylabel("convolution time per iteration (ms)")
    ax_s.set_ylabel("speedup over undivided")
    ax_s.axhline(1.0, color="black", linewidth=0.8)
    for ax in (ax_t, ax_s):
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    title = f"{record.get('label') or 'convolutions'}: {record['mode'].upper()}, batch {record['batch']}"
    if record.get("source"):
        title += f" ({record['source']})"
    fig.suptitle(title)
    _save(fig, path)
    plt.close(fig)


def plot_execution(records: Sequence[dict[str, Any]], path: str | Path, *, title: str = "") -> None:
    """Bars per (mode, workspace limit): predicted and measured time of the undivided and the planned run.

    `records` are execution records with keys mode, policy ("undivided" or the plan's),
    workspace_limit_bytes, predicted_time_s, measured_time_s.
    """
    plt = _pyplot()
    modes = [m for m in ("wr", "wd") if any(r["mode"] == m for r in records)]
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        limits = sorted({r["workspace_limit_bytes"] for r in records if r["mode"] == mode})
        width = 0.2
        for j, (kind, field, hatch) in enumerate((("undivided", "predicted_time_s", "//"),
                                                  ("undivided", "measured_time_s", ""),
                                                  ("planned", "predicted_time_s", "//"),
                                                  ("planned", "measured_time_s", ""))):
            ys = []
            for lim in limits:
                rec = next((r for r in records if r["mode"] == mode and r["workspace_limit_bytes"] == lim
                            and (r["policy"] == "undivided") == (kind == "undivided")), None)
                ys.append(rec[field] / MS if rec else 0.0)
            xs = [i + (j - 1.5) * width for i in range(len(limits))]
            ax.bar(xs, ys, width, hatch=hatch, color="tab:grey" if kind == "undivided" else "tab:blue",
                   edgecolor="black", label=f"{kind}, {field.split('_')[0]}")
        for i, lim in enumerate(limits):
            und = next((r for r in records if r["mode"] == mode and r["workspace_limit_bytes"] == lim
                        and r["policy"] == "undivided"), None)
            pla = next((r for r in records if r["mode"] == mode and r["workspace_limit_bytes"] == lim
                        and r["policy"] != "undivided"), None)
            if und and pla:
                top = max(und["measured_time_s"], pla["measured_time_s"]) / MS
                ax.text(i, top * 1.02, f"{und['measured_time_s'] / pla['measured_time_s']:.2f}x", ha="center")
        ax.set_xticks(range(len(limits)), [f"{lim / MIB:g} MiB" for lim in limits])
        ax.set_xlabel("workspace limit" + (" per kernel (WR)" if mode == "wr" else " in total (WD)"))
        ax.set_ylabel("convolution time per iteration (ms)")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    if title:
        fig.suptitle(title)
    _save(fig, path)
    plt.close(fig)


def plot_speedup_vs_limit(sweeps: Sequence[dict[str, Any]], measured: Sequence[dict[str, Any]], path: str | Path, *,
                          title: str = "") -> None:
    """Speedup over the undivided baseline against the workspace limit (μ-cuDNN's figure shape, Oyama et al.
    CLUSTER 2018): a line per (mode, policy) predicted from ``microbatch_sweep`` records, and measured
    points (dicts with mode, limit_bytes, speedup), one marker per measurement attempt."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    styles = {"wr": ("tab:blue", "o"), "wd": ("tab:orange", "s")}
    for rec in sweeps:
        color, marker = styles.get(rec["mode"], ("tab:grey", "^"))
        limits = [v / MIB for v in rec["limits_bytes"]]
        for s in rec["series"]:
            if s["policy"] == "undivided":
                continue
            pts = [(x, v) for x, v in zip(limits, s["speedup"]) if v is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, linewidth=1.5,
                        label=f"{rec['mode'].upper()} {s['policy']}, predicted")
    for mode, (color, marker) in styles.items():
        pts = [(m["limit_bytes"] / MIB, m["speedup"]) for m in measured if m["mode"] == mode]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=color, marker=marker, edgecolor="black",
                       zorder=3, label=f"{mode.upper()}, measured")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workspace limit (MiB; WR per kernel, WD in total)")
    ax.set_ylabel("speedup over undivided at the same limit")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    _save(fig, path)
    plt.close(fig)
