"""Strategy-comparison plots (matplotlib Agg), drawn from simulation records alone.

A *study* record is ``{"kind": "strategy-study", "title", "baseline": <simulation record of one
device>, "runs": [{"strategy": name, "devices": n, "record": <simulation record>}], "references":
[{"strategy", "devices", "speedup", "source"}]}``; speedup = throughput / the baseline's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlsim.report.comm_plots import _pyplot, _save  # the Agg backend and the atomic figure write

_PARTS = (("compute", "compute", "#4c72b0"), ("recompute", "recompute", "#8172b2"),
          ("exposed_comm", "exposed communication", "#dd8452"), ("bubble", "pipeline bubble", "#937860"),
          ("idle", "idle", "#bbbbbb"))


def speedups(study: dict[str, Any]) -> dict[str, dict[int, float]]:
    """strategy -> devices -> throughput relative to the baseline."""
    base = study["baseline"]["throughput_samples_per_s"]
    out: dict[str, dict[int, float]] = {}
    for run in study["runs"]:
        out.setdefault(run["strategy"], {})[run["devices"]] = run["record"]["throughput_samples_per_s"] / base
    return out


def plot_strategy_study(study: dict[str, Any], path: str | Path) -> None:
    """Left: speedup over devices per strategy with the ideal line and published references.
    Right: where each run's time goes (shares of the iteration)."""
    plt = _pyplot()
    sp = speedups(study)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [1, 1.35]})
    devices = sorted({run["devices"] for run in study["runs"]})
    ax.plot([1] + devices, [1] + devices, color="#999999", lw=1, ls=":", label="linear")
    markers = {}
    for name, by_n in sp.items():
        xs = sorted(by_n)
        line, = ax.plot([1] + xs, [1] + [by_n[x] for x in xs], marker="o", label=f"{name} (simulated)")
        markers[name] = line.get_color()
    last = max(devices)
    for ref in study.get("references", []):
        ax.scatter([ref["devices"]], [ref["speedup"]], marker="*", s=140, zorder=5,
                   color=markers.get(ref["strategy"], "black"), edgecolor="black", linewidth=0.5)
        right = ref["devices"] >= last
        ax.annotate(ref["source"], (ref["devices"], ref["speedup"]), textcoords="offset points",
                    xytext=(-8, -12) if right else (6, -10), ha="right" if right else "left", fontsize=7)
    ax.set_xlabel("devices")
    ax.set_ylabel("speedup over one device (throughput)")
    ax.set_title("simulated speedup (stars: published)")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    labels, bottoms = [], []
    runs = sorted(study["runs"], key=lambda r: (r["devices"], r["strategy"]))
    for i, run in enumerate(runs):
        rec = run["record"]
        t = rec["iteration_time_s"]
        left = 0.0
        for key, label, color in _PARTS:
            share = rec["breakdown_s"][key] / t if t else 0.0
            bx.barh(i, share, left=left, color=color, label=label if i == 0 else None)
            left += share
        labels.append(f"{run['strategy']} x{run['devices']}")
        bottoms.append(i)
    bx.set_yticks(bottoms, labels, fontsize=8)
    bx.invert_yaxis()
    bx.set_xlim(0, 1)
    bx.set_xlabel("share of the iteration (mean over devices)")
    bx.set_title("where the time goes")
    bx.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=len(_PARTS), frameon=False)
    fig.suptitle(study.get("title", ""), fontsize=10)
    fig.subplots_adjust(wspace=0.5)
    _save(fig, path)
    plt.close(fig)
