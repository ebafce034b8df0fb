"""Plots of communication records (matplotlib Agg), drawn from the records alone.

`plot_sweep` draws a `comm-sweep` record (time and bus bandwidth over sizes, one line per
algorithm, the lower bound, the crossovers); `plot_validation` draws a `comm-validation` record
(measured against predicted time per algorithm, and the relative error).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig: Any, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix or ".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=130, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def plot_sweep(rec: dict[str, Any], path: str | Path) -> None:
    """Time (log-log) and busbw over message size for each algorithm of a `comm-sweep` record."""
    plt = _pyplot()
    sizes = rec["sizes_bytes"]
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in rec["algorithms"]:
        ax_t.plot(sizes, rec["times_s"][name], marker=".", label=name)
        ax_b.plot(sizes, [b / 1e9 for b in rec["busbw_bytes_per_s"][name]], marker=".", label=name)
    ax_t.plot(sizes, rec["lower_bound_s"], "k--", linewidth=1, label="lower bound")
    for c in rec["crossovers"]:
        for ax in (ax_t, ax_b):
            ax.axvline(c["size_bytes"], color="grey", linewidth=0.6, linestyle=":")
    ax_t.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="time (s)")
    ax_b.set(xscale="log", xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)")
    net = rec["network"]
    fig.suptitle(f"{rec['collective']}, {rec['ranks']} ranks, {net['source']} ({net['model']})")
    ax_t.legend(fontsize=7)
    ax_t.grid(True, which="both", alpha=0.3)
    ax_b.grid(True, which="both", alpha=0.3)
    _save(fig, path)
    plt.close(fig)


def plot_validation(rec: dict[str, Any], path: str | Path) -> None:
    """Measured (points) and predicted (lines) time per algorithm, and the relative error."""
    plt = _pyplot()
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (name, rows) in enumerate(sorted(rec["algorithms"].items())):
        color = f"C{i}"
        sizes = [r["size_bytes"] for r in rows]
        ax_t.plot(sizes, [r["measured_s"] for r in rows], "o", color=color, markersize=4, label=f"{name} measured")
        ax_t.plot(sizes, [r["predicted_s"] for r in rows], "-", color=color, linewidth=1, label=f"{name} predicted")
        ax_e.plot(sizes, [100 * r["relative_error"] for r in rows], "o-", color=color, markersize=3, label=name)
    ax_t.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="allreduce time (s)")
    ax_e.set(xscale="log", xlabel="message size (bytes)", ylabel="(predicted - measured) / measured (%)")
    ax_e.axhline(0, color="k", linewidth=0.6)
    for limit in (-10, 10):
        ax_e.axhline(limit, color="grey", linewidth=0.6, linestyle=":")
    ax_t.legend(fontsize=6, ncol=2)
    ax_e.legend(fontsize=7)
    ax_t.grid(True, which="both", alpha=0.3)
    ax_e.grid(True, which="both", alpha=0.3)
    fig.suptitle(rec.get("title", "measured vs predicted"))
    _save(fig, path)
    plt.close(fig)
