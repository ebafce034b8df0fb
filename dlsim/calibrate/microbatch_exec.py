"""Execute a micro-batch plan for real with the NumPy algorithms and measure it.

One training iteration's convolutions in training order (forward through the layers, then for each
layer in reverse ∇x and ∇w), every (layer, pass) running its planned micro-batches one after another
on consecutive slices of full-batch tensors, each with its planned algorithm. The workspace limit is
enforced by the memory itself: WR runs every micro-batch in one arena of the limit's size (a
micro-batch needing more raises `WorkspaceTooSmall`); WD gives each (layer, pass) a private segment
of its planned size inside one arena of the budget's size.

`PlanRunner` prepares one plan (or its undivided baseline) and times single iterations, so that
several plans can be measured in interleaved rounds (a burst of load on a shared machine then hits
all of them alike); `execute_plan` is the one-plan convenience.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Mapping

from dlsim.calibrate.conv_workspace import ALIGN, Workspace
from dlsim.calibrate.microbatch_bench import Tensors
from dlsim.cost.conv_methods import ConvGeometry
from dlsim.errors import SpecError
from dlsim.plan.microbatch.records import MicrobatchPlan


def _schedule(plan: MicrobatchPlan) -> list[tuple[str, str]]:
    """(layer, pass) in training order."""
    fwd = [(lp.name, "forward") for lp in plan.layers if lp.get("forward")]
    bwd = [(lp.name, p) for lp in reversed(plan.layers) for p in ("backward_data", "backward_weight") if lp.get(p)]
    return fwd + bwd


def _aligned(nbytes: float) -> int:
    return -(-int(nbytes) // ALIGN) * ALIGN


class PlanRunner:
    """A plan (or its undivided baseline) ready to run: operands, arena(s) and the micro-batch schedule."""

    def __init__(self, plan: MicrobatchPlan, geometries: Mapping[str, ConvGeometry], *, undivided: bool = False,
                 tensors: dict[str, Tensors] | None = None, seed: int = 0):
        self.plan, self.undivided = plan, undivided
        self.steps = []
        for layer, pass_name in _schedule(plan):
            if layer not in geometries:
                raise SpecError(f"no geometry for planned layer {layer!r}")
            pp = plan.layer(layer).get(pass_name)
            kernels = (pp.undivided,) if undivided else pp.microbatches
            if kernels == (None,):
                raise SpecError(f"{layer} {pass_name}: the undivided baseline does not fit the limit")
            self.steps.append((layer, pass_name, kernels, pp.undivided.time_s if undivided else pp.time_s))
        self.geometries = geometries
        self.tensors = tensors if tensors is not None else {}
        for layer in {s[0] for s in self.steps}:
            if layer not in self.tensors:
                self.tensors[layer] = Tensors.make(geometries[layer], plan.batch, seed)
        arena = Workspace(int(plan.workspace_limit))
        self.arenas, offset = {}, 0
        for layer, pass_name, kernels, _ in self.steps:
            if plan.mode == "wr":
                self.arenas[layer, pass_name] = arena
            else:
                size = _aligned(max(k.workspace_bytes for k in kernels))
                self.arenas[layer, pass_name] = arena.segment(offset, size)
                offset += size
        self.per_kernel: list[list[float]] = [[] for _ in self.steps]
        self.totals: list[float] = []

    @property
    def predicted_time_s(self) -> float:
        return sum(s[3] for s in self.steps)

    def run_step(self, index: int) -> float:
        """Step `index` alone (one (layer, pass): its planned micro-batches one after another); seconds."""
        layer, pass_name, kernels, _ = self.steps[index]
        g1, t, ws = self.geometries[layer], self.tensors[layer], self.arenas[layer, pass_name]
        start = time.perf_counter()
        at = 0
        for i, k in enumerate(kernels):
            t.run(k.algorithm, pass_name, g1.with_batch(k.size), at, ws, accumulate=i > 0)
            at += k.size
        return time.perf_counter() - start

    def run_once(self, record: bool = True, between: Callable[[], Any] | None = None) -> float:
        """One iteration's convolutions; seconds (kept when `record`). `between`, when given, runs
        before every step outside the timing (a diagnostic: e.g. a cache flush, to compare a kernel
        after its predecessor with the same kernel after a flush)."""
        total = 0.0
        for index in range(len(self.steps)):
            if between is not None:
                between()
            elapsed = self.run_step(index)
            total += elapsed
            if record:
                self.per_kernel[index].append(elapsed)
        if record:
            self.totals.append(total)
        return total

    def record(self) -> dict[str, Any]:
        """Prediction against the median of the recorded iterations, overall and per kernel."""
        plan, measured = self.plan, statistics.median(self.totals)
        predicted = self.predicted_time_s
        return {"mode": plan.mode, "policy": "undivided" if self.undivided else plan.policy, "batch": plan.batch,
                "workspace_limit_bytes": plan.workspace_limit, "predicted_time_s": predicted,
                "measured_time_s": measured, "error": measured / predicted - 1 if predicted > 0 else None,
                "repetitions_s": list(self.totals),
                "spread": (max(self.totals) - min(self.totals)) / measured if measured else None,
                "workspace_bytes": (max if plan.mode == "wr" else sum)(
                    max(k.workspace_bytes for k in ks) for _, _, ks, _ in self.steps),
                "kernels": [{"kernel": f"{layer} {p}", "predicted_time_s": pred,
                             "measured_time_s": statistics.median(times),
                             "microbatches": [[k.size, k.algorithm] for k in ks]}
                            for (layer, p, ks, pred), times in zip(self.steps, self.per_kernel)]}


def execute_plan(plan: MicrobatchPlan, geometries: Mapping[str, ConvGeometry], *, repeats: int = 5,
                 undivided: bool = False, seed: int = 0,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run `plan` (or, with `undivided`, its undivided baseline) `repeats` times after one warm-up; a record."""
    runner = PlanRunner(plan, geometries, undivided=undivided, seed=seed)
    runner.run_once(record=False)
    for rep in range(repeats):
        total = runner.run_once()
        if progress:
            progress(f"repetition {rep + 1}/{repeats}: {total:.4f} s")
    return runner.record()
