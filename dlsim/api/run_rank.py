"""Ranking simulated strategies by the whole run (`optimize --objective time-to-train|cost|energy`)
and saying what the failure and checkpoint model changed against the step-time winner.

Each simulated candidate's iteration becomes a run (`dlsim.api.run.run_model`, closed form, no
Monte Carlo); the key is its expected time to train, cost or facility energy. A strategy's
checkpoint (what each rank writes, so the write time and the optimal interval) and its restart
(what each rank reads back) depend on its sharding, so a slower step can win the run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from dlsim.api.run import RUN_OBJECTIVES, RunOptions, run_model
from dlsim.errors import SpecError
from dlsim.results_run import RunResult, finite
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.units import format_bytes, format_time


def run_options(objective: str, options: RunOptions | Mapping[str, Any] | None) -> RunOptions:
    """The run options an objective needs, checked: a token budget; prices for cost."""
    if options is None or (isinstance(options, Mapping) and "tokens" not in options):
        raise SpecError(f"--objective {objective} models the whole run: give --tokens (e.g. 15T)", field="tokens")
    o = options if isinstance(options, RunOptions) else RunOptions(**dict(options))
    o = replace(o, trials=0).check()
    if objective == "cost" and o.usd_per_gpu_hour is None and o.usd_per_kwh is None:
        raise SpecError("--objective cost needs a price: --usd-per-gpu-hour and/or --usd-per-kwh", field="objective")
    return o


def run_value(r: RunResult, objective: str) -> float:
    """The quantity an objective minimises."""
    if objective == "time-to-train":
        return r.wall_s
    if objective == "cost":
        return r.cost_usd or 0.0
    if r.energy_kwh is None:
        raise SpecError("--objective energy needs the profile's 'power:' section", field="objective")
    return r.energy_kwh


def _line(r: RunResult) -> dict[str, Any]:
    c, e = r.checkpoint, r.expected
    return {"iteration_time_s": r.iteration_time_s, "wall_s": r.wall_s, "goodput": r.goodput,
            "checkpoint_node_bytes": c["node_bytes_max"], "checkpoint_write_s": c["write_s"],
            "checkpoint_blocking_s": c["blocking_s"], "interval_s": c["interval_s"],
            "checkpoint_overhead_s": e["checkpoint_s"], "lost_work_s": e["lost_work_s"], "restart_s": e["restart_s"],
            "read_s": c["read_s"], "cost_usd": r.cost_usd, "energy_kwh": r.energy_kwh}


def rank_by_run(ranked: Sequence[Any], model: Model, cluster: Cluster, objective: str,
                options: RunOptions, label: Callable[[Any], str]) -> tuple[list[Any], dict[str, Any]]:
    """`ranked` (feasible simulated candidates, each with `.result` and `.strategy`) re-ranked by the
    run `objective`, and the "why": the run winner against the step-time winner (`label` names a
    strategy)."""
    if objective not in RUN_OBJECTIVES:
        raise SpecError(f"unknown run objective {objective!r} (use {', '.join(RUN_OBJECTIVES)})", field="objective")
    runs = {}
    for c in ranked:
        if c.result.feasible:
            runs[id(c)] = run_model([(c.result, _iterations(c.result, model, options))], model, cluster, options)
    keep = [c for c in ranked if id(c) in runs]
    keep.sort(key=lambda c: (run_value(runs[id(c)], objective), c.result.iteration_time_s))
    step = min(keep, key=lambda c: c.result.iteration_time_s)
    win = keep[0]
    rw, rs = runs[id(win)], runs[id(step)]
    others = [c for c in keep if c is not win]
    steadier = max(others, key=lambda c: runs[id(c)].goodput, default=None)
    why = {"objective": objective, "winner": label(win.strategy), "step_time_winner": label(step.strategy),
           "changed": win is not step, "winner_run": _line(rw), "step_time_winner_run": _line(rs),
           "candidates": [{"label": label(c.strategy), "value": run_value(runs[id(c)], objective),
                           **_line(runs[id(c)])} for c in keep],
           "sentence": _sentence(win, step, rw, rs, objective, label,
                                 (steadier, runs[id(steadier)]) if steadier is not None else None)}
    return keep, finite(why)


def _iterations(result, model: Model, o: RunOptions) -> int:
    from dlsim.api.run import phase_iterations, tokens_per_sample
    (_, n), = phase_iterations(o.tokens, tokens_per_sample(model), (), result.global_batch)
    return n


def _unit(objective: str, v: float) -> str:
    if objective == "time-to-train":
        return f"{v / 86400:.4g} days"
    if objective == "cost":
        return f"${v:,.0f}"
    return f"{v / 1000:.4g} MWh"


def _sentence(win, step, rw: RunResult, rs: RunResult, objective: str, label, steadier=None) -> str:
    """What the failure and checkpoint model changed against the step-time winner, in one line."""
    cw, cs = rw.checkpoint, rs.checkpoint
    parts_w = (f"checkpoint {format_bytes(cw['node_bytes_max'])} per node, blocking {format_time(cw['blocking_s'])} "
               f"every {format_time(cw['interval_s'])}, restart read {format_time(cw['read_s'])}, goodput {rw.goodput:.1%}")
    if win is step:
        over = rw.expected["checkpoint_s"] + rw.expected["lost_work_s"] + rw.expected["restart_s"]
        text = (f"the failure and checkpoint model keeps the step-time winner {label(win.strategy)}: {parts_w}; "
                f"failures and checkpoints add {over / rw.work_s:.1%} to its {rw.work_s / 86400:.4g} days of iterations")
        if steadier is None:
            return text
        c, r = steadier
        if r.goodput <= rw.goodput:
            return text + f"; no other simulated candidate loses less ({label(c.strategy)}: goodput {r.goodput:.1%})"
        dt = r.iteration_time_s / rw.iteration_time_s - 1
        return (text + f"; {label(c.strategy)} loses less (goodput {r.goodput:.1%}: checkpoint "
                f"{format_bytes(r.checkpoint['node_bytes_max'])} per node, restart read {format_time(r.checkpoint['read_s'])}) "
                f"but its step is {dt:.1%} slower: {_unit(objective, run_value(r, objective))} against "
                f"{_unit(objective, run_value(rw, objective))}")
    parts_s = (f"checkpoint {format_bytes(cs['node_bytes_max'])} per node, blocking {format_time(cs['blocking_s'])} "
               f"every {format_time(cs['interval_s'])}, restart read {format_time(cs['read_s'])}, goodput {rs.goodput:.1%}")
    dt = rs.iteration_time_s / rw.iteration_time_s - 1
    return (f"the failure and checkpoint model changes the choice: {label(step.strategy)} has the fastest step "
            f"({-dt:.1%} {'faster' if dt < 0 else 'slower'}) but {parts_s}; {label(win.strategy)}: {parts_w}; "
            f"{objective} {_unit(objective, run_value(rw, objective))} against {_unit(objective, run_value(rs, objective))}")
