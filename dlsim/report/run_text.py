"""The text summary of a run record (`dlsim run`), from the record alone."""

from __future__ import annotations

from typing import Any

from dlsim.units import format_bytes, format_count, format_time


def _days(s: float) -> str:
    return f"{s / 86400:.3g} days" if s >= 86400 else format_time(s)


def run_summary(rec: dict[str, Any]) -> str:
    """Time to train, failures and checkpoints, energy and cost of one run record."""
    s = rec["strategy"]
    e, f, c = rec["expected"], rec["failures"], rec["checkpoint"]
    lines = [f"{rec['model']} on {rec['gpus']} x {rec['cluster']} ({rec['nodes']} nodes): dp {s['dp']} tp {s['tp']} "
             f"pp {s['pp']}" + (f" cp {s.get('cp', 1)}" if s.get("cp", 1) > 1 else "") + f" zero {s.get('zero', 0)}"
             + (f", stack {rec['stack']['name']}" if rec.get("stack") else ""),
             f"budget {format_count(rec['tokens'])} tokens: {rec['iterations']:,} iterations of "
             f"{format_time(rec['iteration_time_s'])} (global batch {rec['iteration']['global_batch']}, MFU "
             f"{rec['iteration']['mfu']:.1%})" + (f", {len(rec['phases']) - 1} ramp-up phase(s)" if len(rec["phases"]) > 1 else "")]
    lines.append(f"time to train {_days(rec['wall_s'])} ({_days(rec['work_s'])} of iterations), "
                 f"{format_count(rec['gpu_hours'])} GPU-hours, {format_count(rec['tokens_per_s'])} tokens/s, goodput {rec['goodput']:.1%}")
    if f["mtbf_s"] is not None:
        lines.append(f"failures: {f['job_interruptions_per_day']:.3g} per day (MTBF {format_time(f['mtbf_s'])}), "
                     f"{f['expected_unplanned']:.4g} expected; lost work {_days(e['lost_work_s'])}, restarts "
                     f"{_days(e['restart_s'])} ({format_time(f['restart_s'])} each: relaunch "
                     f"{format_time(f['restart_parts_s']['relaunch'])}, read {format_time(f['restart_parts_s']['read_checkpoint'])}, "
                     f"warm-up {format_time(f['restart_parts_s']['warmup'])})")
    if c["count"]:
        lines.append(f"checkpoints ({c['mode']}): {format_bytes(c['total_bytes'])} each, at most "
                     f"{format_bytes(c['rank_bytes_max'])} per rank and {format_bytes(c['node_bytes_max'])} per node "
                     f"({c['writer_ranks']:,} writing ranks); write {format_time(c['write_s'])}, blocking "
                     f"{format_time(c['blocking_s'])}; every {c['interval_iterations']:,} iterations "
                     f"({format_time(c['interval_s'])}; Young {format_time(c['young_interval_s'])}, Daly "
                     f"{format_time(c['daly_interval_s'])})" if c["young_interval_s"] is not None
                     else f"checkpoints ({c['mode']}): {format_bytes(c['total_bytes'])} each, {c['count']} in the run")
    mc = rec.get("monte_carlo")
    if mc:
        lines.append(f"Monte Carlo ({mc['trials']} runs, seed {mc['seed']}): time to train {_days(mc['wall_s_p5'])} - "
                     f"{_days(mc['wall_s_p95'])} (5th-95th percentile), goodput {mc['goodput_p5']:.1%} - "
                     f"{mc['goodput_p95']:.1%}, {mc['failures_mean']:.4g} failures on average")
    en = rec.get("energy")
    if en:
        lines.append(f"energy {en['facility_mwh']:.4g} MWh at the facility (PUE {en['pue']:g}); training draws "
                     f"{en['training_power_w'] / 1e6:.4g} MW IT, {en['iteration']['facility_j'] / 3.6e6:.4g} kWh per iteration")
    cost = rec.get("cost")
    if cost:
        lines.append(f"cost ${cost['total_usd']:,.0f} (GPUs ${cost['gpu_usd']:,.0f}, energy ${cost['energy_usd']:,.0f})")
    lines += [f"note: {n}" for n in rec.get("notes", [])]
    return "\n".join(lines)
