"""The sweep summary figure (matplotlib Agg), drawn from a ``sweep_summary`` record alone.

Left: the best throughput (samples/s) found per model x cluster against the number of GPUs, one
line each; right: why points could not run, counted by reason (numbers stripped).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from dlsim.report.compare_plots import save_figure
from dlsim.report.comm_plots import _pyplot


def sweep_figure(summary: Mapping[str, Any], path: str | Path) -> None:
    """Draw `summary` (`dlsim.api.sweep.summarize`) to `path`."""
    plt = _pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    lines: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for row in summary["best"]:
        if row.get("throughput_samples_per_s") is None:
            continue
        x = row["gpus"] if row["gpus"] is not None else 0
        lines.setdefault((row["model"], row["cluster"]), []).append((x, row["throughput_samples_per_s"]))
    for (model, cluster), pts in sorted(lines.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{model} on {cluster}")
    xs = sorted({x for pts in lines.values() for x, _ in pts if x > 0})
    if xs:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("best throughput (samples/s)")
    ax.set_title(f"sweep {summary.get('name', '')}: best strategy per model x cluster x GPUs")
    ax.grid(True, which="both", alpha=0.3)
    if lines:
        ax.legend(fontsize=8, title="model on cluster")
    reasons = list(summary.get("infeasible_by_reason", {}).items())[:10]
    status = summary.get("status", {})
    if reasons:
        labels = [r[:45] + ("..." if len(r) > 45 else "") for r, _ in reasons][::-1]
        bx.barh(labels, [n for _, n in reasons][::-1], color="#dd8452")
        bx.tick_params(axis="y", labelsize=7)
    bx.set_xlabel("points (count)")
    bx.set_title(f"not run: {sum(n for k, n in status.items() if k != 'ok')} of {summary.get('points', 0)} "
                 "points, by reason", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
