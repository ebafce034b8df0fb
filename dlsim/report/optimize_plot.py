"""The figure of an `optimize` record (``dlsim optimize --plot``): iteration time against peak
memory per device for every evaluated candidate, the Pareto front highlighted, the simulated
candidates marked and the winner labelled. Drawn from the record alone."""

from __future__ import annotations

from typing import Any, Mapping

from dlsim.report.comm_plots import _pyplot
from dlsim.report.compare_plots import _seconds_unit

GIB = float(1 << 30)


def pareto_figure(record: Mapping[str, Any]) -> Any:
    """Time (s) against memory per device (GiB): estimated points grey, simulated ones marked, the
    Pareto front as a step line, the winner labelled, the memory limit dashed."""
    plt = _pyplot()
    pts = record.get("points") or {}
    times, mems, srcs = pts.get("iteration_time_s", []), pts.get("peak_memory_bytes", []), pts.get("source", [])
    front = record.get("pareto", [])
    best = record["best"]
    longest = max([*times, best["iteration_time_s"]] or [1.0])
    unit, scale = _seconds_unit(longest)
    fig, ax = plt.subplots(figsize=(9, 6))
    est = [(m / GIB, t / scale) for t, m, s in zip(times, mems, srcs) if s != "simulated"]
    sim = [(m / GIB, t / scale) for t, m, s in zip(times, mems, srcs) if s == "simulated"]
    if est:
        ax.scatter(*zip(*est), s=9, color="#9a9a9a", alpha=0.45, linewidths=0,
                   label=f"evaluated analytically ({len(est)})")
    if sim:
        ax.scatter(*zip(*sim), s=42, marker="D", facecolor="none", edgecolor="#4c72b0", linewidths=1.2,
                   label=f"simulated event by event ({len(sim)})", zorder=3)
    if front:
        fx = [p["peak_memory_bytes"] / GIB for p in front]
        fy = [p["iteration_time_s"] / scale for p in front]
        ax.step(fx, fy, where="post", color="#dd8452", linewidth=1.6, zorder=2)
        ax.scatter(fx, fy, s=30, color="#dd8452", zorder=4, label=f"Pareto front ({len(front)})")
    bx, by = best["peak_memory_bytes"] / GIB, best["iteration_time_s"] / scale
    ax.scatter([bx], [by], s=160, marker="*", color="#c44e52", zorder=5, label="winner (simulated)")
    ax.annotate(f"winner: {best['label']}\n{by:.4g} {unit}, {bx:.1f} GiB", (bx, by), xytext=(-20, 60),
                textcoords="offset points", fontsize=8, ha="right", arrowprops={"arrowstyle": "->", "color": "#c44e52"},
                bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "#c44e52", "alpha": 0.9})
    limit = record.get("memory_limit_bytes")
    if limit:
        ax.axvline(limit / GIB, color="#555555", linestyle="--", linewidth=0.9,
                   label=f"memory limit ({limit / GIB:.1f} GiB)")
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel(f"iteration time ({unit})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    c = record.get("candidates", {})
    ax.set_title(f"{record['model']} on {record['cluster']}: {record['gpus']:,} GPUs, global batch "
                 f"{record['global_batch']:,} ({record.get('dtype', '')})\niteration time against memory per "
                 f"device: {c.get('enumerated', 0):,} candidates enumerated, {c.get('evaluated', len(times)):,} fit and "
                 f"timed" + (f", {c['pruned_by_bound']:,} fit but ruled out by a lower bound" if c.get("pruned_by_bound")
                             else ""),
                 fontsize=10)
    return fig
