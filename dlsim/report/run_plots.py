"""Goodput and cost (or energy) of a run against cluster size, from run records alone."""

from __future__ import annotations

from typing import Any, Sequence

from dlsim.report.comm_plots import _pyplot


def scaling_figure(records: Sequence[dict[str, Any]]):
    """Two panels over GPUs: goodput (expected, with the Monte Carlo 5th-95th percentile band where
    the records have one) and time to train; cost (or facility energy without prices) on the
    second axis of the right panel."""
    plt = _pyplot()
    recs = sorted(records, key=lambda r: r["gpus"])
    gpus = [r["gpus"] for r in recs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax1.plot(gpus, [r["goodput"] for r in recs], "o-", color="tab:blue", label="expected")
    mcs = [r.get("monte_carlo") for r in recs]
    if all(mcs):
        ax1.fill_between(gpus, [m["goodput_p5"] for m in mcs], [m["goodput_p95"] for m in mcs], color="tab:blue",
                         alpha=0.2, label="Monte Carlo 5th-95th percentile")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("GPUs")
    ax1.set_ylabel("goodput (useful / wall time)")
    ax1.set_title(f"{recs[0]['model']} on {recs[0]['cluster']}: goodput")
    ax1.legend(loc="lower left")
    ax2.plot(gpus, [r["wall_days"] for r in recs], "s-", color="tab:green", label="time to train (days)")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("GPUs")
    ax2.set_ylabel("time to train (days)", color="tab:green")
    ax3 = ax2.twinx()
    if all(r.get("cost") for r in recs):
        ax3.plot(gpus, [r["cost"]["total_usd"] / 1e6 for r in recs], "^-", color="tab:red", label="cost (M USD)")
        ax3.set_ylabel("cost (million USD)", color="tab:red")
    elif all(r.get("energy") for r in recs):
        ax3.plot(gpus, [r["energy"]["facility_mwh"] for r in recs], "^-", color="tab:red", label="energy (MWh)")
        ax3.set_ylabel("facility energy (MWh)", color="tab:red")
    ax2.set_title(f"{format(recs[0]['tokens'], '.3g')} tokens: time, cost")
    fig.tight_layout()
    return fig
