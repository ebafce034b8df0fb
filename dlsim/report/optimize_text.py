"""Text summary of an `optimize` record (``kind: optimize``), drawn from the record alone."""

from __future__ import annotations

from typing import Any

from dlsim.report.sim_text import stack_line
from dlsim.report.text import table
from dlsim.units import format_bytes


def _differs(base: str, other: str) -> str:
    """The words of label `other` that `base` lacks (``rc-sel``): what an equivalent candidate adds."""
    have = set(base.split())
    return " ".join(w for w in other.split() if w not in have) or other


def _fitting(c: dict[str, Any]) -> str:
    """How many candidates fit and what became of them: timed by the evaluator, or ruled out by a lower
    bound of their time (`dlsim.plan.search.Prune`)."""
    pruned = c.get("pruned_by_bound", 0)
    if not pruned:
        return f"{c['evaluated']} fit and evaluated analytically"
    return (f"{c['evaluated'] + pruned} fit: {c['evaluated']} evaluated analytically, {pruned} ruled out by a "
            f"lower bound of their time")


def optimize_summary(rec: dict[str, Any], rows: int = 10) -> str:
    """The ranked table (simulated), the winner's why, the Pareto front, the search's counts."""
    c = rec["candidates"]
    a = rec["assumed"]
    lines = [f"{rec['model']} on {rec['gpus']} x {rec['cluster']}, global batch {rec['global_batch']}, "
             f"{rec['dtype']}, objective {rec['objective']}",
             f"candidates: {c['enumerated']} buildable, {_fitting(c)}, "
             f"{c['simulated']} simulated event by event (ranked by the simulation)"]
    stack = stack_line(rec)
    if stack:
        lines.insert(1, stack)
    if c["dropped"]:
        lines.append("dropped: " + "; ".join(f"{k} ({v})" for k, v in c["dropped"].items()))
    lines.append("")
    head = ["#", "strategy", "time s", "est. s", "samples/s", "compute", "recomp", "exp.comm", "bubble",
            "memory", "fits"]
    body = []
    for r in rec["ranked"][:rows]:
        b = r["breakdown_s"]
        name = r["label"] + (f" (= with {', '.join(_differs(r['label'], e) for e in r['equivalents'])})"
                             if r.get("equivalents") else "")
        body.append([r["rank"], name, f"{r['iteration_time_s']:.4g}", f"{r['estimate']['iteration_time_s']:.4g}",
                     f"{r['throughput_samples_per_s']:.4g}", f"{b.get('compute', 0):.3g}", f"{b.get('recompute', 0):.3g}",
                     f"{b.get('exposed_comm', 0):.3g}", f"{b.get('bubble', 0):.3g}",
                     format_bytes(r["peak_memory_bytes"]), "yes" if r["feasible"] else "OOM"])
    lines.append(table(head, body, [True, False] + [True] * 8 + [False]))
    w = rec["why"]
    lines.append("")
    lines.append(f"best: {w['winner']}")
    lines.append(f"  bottleneck {w['bottleneck']} ({w['bottleneck_share']:.0%} of the iteration); exposed communication "
                 f"{w['exposed_comm_share']:.1%}; pipeline bubble {w['bubble_share']:.1%}; memory headroom "
                 f"{format_bytes(w['memory_headroom_bytes'])} ({w['memory_headroom_share']:.0%} of capacity)")
    if "runner_up" in w:
        ru = w["runner_up"]
        changes = ", ".join(f"{k} {x}->{y}" for k, (x, y) in ru["differs"].items())
        lines.append(f"  runner-up {ru['trade']} ({changes})")
    lines.append("")
    lines.append(f"Pareto front, time vs memory per device ({len(rec['pareto'])} points):")
    for p in rec["pareto"][:12]:
        lines.append(f"  {p['iteration_time_s']:.4g} s  {format_bytes(p['peak_memory_bytes']):>10}  {p['label']} "
                     f"({p['source']})")
    lines.append("")
    lines.append("assumed: " + ", ".join(f"{k} {v}" for k, v in a.items()))
    return "\n".join(lines)


def stacks_summary(rec: dict[str, Any]) -> str:
    """A stack comparison (``kind: stack_comparison``): each stack's best strategy, fastest first,
    then the fastest stack's own summary."""
    lines = [f"{rec['model']} on {rec['cluster']}: the best strategy on each software stack (dlsim stacks show NAME)", ""]
    head = ["stack", "version", "best strategy", "time s", "vs fastest", "MFU", "memory"]
    body = [[r["stack"], r["version"], r["label"], f"{r['iteration_time_s']:.4g}", f"{r['slowdown']:+.1%}",
             f"{r['mfu']:.0%}", format_bytes(r["memory_bytes"])] for r in rec["stacks"]]
    lines.append(table(head, body, [False, False, False, True, True, True, True]))
    lines += ["", optimize_summary(rec["results"][rec["stacks"][0]["stack"]], rows=5)]
    return "\n".join(lines)
