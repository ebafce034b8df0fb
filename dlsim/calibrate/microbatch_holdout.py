"""Hold-out re-measurement of the kernels a plan chose: a prediction free of the planner's selection bias.

Why. A planner that picks, per kernel, the fastest of many configurations whose measured times are
noisy picks configurations whose measurement happened to come out low: the minimum of noisy
estimates is biased below the true time of the chosen configuration ("the optimizer's curse",
Smith & Winkler, Management Science 52(3), 2006; the same reason machine-learning model selection
reports a held-out score). The more near-tied candidates (μ-cuDNN's micro-batch splits × algorithms
against the undivided baseline's handful of algorithms), the larger the bias. Smith & Winkler's
remedy without a model of the noise is an independent estimate of the chosen alternatives: here the
configurations a plan uses are timed again, with the calibration's own method
(`microbatch_bench.time_once`: a cache flush outside the timing, then a whole batch's worth of
consecutive micro-batches in a workspace of exactly the configuration's size), and the plan's
hold-out prediction is the sum of those medians. Nothing is fitted or scaled: the planner's choice
still comes from the calibration table, only the estimate of the chosen plan's time is independent.

`HoldoutTimer.time(key)` takes one sample of one configuration, so that a caller can interleave the
samples with executions of the plans (one sample of everything per round, shuffled): the hold-out
estimate and the execution then see the same state of a machine whose speed drifts over minutes.
"""

from __future__ import annotations

import statistics
from typing import Callable, Iterable

from dlsim.calibrate.conv_numpy import workspace_size
from dlsim.calibrate.conv_workspace import Workspace
from dlsim.calibrate.microbatch_bench import Tensors, flush_caches, microbatches_per_repetition, time_once
from dlsim.calibrate.microbatch_exec import PlanRunner

Key = tuple[str, str, int, str]          # layer, pass, micro-batch size, algorithm


class HoldoutTimer:
    """Every distinct (layer, pass, size, algorithm) the given runners execute, ready to be timed again."""

    def __init__(self, runners: Iterable[PlanRunner], *, flush: Callable[[], object] = flush_caches,
                 min_samples: int | None = None):
        self.runners = list(runners)
        self.flush = flush
        self.configs: dict[Key, tuple[Tensors, object, int, Workspace]] = {}
        for runner in self.runners:
            batch = runner.plan.batch
            for layer, pass_name, kernels, _ in runner.steps:
                for k in kernels:
                    key = (layer, pass_name, k.size, k.algorithm)
                    if key in self.configs:
                        continue
                    g = runner.geometries[layer].with_batch(k.size)
                    reps = microbatches_per_repetition(k.size, batch, min_samples or batch)
                    ws = Workspace(workspace_size(k.algorithm, pass_name, g))
                    self.configs[key] = (runner.tensors[layer], g, reps, ws)
        self.samples: dict[Key, list[float]] = {key: [] for key in self.configs}

    @property
    def keys(self) -> list[Key]:
        return list(self.configs)

    def time(self, key: Key, record: bool = True) -> float:
        """One sample of one configuration: seconds per micro-batch (kept when `record`)."""
        tensors, g, reps, ws = self.configs[key]
        seconds = time_once(tensors, key[3], key[1], g, reps, ws, flush=self.flush)
        if record:
            self.samples[key].append(seconds)
        return seconds

    def median(self, key: Key) -> float:
        return statistics.median(self.samples[key])

    def step_times(self, runner: PlanRunner) -> list[float]:
        """Per step of `runner`: the sum over its micro-batches of the hold-out medians."""
        return [sum(self.median((layer, p, k.size, k.algorithm)) for k in kernels)
                for layer, p, kernels, _ in runner.steps]

    def predicted_time_s(self, runner: PlanRunner) -> float:
        """The plan's (or baseline's) hold-out prediction: Σ over its micro-batches of their hold-out medians."""
        return sum(self.step_times(runner))

    def record(self, runner: PlanRunner) -> dict:
        """Hold-out prediction against the runner's measured iterations, overall and per kernel."""
        measured = statistics.median(runner.totals)
        predicted = self.predicted_time_s(runner)
        return {"predicted_time_s": predicted, "measured_time_s": measured, "error": measured / predicted - 1,
                "table_time_s": runner.predicted_time_s,
                "kernels": [{"kernel": f"{layer} {p}", "table_time_s": table_s, "holdout_time_s": hold_s,
                             "measured_time_s": statistics.median(times)}
                            for (layer, p, _, table_s), hold_s, times
                            in zip(runner.steps, self.step_times(runner), runner.per_kernel)]}
