"""A μ-cuDNN plan as layer times for the simulator: per convolution, its planned forward and
backward (data + weight) seconds and its workspace bytes (`dlsim.plan.scenario.LayerOverrides`)."""

from __future__ import annotations

from dlsim.plan.microbatch.records import MicrobatchPlan
from dlsim.results import Estimate, Source


def plan_overrides(plan: MicrobatchPlan) -> dict[str, tuple[Estimate, Estimate, float]]:
    """Layer name -> (forward, backward, workspace bytes) of every planned convolution with a
    forward pass; each time labelled by the source of the kernels it was planned from."""
    out = {}
    for lp in plan.layers:
        times = {}
        for p in lp.passes:
            src = Source(p.source) if p.source in {x.value for x in Source} else Source.MODEL
            times[p.pass_name] = Estimate(p.time_s, src, f"micro-batch plan {plan.mode}")
        fwd = times.get("forward")
        if fwd is None:
            continue
        bwd = times.get("backward_data", Estimate(0.0, fwd.source)) + times.get("backward_weight", Estimate(0.0, fwd.source))
        out[lp.name] = (fwd, bwd, lp.workspace_bytes)
    return out


def plan_note(plan: MicrobatchPlan, mode: str) -> str:
    """What a simulation priced from `plan` says about it."""
    return (f"convolutions priced by the μ-cuDNN {mode.upper()} plan: {len(plan_overrides(plan))} layers, workspace "
            f"{plan.workspace_bytes:.0f} B, {plan.time_s:.6g} s per micro-batch")
