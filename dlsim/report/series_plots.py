"""Line figures of a ``series`` record (matplotlib Agg), drawn from the record alone.

A ``series`` record holds what a study measured as labelled lines, published reference points and
reference levels, panel by panel, so that any study (the seeds' reproductions in `reports/`) is
re-plotted later by `dlsim plot`:

    {"kind": "series", "title": str,
     "panels": [{"title": str, "x_label": str, "y_label": str, "x_log": bool, "y_log": bool,
                 "lines": [{"label": str, "x": [..], "y": [..]}],       # simulated; None = no value
                 "points": [{"label": str, "x": [..], "y": [..]}],      # published numbers (markers)
                 "hlines": [{"label": str, "y": float}], "vlines": [{"label": str, "x": float}]}]}

Axis labels carry their units (the record's author writes them); every title, label and legend
entry also lands in the PNG's Description metadata (`compare_plots.save_figure`).
"""

from __future__ import annotations

from typing import Any, Mapping

from dlsim.report.comm_plots import _pyplot

MARKERS = ("*", "D", "X", "P", "^", "v", "s")
LINE_STYLES = ("--", ":", "-.")


def _pairs(line: Mapping[str, Any]) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for x, y in zip(line["x"], line["y"]):
        if x is not None and y is not None:
            xs.append(float(x)), ys.append(float(y))
    return xs, ys


def _panel(ax: Any, panel: Mapping[str, Any]) -> None:
    for line in panel.get("lines", ()):
        xs, ys = _pairs(line)
        ax.plot(xs, ys, marker="o", ms=4, lw=1.6, label=str(line["label"]))
    for i, pts in enumerate(panel.get("points", ())):
        xs, ys = _pairs(pts)
        ax.plot(xs, ys, ls="none", marker=MARKERS[i % len(MARKERS)], ms=11, mec="black", mew=0.8,
                label=str(pts["label"]))
    for i, h in enumerate(panel.get("hlines", ())):
        ax.axhline(float(h["y"]), color="grey", ls=LINE_STYLES[i % len(LINE_STYLES)], lw=1.1, label=str(h["label"]))
    for i, v in enumerate(panel.get("vlines", ())):
        ax.axvline(float(v["x"]), color="black", ls=LINE_STYLES[i % len(LINE_STYLES)], lw=1.0, alpha=0.7,
                   label=str(v["label"]))
    if panel.get("x_log"):
        ax.set_xscale("log", base=2 if panel.get("x_log") == 2 else 10)
        if panel.get("x_log") == 2:
            from matplotlib.ticker import FuncFormatter
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    if panel.get("y_log"):
        ax.set_yscale("log")
    ax.set_title(str(panel.get("title", "")), fontsize=10)
    ax.set_xlabel(str(panel["x_label"]))
    ax.set_ylabel(str(panel["y_label"]))
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc=panel.get("legend", "best"))


def series_figure(rec: Mapping[str, Any]) -> Any:
    """One figure with a panel per entry of ``rec["panels"]`` side by side (see the module docstring)."""
    plt = _pyplot()
    panels = list(rec["panels"])
    if not panels:
        raise ValueError("a series record needs at least one panel")
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.6), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        _panel(ax, panel)
    fig.suptitle(str(rec.get("title", "")), fontsize=11)
    fig.tight_layout()
    return fig
