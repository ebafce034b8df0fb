"""Allreduce on an emulated 4-host cluster: real Open MPI (each algorithm forced) and gloo vs dlsim.

    flock -x /tmp/dlsim-measure.lock python benchmarks/comm_validate.py [--rate 200mbit] [--skip-measure]

1. `dlsim calibrate comm` (its API) on an EmulatedCluster (prefix dlsimc, root needed): ping-pong,
   PRTT, reduction speed, allreduce over sizes with ring, recursive doubling, Rabenseifner and
   binomial tree forced through Open MPI coll/tuned; profile into hardware_profiles/emulated-4host/.
   Then gloo's allreduce on a fresh emulated cluster of the same kind.
2. `validate_comm`: predictions from the fitted profile alone, errors, order, crossovers.
3. reports/comm-validation.{md,json,csv,png}. Prints the record's summary as JSON.

Resumable: measured points already in the tables are skipped.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import sys
from pathlib import Path

from dlsim.api.calibrate_comm import calibrate_comm, refit_burst
from dlsim.api.validate_comm import validate_comm
from dlsim.calibrate.comm_measure import COLLECTIVE_TABLE, REPS_FILE, row_idle_gap
from dlsim.calibrate.comm_plan import powers_of_two
from dlsim.cost.collectives import collective_time
from dlsim.errors import DlsimError
from dlsim.io.files import write_atomic
from dlsim.io.profile_yaml import load_profile
from dlsim.report.comm_plots import plot_validation
from dlsim.units import parse_time

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = "reports/archive/comm-validation"  # the experiment's probes and earlier runs (its README)
PROBE = f"{ARCHIVE}/comm-burst-probe/probe-1500mtu.jsonl"
PREVIOUS = f"{ARCHIVE}/comm-validation-burst16kb.json"
NOTES = "comm-validation-notes.md"  # hand-written reading of the current run, appended if present


def fmt_ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def markdown(rec: dict, gloo: list[dict], args: argparse.Namespace, command: str) -> str:
    lines = [f"# Allreduce on an emulated 4-host cluster: measured vs predicted", "",
             f"Reproduce (root, ~{args.minutes} min): `{command}`", "",
             "## Setup", "",
             f"* Machine: {platform.node()}, {platform.processor() or platform.machine()}, 2 cores shared by 4 ranks; "
             f"Linux {platform.release()}; Open MPI 4.1 (mpi4py), torch gloo.",
             f"* Emulated cluster: 4 network namespaces on a Linux bridge, each host's veth limited to {args.rate} "
             f"both ways by tc tbf (burst {args.burst}, queue {args.queue}), TCP congestion control {args.tcp}; "
             "Open MPI over TCP only (btl tcp,self), one rank per host.",
             f"* Parameters: fitted by `dlsim calibrate comm` on that cluster ({_rel(args.out)}/"
             "profile.yaml, meta.yaml): "
             f"L = {rec['link']['latency_s'] * 1e6:.2f} us, o = {rec['link']['overhead_s'] * 1e6:.2f} us, "
             f"g = {rec['link']['gap_s'] * 1e6:.2f} us, bandwidth = {rec['link']['bandwidth_bytes_per_s'] / 1e6:.3f} MB/s, "
             f"gamma = {rec['gamma_s_per_byte'] * 1e12:.1f} ps/B; model {rec['model']} (LogGP when o or g > 0).",
             ] + bucket_lines(rec) + remeasured_lines(rec, args) + gap_lines([args.out, *args.remeasured]) + [""] + burst_section(args) + ["", "## Open MPI algorithm labels", "",
             "| dlsim algorithm | Open MPI 4.1 coll/tuned setting (with coll_tuned_use_dynamic_rules=1) |", "|---|---|"]
    for name, settings in rec["openmpi_settings"].items():
        lines.append(f"| {name} | " + ", ".join(f"{k}={v}" for k, v in settings.items()) + " |")
    lines += ["", "Open MPI's algorithm 2 is a binomial reduce then a binomial broadcast whose nodes post the sends to "
              "all their children at once (`ompi_coll_base_bcast_intra_generic` over `ompi_coll_base_topo_build_bmtree`), "
              "so the children share the sender's link: dlsim models it as `binomial-tree-openmpi` (broadcast 3 message "
              "times at 4 ranks, k(k+1)/2 at 2^k ranks; MPICH's `binomial-tree` needs 2, resp. k). No factor is tuned.",
              "", "## Error table (allreduce, 4 ranks; error = (predicted − measured) / measured)", "",
              "Predicted with each message priced by the fitted link (fit: the α-β/LogGP line of the profile) and, "
              "for comparison, by the measured ping-pong curve (table: `dlsim.cost.p2p.table_model`).", "",
              "Measured: median over the repetitions (reps), min, and the interval the order check uses "
              "(IQR where the run kept every repetition, else min-max); run: which profile directory holds the row.", "",
              "| algorithm | size (B) | reps | min (ms) | measured median (ms) | interval (ms) | predicted fit (ms) "
              "| error fit | predicted table (ms) | error table | run |",
              "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for name, rows in rec["algorithms"].items():
        for r in rows:
            lines.append(f"| {name} | {r['size_bytes']} | {r['reps']} | {fmt_ms(r['min_s'])} | {fmt_ms(r['measured_s'])} | "
                         f"{r['interval']} {fmt_ms(r['lo_s'])}-{fmt_ms(r['hi_s'])} | {fmt_ms(r['predicted_fit_s'])} | "
                         f"{100 * r['relative_error_fit']:+.1f}% | {fmt_ms(r['predicted_table_s'])} | "
                         f"{100 * r['relative_error_table']:+.1f}% | {_rel(r['measured_in'])} |")
    lines += ["", f"## Median |error| over sizes >= {rec['min_bytes_for_median'] / 2 ** 20:.0f} MiB", "",
              "| algorithm | fit | table | target (fit) |", "|---|---:|---:|---|"]
    for name, med in rec["median_abs_relative_error_fit"].items():
        tab = rec["median_abs_relative_error_table"][name]
        lines.append(f"| {name} | {100 * med:.1f}% | {100 * tab:.1f}% | {'met' if med <= 0.10 else 'MISSED'} (<= 10%) |")
    lines += ["", "## Order of the algorithms per size (fastest first)", "",
              "Three readings: *strict* (the predicted order equals the order of the measured medians); *2% ties* "
              f"(pairs within {100 * rec['tie_tolerance']:.0f}% of each other, measured or predicted, count as ties); "
              "*resolved* (the rule of this report: the data orders two algorithms only where their measured "
              "intervals (IQR of the repetitions, min-max where only those were kept) do not overlap; a pair whose "
              "intervals overlap is a tie and any predicted order of it agrees).", "",
              "| size (B) | measured (medians) | predicted | strict | 2% ties | resolved |", "|---:|---|---|---|---|---|"]
    for o in rec["order"]:
        swapped = "; ".join(" / ".join(p) for p in o["swapped"])
        conflicts = "; ".join(" / ".join(p) for p in o["resolved_conflicts"])
        lines.append(f"| {o['size_bytes']} | {' < '.join(o['measured'])} | {' < '.join(o['predicted'])} | "
                     f"{'yes' if o['same'] else 'no'} | {'yes' if o['same_up_to_ties'] else 'no: ' + swapped} | "
                     f"{'yes' if o['same_where_resolved'] else 'no: ' + conflicts} |")
    lines += ["", "## Crossover sizes", "",
              "Measured: log(a/b) interpolated linearly in log size between neighbouring measured sizes; a crossing "
              "where the two differ by less than the tie tolerance at both neighbours is marked (tie). Predicted: "
              f"bisection in log size on the {rec['p2p']} closed forms between 1 B and the largest size.", "",
              "| pair | measured crossings of the medians (B) | count | predicted (B) | predicted / first measured "
              "| within x2 |", "|---|---|---:|---|---:|---|"]
    for c in rec["crossovers"]:
        ratio = c["predicted_over_first_measured"]
        meas = ", ".join(f"{x:.0f}" + (" (tie)" if t else "") for x, t in zip(c["measured_bytes"], c["measured_ties"]))
        ok = "-" if ratio is None else ("yes" if c["first_within_factor_2"] else "NO")
        if ratio is None and not c["measured_bytes"] and not c["predicted_bytes"]:
            ok = "yes (neither crosses)"
        lines.append(f"| {' / '.join(c['pair'])} | {meas or 'none'} | {len(c['measured_bytes'])} | "
                     f"{', '.join(f'{x:.0f}' for x in c['predicted_bytes']) or 'none'} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}'} | {ok} |")
    lines += small_message_notes(rec)
    if gloo:
        lines += ["", "## gloo (torch.distributed) allreduce, compared with dlsim's ring", "",
                  "| size (B) | measured (ms) | ring predicted (ms) | error |", "|---:|---:|---:|---:|"]
        for g in gloo:
            lines.append(f"| {g['size_bytes']} | {fmt_ms(g['measured_s'])} | {fmt_ms(g['predicted_s'])} | "
                         f"{100 * g['relative_error']:+.1f}% |")
    notes = Path(args.reports) / (NOTES if args.name == "comm-validation" else f"{args.name}-notes.md")
    if notes.exists():
        lines += ["", notes.read_text().strip()]
    if args.baseline:
        lines += baseline_section(rec, Path(args.baseline))
    lines += previous_section(ROOT / PREVIOUS)
    lines += ["", f"![measured vs predicted]({args.name}.png)", ""]
    return "\n".join(lines)


def bucket_lines(rec: dict) -> list[str]:
    """The token bucket of the link tier, if the profile has one."""
    link = rec["link"]
    if not link.get("burst_bytes"):
        return ["* Token bucket: none in the profile (every byte priced at the line rate)."]
    peak = link["peak_bandwidth_bytes_per_s"]
    return [f"* Token bucket (`burst_bytes` of the link tier): b = {link['burst_bytes']:.0f} B, peak "
            + ("none" if peak == float("inf") else f"{peak / 1e6:.0f} MB/s")
            + ", fitted by `dlsim.calibrate.comm_fit.fit_burst` to the same ping-pong rows (knee of the one-way "
            "time; meta.yaml fits.burst lists the sizes used); the collectives carry each port's tokens from step "
            "to step (`dlsim.cost.collectives.bucket`)."]


def remeasured_lines(rec: dict, args: argparse.Namespace) -> list[str]:
    if not rec.get("remeasured"):
        return []
    return [f"* Points re-measured with more repetitions replace the profile's at the same (algorithm, size): "
            + ", ".join(f"{_rel(x)}/comm_collectives.csv (+ every repetition in comm_collectives_reps.jsonl)"
                        for x in rec["remeasured"])
            + "; the predictions use the profile above only."]


def gap_lines(folders: list[str]) -> list[str]:
    """How the collective repetitions of each measured directory were spaced (`CommPlan.idle_gap_s`)."""
    out = []
    for folder in folders:
        path = Path(folder) / COLLECTIVE_TABLE
        if not path.exists():
            continue
        with open(path) as handle:
            gaps = sorted({row_idle_gap(r) for r in csv.DictReader(handle) if r["backend"] == "mpi"})
        reps = Path(folder) / REPS_FILE
        waits = sorted({json.loads(x).get("idle_wait", "sleep") for x in reps.read_text().splitlines() if x.strip()}
                       if reps.exists() else {"sleep"})
        text = ", ".join("back to back (barrier, allreduce, two gathers, next repetition)" if g == 0 else
                         f"every rank idle {g * 1e3:g} ms ({'/'.join(waits)}), then barrier, then the allreduce"
                         for g in gaps)
        out.append(f"* Repetitions in {_rel(folder)}: {text or 'none'} (column idle_gap_s of comm_collectives.csv; "
                   "absent = back to back).")
    return out


def baseline_section(rec: dict, path: Path) -> list[str]:
    """This run against another validation record (`--baseline`, e.g. the back-to-back run): the
    medians, errors, order counts and crossovers of both, for the sizes both measured."""
    base = json.loads(path.read_text())
    out = ["", f"## Against {_rel(str(path))}", "",
           f"Baseline: profile {_rel(base['profile'])}"
           + (" + re-measured " + ", ".join(_rel(x) for x in base.get("remeasured", [])) if base.get("remeasured") else "")
           + f"; this run: profile {_rel(rec['profile'])}"
           + (" + re-measured " + ", ".join(_rel(x) for x in rec.get("remeasured", [])) if rec.get("remeasured") else "")
           + ". Error = (predicted fit − measured median) / measured median, each run with its own profile's "
           "prediction (identical when both use the same profile).", "",
           "| algorithm | size (B) | measured before (ms) | measured now (ms) | now / before | predicted before (ms) "
           "| predicted now (ms) | error before | error now |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, rows in rec["algorithms"].items():
        old = {r["size_bytes"]: r for r in base["algorithms"].get(name, [])}
        for r in rows:
            b = old.get(r["size_bytes"])
            if b is None:
                continue
            out.append(f"| {name} | {r['size_bytes']} | {fmt_ms(b['measured_s'])} | {fmt_ms(r['measured_s'])} | "
                       f"{r['measured_s'] / b['measured_s']:.2f} | {fmt_ms(b['predicted_fit_s'])} | "
                       f"{fmt_ms(r['predicted_fit_s'])} | {100 * b['relative_error_fit']:+.1f}% | "
                       f"{100 * r['relative_error_fit']:+.1f}% |")

    def counts(r: dict) -> str:
        n = len(r["order"])
        return (f"strict {sum(o['same'] for o in r['order'])}/{n}, 2% ties {sum(o['same_up_to_ties'] for o in r['order'])}/{n}, "
                f"resolved {sum(o['same_where_resolved'] for o in r['order'])}/{n}"
                + (" (misses at " + ", ".join(str(o["size_bytes"]) for o in r["order"] if not o["same_where_resolved"])
                   + " B)" if not all(o["same_where_resolved"] for o in r["order"]) else ""))
    out += ["", f"* Order, before: {counts(base)}.", f"* Order, now: {counts(rec)}.", "",
            "| pair | measured before (B) | predicted before (B) | measured now (B) | predicted now (B) | "
            "first within x2 before | now |", "|---|---|---|---|---|---|---|"]
    old = {tuple(c["pair"]): c for c in base["crossovers"]}

    def cells(c: dict | None) -> list[str]:
        if c is None:
            return ["-", "-", "-"]
        meas = ", ".join(f"{x:.0f}" + (" (tie)" if t else "") for x, t in zip(c["measured_bytes"], c["measured_ties"]))
        ok = c["first_within_factor_2"]
        verdict = ("yes (neither crosses)" if not c["measured_bytes"] and not c["predicted_bytes"] else "NO") \
            if ok is None else ("yes" if ok else "NO")
        return [meas or "none", ", ".join(f"{x:.0f}" for x in c["predicted_bytes"]) or "none", verdict]
    for c in rec["crossovers"]:
        b, n = cells(old.get(tuple(c["pair"]))), cells(c)
        out.append(f"| {' / '.join(c['pair'])} | {b[0]} | {b[1]} | {n[0]} | {n[1]} | {b[2]} | {n[2]} |")
    return out


def _rel(path: str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def burst_section(args: argparse.Namespace) -> list[str]:
    """Why this tbf burst: the 2-host probe of reports/archive/comm-validation/comm_burst_probe.py, if its record is there."""
    path = ROOT / PROBE
    if not path.exists():
        return []
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    sizes = list(recs[0]["one_way_over_line"]) if recs else []
    out = ["## Why this burst", "",
           "A real NIC serialises every byte at line rate; a tbf lets up to `burst` bytes through at memory speed "
           "after an idle spell (tokens accrue at the rate up to the burst; a packet leaves when its tokens are "
           "there, Linux `sch_tbf.c`), which a per-message α-β model cannot describe. The burst must hold one "
           "packet (MTU 1500 + 14 B header) and, for the full rate, cover the timer slack; with high-resolution "
           "timers (this kernel: CONFIG_HIGH_RES_TIMERS=y, HZ=250) a few KB suffice. Probe (`python "
           f"reports/archive/comm-validation/comm_burst_probe.py`, 2 hosts at {recs[0]['rate'] if recs else args.rate}, reno, each row a "
           "fresh cluster; record in " + PROBE + "): TCP stream rate (3 runs of 20 MB; the full rate "
           "for the payload is 1448/1514 = 0.956 of the line rate) and the one-way time of a message sent after "
           "20 ms idle (RTT − 1-byte RTT, median of 15) as a multiple of size / line rate (1.0 = a real link; "
           "≪ 1 = the message passed in the bucket):", "",
           "| burst | stream (MB/s) | stream / line rate | " + " | ".join(f"one-way {s} B / (S/rate)" for s in sizes)
           + " | tbf drops |", "|---|---|---:|" + "---:|" * len(sizes) + "---:|"]
    for r in recs:
        drops = sum(c.get("dropped", 0) for c in r["qdisc"].values())
        out.append(f"| {r['burst']} | {', '.join(f'{x / 1e6:.2f}' for x in r['stream_bytes_per_s'])} | "
                   f"{r['stream_median_over_rate']:.3f} | "
                   + " | ".join(f"{r['one_way_over_line'][s]:.2f}" for s in sizes) + f" | {drops} |")
    out += ["", f"Chosen: burst {args.burst}, the smallest burst that keeps the full stream rate (2kb, a single "
            "packet, loses 1-3% of it: 0.925-0.946) with no drops; a 2 KiB message still passes in the bucket, "
            "but from 8 KiB on messages take most of their line time, against 0.05-0.2 with the 16 KB burst."]
    return out


def previous_section(path: Path) -> list[str]:
    """The results with a 16 KB burst (kept in reports/archive/comm-validation/comm-validation-burst16kb.*), summarised."""
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    out = ["", "## With a 16 KB burst (before)", "",
           f"The same validation with tbf burst 16kb (profile hardware_profiles/emulated-4host; full tables in "
           f"{path.with_suffix('.md').relative_to(ROOT)}). Median |error| over sizes >= 1 MiB: "
           + ", ".join(f"{n} {100 * v:.1f}%" for n, v in old["median_abs_relative_error_fit"].items())
           + f". Order: differed beyond ties at "
           + ", ".join(str(o["size_bytes"]) for o in old["order"] if not o["same_up_to_ties"]) + " B. Crossovers:", "",
           "| pair | measured (B) | predicted (B) |", "|---|---|---|"]
    for c in old["crossovers"]:
        meas = ", ".join(f"{x:.0f}" + (" (tie)" if t else "") for x, t in zip(c["measured_bytes"], c["measured_ties"]))
        out.append(f"| {' / '.join(c['pair'])} | {meas or 'none'} | {', '.join(f'{x:.0f}' for x in c['predicted_bytes']) or 'none'} |")
    return out


def small_message_notes(rec: dict) -> list[str]:
    """The acceptance line on order and crossovers, checked from the numbers in `rec`."""
    total = len(rec["order"])
    strict = [o["size_bytes"] for o in rec["order"] if not o["same"]]
    ties = [o["size_bytes"] for o in rec["order"] if not o["same_up_to_ties"]]
    resolved = [o["size_bytes"] for o in rec["order"] if not o["same_where_resolved"]]
    out = ["", "## Order and crossovers: acceptance check", "",
           f"* Order, strict: agrees at {total - len(strict)} of {total} sizes"
           + (f" (differs at {', '.join(map(str, strict))} B)." if strict else "."),
           f"* Order, 2% ties: agrees at {total - len(ties)} of {total} sizes"
           + (f" (differs at {', '.join(map(str, ties))} B)." if ties else "."),
           f"* Order, resolved by the data (intervals): agrees at {total - len(resolved)} of {total} sizes"
           + (f" (differs at {', '.join(map(str, resolved))} B)." if resolved else ".")]
    for c in rec["crossovers"]:
        real = [x for x, t in zip(c["measured_bytes"], c["measured_ties"]) if not t]
        pair = " / ".join(c["pair"])
        first = c["predicted_over_first_measured"]
        if first is not None:
            more = len(c["measured_bytes"]) - 1
            out.append(f"* {pair}: first measured crossing {c['measured_bytes'][0]:.0f} B, predicted "
                       f"{c['predicted_bytes'][0]:.0f} B, ratio {first:.2f}: "
                       f"{'within' if c['first_within_factor_2'] else 'NOT within'} x2"
                       + (f"; the measured medians cross {more} more time(s) "
                          f"({', '.join(f'{x:.0f}' for x in c['measured_bytes'][1:])} B)" if more else "")
                       + (f"; predicted crossings: {len(c['predicted_bytes'])}" if len(c["predicted_bytes"]) > 1 else "")
                       + ".")
            continue
        if c["within_factor_2"] is not None:
            out.append(f"* {pair}: measured {real[0]:.0f} B, predicted {c['predicted_bytes'][0]:.0f} B, ratio "
                       f"{c['predicted_over_measured']:.2f}: {'within' if c['within_factor_2'] else 'NOT within'} x2.")
        elif not real and not c["predicted_bytes"]:
            out.append(f"* {pair}: no crossover measured (beyond ties) or predicted: agree.")
        elif not real:
            out.append(f"* {pair}: measured only ties ({len(c['measured_bytes'])} crossing(s) within the tie "
                       f"tolerance), predicted {', '.join(f'{x:.0f}' for x in c['predicted_bytes']) or 'none'} B.")
        else:
            out.append(f"* {pair}: measured {', '.join(f'{x:.0f}' for x in real)} B, predicted "
                       f"{', '.join(f'{x:.0f} B' for x in c['predicted_bytes']) or 'none'}: disagree.")
    return out


def gloo_rows(profile: Path, rec: dict) -> list[dict]:
    cluster = load_profile(profile)
    link = cluster.inter or cluster.intra
    gamma = rec["gamma_s_per_byte"]
    out = []
    with open(profile / COLLECTIVE_TABLE) as handle:
        for r in csv.DictReader(handle):
            if r["backend"] == "gloo" and r["collective"] == "allreduce" and r["ranks"] == "4":
                size, med = int(r["size_bytes"]), float(r["median_s"])
                pred = collective_time("allreduce", "ring", size, 4, link, gamma=gamma).seconds
                out.append({"size_bytes": size, "measured_s": med, "predicted_s": pred, "relative_error": (pred - med) / med})
    return sorted(out, key=lambda g: g["size_bytes"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="200mbit")
    ap.add_argument("--burst", default="16kb")
    ap.add_argument("--queue", default="400ms")
    ap.add_argument("--tcp", default="reno")
    ap.add_argument("--out", default=str(ROOT / "hardware_profiles" / "emulated-4host"))
    ap.add_argument("--reports", default=str(ROOT / "reports"))
    ap.add_argument("--min-size", default=4096, type=int)
    ap.add_argument("--max-size", default=8 << 20, type=int)
    ap.add_argument("--fine-below", default=64 << 10, type=int,
                    help="also measure 1.5 x 2^k sizes below this (crossover resolution)")
    ap.add_argument("--skip-measure", action="store_true")
    ap.add_argument("--remeasured", action="append", default=[],
                    help="profile directory of a re-measurement (same method) whose points replace --out's")
    ap.add_argument("--refit-burst", action="store_true",
                    help="fit the token bucket to --out's ping-pong rows and add it to its profile if absent")
    ap.add_argument("--no-gloo", action="store_true")
    ap.add_argument("--reps", default=9, type=int, help="most repetitions per measured point (default 9)")
    ap.add_argument("--name", default="comm-validation", help="stem of the report files in --reports")
    ap.add_argument("--idle-gap", default="0", help="every rank sleeps this long (e.g. 1ms) before each allreduce "
                    "repetition (links idle, token buckets full); 0: back to back (CommPlan.idle_gap_s)")
    ap.add_argument("--idle-wait", default="sleep", choices=("sleep", "spin", "sleep-barrier"),
                    help="how ranks wait out --idle-gap: sleep, or spin (CPUs busy, only the links idle)")
    ap.add_argument("--baseline", default=None, help="a validation record (reports/NAME.json) to compare with")
    ap.add_argument("--minutes", default=4, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    try:
        gap = parse_time(args.idle_gap)
    except DlsimError as exc:
        ap.error(f"--idle-gap: {exc}")
    out = Path(args.out)
    sizes = tuple(sorted(set(powers_of_two(args.min_size, args.max_size)) |
                         {3 * s // 2 for s in powers_of_two(args.min_size, args.max_size) if 3 * s // 2 < args.fine_below}))
    emu = dict(emulated=4, rate=args.rate, burst=args.burst, queue=args.queue, tcp_congestion=args.tcp)
    if not args.skip_measure:
        calibrate_comm(out, backend="mpi", ranks=4, sizes=sizes, collectives=("allreduce",), budget_s=max(1.0, 0.03 * args.reps),
                       max_reps=args.reps, command="python " + " ".join(sys.argv), idle_gap_s=gap, idle_wait=args.idle_wait, **emu)
        if not args.no_gloo:
            calibrate_comm(out, backend="gloo", ranks=4, sizes=sizes, collectives=("allreduce",), budget_s=1.0,
                           max_reps=9, command="python " + " ".join(sys.argv), idle_gap_s=gap, idle_wait=args.idle_wait, **emu)
    if args.refit_burst:
        print(json.dumps(refit_burst(out, "mpi"), default=str), file=sys.stderr)
    rec = validate_comm(out, backend="mpi", ranks=4, p2p="fit", remeasured=args.remeasured,
                        title=f"allreduce, 4 emulated hosts at {args.rate}: Open MPI (forced) vs dlsim")
    gloo = gloo_rows(out, rec)
    rec["gloo_vs_ring"] = gloo
    rec["setup"] = {"rate": args.rate, "burst": args.burst, "queue": args.queue, "tcp_congestion": args.tcp,
                    "sizes_bytes": list(sizes), "machine": platform.node(), "kernel": platform.release(),
                    "idle_gap_s": gap, "idle_wait": args.idle_wait}
    reports = Path(args.reports)
    reports.mkdir(parents=True, exist_ok=True)
    write_atomic(reports / f"{args.name}.json", json.dumps(rec, indent=1, default=str))
    rows = [{"algorithm": n, **r} for n, rs in rec["algorithms"].items() for r in rs] + \
        [{"algorithm": "gloo(default) vs ring", **g} for g in gloo]
    keys = ["algorithm", "size_bytes", "measured_s", "predicted_s", "relative_error", "predicted_fit_s",
            "predicted_table_s", "relative_error_fit", "relative_error_table", "min_s", "max_s"]
    text = ",".join(keys) + "\n" + "".join(",".join(str(r.get(k, "")) for k in keys) + "\n" for r in rows)
    write_atomic(reports / f"{args.name}.csv", text)
    plot_validation(rec, reports / f"{args.name}.png")
    command = "flock -x /tmp/dlsim-measure.lock python benchmarks/comm_validate.py " + " ".join(
        f"--{k} {v}" for k, v in (("rate", args.rate), ("burst", args.burst), ("queue", args.queue), ("tcp", args.tcp),
                                  ("min-size", args.min_size), ("max-size", args.max_size), ("reps", args.reps),
                                  ("out", _rel(args.out)), ("name", args.name))) + (" --no-gloo" if args.no_gloo else "") \
        + "".join(f" --remeasured {_rel(x)}" for x in args.remeasured) + (" --refit-burst" if args.refit_burst else "") \
        + (f" --idle-gap {args.idle_gap} --idle-wait {args.idle_wait}" if gap else "") + (f" --baseline {_rel(args.baseline)}" if args.baseline else "") \
        + (" --skip-measure" if args.skip_measure else "")
    write_atomic(reports / f"{args.name}.md", markdown(rec, gloo, args, command))
    print(json.dumps({"median_abs_relative_error": rec["median_abs_relative_error"],
                      "order_same_up_to_ties": {o["size_bytes"]: o["same_up_to_ties"] for o in rec["order"]},
                      "crossovers": [(c["pair"], c["measured_bytes"], c["predicted_bytes"]) for c in rec["crossovers"]],
                      "gloo_errors": {g["size_bytes"]: round(g["relative_error"], 4) for g in gloo}}))


if __name__ == "__main__":
    main()
