"""Text of an analytic estimate (``kind: analytic_estimate``), from the record alone."""

from __future__ import annotations

from typing import Any

from dlsim.report.sim_text import _strategy_line, advice_lines, precision_line, stack_line, throughput_text
from dlsim.units import format_bytes, format_time


def analytic_summary(rec: dict[str, Any]) -> str:
    """The headline, the time split and memory per pipeline stage of an analytic estimate."""
    t = rec["iteration_time_s"]
    flags = rec.get("approximate") or []
    how = (f"analytic estimate (held within {rec['tolerance']:.0%} of the event simulation"
           + (f"; approximate: {'; '.join(flags)})" if flags else ")"))
    lines = [f"{rec['model']} on {rec['cluster']} ({rec['device']}): {how}",
             f"strategy: {_strategy_line(rec['strategy'])}"]
    if stack_line(rec):
        lines.append(stack_line(rec))
    lines += [precision_line(rec), f"iteration time   {format_time(t)}", *advice_lines(rec),
              f"throughput       {throughput_text(rec)}",
              f"utilisation      model FLOPs utilisation {rec['model_flops_utilisation']:.1%}",
              "where the time goes (mean over stages):"]
    for key in ("compute", "recompute", "exposed_comm", "bubble"):
        value = rec["breakdown_s"][key]
        lines.append(f"  {key.replace('_', ' '):<24}{format_time(value):>12}  {value / t if t else 0:6.1%}")
    lines.append(f"peak memory      {format_bytes(rec['peak_memory_bytes'])} of {format_bytes(rec['capacity_bytes'])} "
                 f"usable per device")
    for r, m in enumerate(rec["stages"][:8]):
        lines.append(f"  stage {r:<3}" + ", ".join(f"{k} {format_bytes(v)}" for k, v in m.items() if v > 0 and k != "total"))
    if len(rec["stages"]) > 8:
        lines.append(f"  ... {len(rec['stages']) - 8} more stages")
    if not rec["feasible"]:
        lines.append(f"INFEASIBLE: {rec['infeasible_reason']}")
    lines += [f"note: {n}" for n in rec.get("notes", [])]
    return "\n".join(lines)
