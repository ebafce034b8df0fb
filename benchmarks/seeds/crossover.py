"""(e) The allreduce crossovers by message size (seeds-inventory §3.2-3.3, §11 V4).

Seed: the survey's allreduce costs (S002 L223, S001 L208-217) class tree and butterfly as the
algorithms of small vectors and pipeline (ring) and Rabenseifner's reduce-scatter + gather as those
of large ones; Dryden's lecture (S003 L5532-6076) gives the same costs with a reduction term:
butterfly T = α lg p + (β + γ) n lg p, Rabenseifner T = 2α lg p + (p−1)/p (2β + γ) n. Equal at
    n* = α lg p / ((β + γ) lg p − (p−1)/p (2β + γ)),
the seed's own crossover. Simulated: `dlsim comm allreduce --sweep 1KB:1GB -a all --model hockney`
on the seeds' SparCML machine (`piz-daint`, Aries: α, β from the profile, γ from its reduction
rate) for p = 8, 64, 512, and the size at which dlsim's cheapest algorithm changes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from common import cli_json, compared, dlsim_cli, header, save_series, table, write_report

NAME = "crossover"
CLUSTER = "piz-daint"
RANKS = (8, 64, 512)
TINY_RANKS = (64,)
PLOT_RANKS = 64


def closed_form(alpha: float, beta: float, gamma: float, p: int) -> float:
    """Bytes at which butterfly (recursive doubling) and Rabenseifner cost the same (module docstring)."""
    lg, f = math.log2(p), (p - 1) / p
    return alpha * lg / ((beta + gamma) * lg - f * (2 * beta + gamma))


def run(out: Path, tiny: bool = False) -> dict[str, Any]:
    rows = []
    for p in (TINY_RANKS if tiny else RANKS):
        args = ["comm", "allreduce", "--sweep", "1KB:1GB", "--ranks", str(p), "-c", CLUSTER, "-a", "all",
                "--model", "hockney"]
        if p == PLOT_RANKS:
            args += ["--plot", str(out / f"{NAME}-sweep-p{p}.png"), "--force"]
        rec = cli_json(out / f"{NAME}-p{p}.json", *args)
        net = rec["network"]
        seed = closed_form(net["alpha_s"], net["beta_s_per_byte"], net["gamma_s_per_byte"], p)
        sim = next((c["size_bytes"] for c in rec["crossovers"]
                    if (c["from"], c["to"]) == ("recursive-doubling", "rabenseifner")), None)
        small, large = rec["best"][0], rec["best"][-1]
        rows.append({"ranks": p, "closed_form_bytes": seed, "dlsim_bytes": sim, "best_smallest": small,
                     "best_largest": large, "crossovers": rec["crossovers"], "alpha_s": net["alpha_s"],
                     "beta_s_per_byte": net["beta_s_per_byte"], "gamma_s_per_byte": net["gamma_s_per_byte"]})
    rec = {"kind": "series", "title": f"Allreduce crossover butterfly -> Rabenseifner on {CLUSTER} (Hockney α-β-γ)",
           "panels": [{"title": "message size at which Rabenseifner overtakes recursive doubling",
                       "x_label": "ranks p", "y_label": "crossover message size (bytes)", "x_log": 2, "y_log": True,
                       "lines": [{"label": "dlsim comm --sweep (best algorithm changes)",
                                  "x": [r["ranks"] for r in rows], "y": [r["dlsim_bytes"] for r in rows]}],
                       "points": [{"label": "seed closed form n* (S002 L223, S003 L5532-6076)",
                                   "x": [r["ranks"] for r in rows], "y": [r["closed_form_bytes"] for r in rows]}]}]}
    png = save_series(rec, out, NAME)
    if not tiny:
        _report(out, rows, png)
    return {"rows": rows, "png": str(png)}


def _report(out: Path, rows: list[dict[str, Any]], png: Path) -> None:
    r0 = rows[0]
    lines = header("Allreduce crossovers by message size", NAME,
                   "Seed (S002 L223, S001 L208-217; S003 L5532-6076; seeds-inventory §3.2-3.3): tree and butterfly "
                   "are the allreduce algorithms of small vectors, pipeline (ring) and Rabenseifner's "
                   "reduce-scatter + gather those of large vectors; \"the best algorithm depends on the system, the "
                   "number of processes, and the message size\". The seed gives the costs, so its crossover is the "
                   "closed form n* = α lg p / ((β + γ) lg p − (p−1)/p (2β + γ)) where butterfly and Rabenseifner "
                   "cost the same.")
    lines += [f"Simulated: `dlsim comm allreduce --sweep 1KB:1GB --ranks P -c {CLUSTER} -a all --model hockney` "
              f"(α = {r0['alpha_s'] * 1e6:.1f} µs per message, β = 1/{1e-9 / r0['beta_s_per_byte']:.1f} GB/s, "
              f"γ = 1/{1e-9 / r0['gamma_s_per_byte']:.0f} GB/s reduction, all from the profile: Aries latency and "
              "overhead, its link rate, the P100's memory bandwidth for the sum). The crossover dlsim prints is "
              "where its cheapest algorithm changes (interpolated between sweep points).", "",
              *table(("ranks p", "seed closed form n*", "dlsim crossover", "difference", "best at 1 KB",
                      "best at 1 GB"),
                     [(r["ranks"], f"{r['closed_form_bytes'] / 1024:.1f} KiB",
                       f"{r['dlsim_bytes'] / 1024:.1f} KiB" if r["dlsim_bytes"] else "none",
                       f"{100 * (r['dlsim_bytes'] / r['closed_form_bytes'] - 1):+.2f}%" if r["dlsim_bytes"] else "-",
                       r["best_smallest"], r["best_largest"]) for r in rows]), "",
              f"![crossover against ranks]({png.name})", "",
              f"All algorithms at p = {PLOT_RANKS}, drawn by `dlsim comm --plot`: "
              f"[{NAME}-sweep-p{PLOT_RANKS}.png]({NAME}-sweep-p{PLOT_RANKS}.png).", "",
              "## Agreement and disagreement", "",
              "* The small-vector / large-vector split is the seed's: recursive doubling (butterfly) is cheapest "
              "below n*, Rabenseifner above; the crossover dlsim finds is the seed's closed form to within the "
              "interpolation between sweep points.",
              "* Ring (the seed's pipeline) never becomes the cheapest here: with the seed's costs it moves the "
              "same bytes as Rabenseifner but pays 2(p−1) latencies instead of 2 lg p, so in the α-β-γ model it "
              "only ties Rabenseifner for huge messages. Ring wins in practice on GPUs (NCCL) because its "
              "neighbour-only traffic avoids the contention and non-power-of-two cases the model leaves out; "
              "dlsim's `-a ring` prices it for such profiles, and its LogGP and measured-table modes can move "
              "these crossovers (see reports/comm-validation.md)."]
    write_report(out, NAME, lines)


TITLE = "(e) allreduce crossovers by message size"


def headline(res: dict[str, Any]) -> tuple[str, str]:
    r = next(x for x in res["rows"] if x["ranks"] == PLOT_RANKS)
    return (f"butterfly below, Rabenseifner above n* = {r['closed_form_bytes'] / 1024:.1f} KiB (closed form, p = 64)",
            f"{r['dlsim_bytes'] / 1024:.1f} KiB (dlsim comm --sweep, piz-daint, p = 64)")


def numbers(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The closed-form crossover beside dlsim's sweep (`common.compared`)."""
    r = next(x for x in res["rows"] if x["ranks"] == PLOT_RANKS)
    return [compared("butterfly / Rabenseifner crossover, p = 64 (KiB)", r["closed_form_bytes"] / 1024,
                     r["dlsim_bytes"] / 1024)]
