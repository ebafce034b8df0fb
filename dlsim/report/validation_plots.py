"""Figures of predicted vs measured times, drawn from validation records (dicts) only."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

_COLORS = {"M": "tab:green", "I": "tab:blue", "X": "tab:orange", "R": "tab:red"}
_NAMES = {"M": "measured", "I": "interpolated", "X": "extrapolated", "R": "roofline"}


def _figure(ncols: int, width: float = 5.0) -> tuple[Any, Any]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, 4.4), squeeze=False)
    return fig, axes[0]


def _diagonal(ax: Any, values: Sequence[float], band: float = 0.2) -> None:
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    ax.fill_between([lo, hi], [lo * (1 - band), hi * (1 - band)], [lo * (1 + band), hi * (1 + band)], color="grey",
                    alpha=0.15, label=f"±{band:.0%}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured (s)")
    ax.set_ylabel("predicted (s)")


def _save(fig: Any, path: str | Path) -> None:
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt
    plt.close(fig)


def _weakest(source: str) -> str:
    for tag in "RXIM":
        if tag in source:
            return tag
    return "M"


def plot_model_validation(rec: dict, path: str | Path) -> None:
    """Per-layer predicted vs measured (log-log, coloured by provenance) and the phases side by side."""
    fig, (ax, bx) = _figure(2)
    layers = [r for r in rec["layers"] if r["measured_s"] is not None and r["measured_s"] == r["measured_s"]
              and r["measured_s"] > 0 and r["predicted_s"] > 0]
    if layers:
        _diagonal(ax, [r["measured_s"] for r in layers] + [r["predicted_s"] for r in layers])
        for tag, color in _COLORS.items():
            pts = [r for r in layers if _weakest(r["source"]) == tag]
            if pts:
                ax.scatter([r["measured_s"] for r in pts], [r["predicted_s"] for r in pts], s=12, color=color,
                           label=_NAMES[tag])
        ax.legend(fontsize=8)
    ax.set_title(f"{rec['model']} batch {rec['batch']}: per layer (fwd + bwd)" if layers else
                 f"{rec['model']} batch {rec['batch']}: layers {rec['per_layer'].get('why', 'not measured')}")
    phases = ["forward", "backward", "optimizer", "iteration"]
    x = range(len(phases))
    bx.bar([i - 0.2 for i in x], [rec["predicted"][f"{p}_s"] for p in phases], 0.4, label="predicted")
    bx.bar([i + 0.2 for i in x], [rec["measured"][f"{p}_s"] for p in phases], 0.4, label="measured")
    for i, p in enumerate(phases):
        if rec["error"][p] is None:
            continue
        bx.annotate(f"{100 * rec['error'][p]:+.1f}%", (i, max(rec["predicted"][f"{p}_s"], rec["measured"][f"{p}_s"])),
                    ha="center", va="bottom", fontsize=8)
    bx.set_xticks(list(x), phases)
    bx.set_ylabel("seconds")
    bx.set_title(f"{rec['cluster']}, {rec['threads']} threads")
    bx.legend(fontsize=8)
    _save(fig, path)


def plot_kernel_validation(rec: dict, path: str | Path) -> None:
    """Held-out GEMMs and convolutions, predicted vs measured."""
    fig, axes = _figure(2)
    for ax, kind in zip(axes, ("gemm", "conv")):
        rows = rec[kind]["rows"]
        if not rows:
            ax.set_title(f"{kind}: no held-out shapes")
            continue
        _diagonal(ax, [r["measured_s"] for r in rows] + [r["predicted_s"] for r in rows], band=0.05 if kind == "gemm"
                  else 0.2)
        for source, color in (("measured", "tab:green"), ("interpolated", "tab:blue"), ("extrapolated", "tab:orange"),
                              ("model", "tab:red")):
            pts = [r for r in rows if r["source"] == source]
            if pts:
                ax.scatter([r["measured_s"] for r in pts], [r["predicted_s"] for r in pts], s=12, color=color,
                           label=source)
        s = rec[kind]["summary"]
        ax.set_title(f"held-out {kind}: median |error| {100 * s['median_abs']:.1f}% (n={s['count']})")
        ax.legend(fontsize=8)
    _save(fig, path)


def plot_zoo_validation(records: Sequence[dict], path: str | Path) -> None:
    """Iteration time predicted vs measured for several models, with each model's error."""
    fig, (ax, bx) = _figure(2, width=6.0)
    names = [f"{r['model']}\nb{r['batch']}" for r in records]
    x = range(len(records))
    ax.bar([i - 0.2 for i in x], [r["predicted"]["iteration_s"] for r in records], 0.4, label="predicted")
    ax.bar([i + 0.2 for i in x], [r["measured"]["iteration_s"] for r in records], 0.4, label="measured")
    ax.set_yscale("log")
    ax.set_xticks(list(x), names, fontsize=7)
    ax.set_ylabel("iteration time (s)")
    ax.legend(fontsize=8)
    ax.set_title("training iteration, predicted vs measured")
    errors = [100 * (r["error"]["iteration"] or 0.0) for r in records]
    bx.bar(list(x), errors, color=["tab:green" if abs(e) <= 10 else "tab:orange" if abs(e) <= 20 else "tab:red"
                                   for e in errors])
    bx.axhline(0, color="black", lw=0.8)
    for lim in (10, -10):
        bx.axhline(lim, color="grey", lw=0.6, ls="--")
    bx.set_xticks(list(x), names, fontsize=7)
    bx.set_ylabel("error (%)")
    bx.set_title("(predicted − measured) / measured")
    _save(fig, path)
