"""Round-robin timing of several models and the `min` statistic on both sides (no torch needed)."""

from __future__ import annotations

import pytest

from dlsim.calibrate.compute_timer import KernelTimer, Timing
from dlsim.validate.compute_iteration import MeasuredIteration, interleaved_iterations


class FakeRunner:
    """Steps of a fixed duration that log the order in which models ran."""

    def __init__(self, name: str, seconds: float, log: list[str], extra: list[float] | None = None):
        self.name, self.seconds, self.log = name, seconds, log
        self.extra = list(extra or [])
        self.threads, self.impl = 2, "fake"

    def step(self) -> tuple[float, float, float]:
        self.log.append(self.name)
        bump = self.extra.pop(0) if self.extra else 0.0
        return (self.seconds / 2 + bump, self.seconds / 4, self.seconds / 4)

    def layer_spans(self, repeats: int) -> dict[str, list[tuple[float, float]]]:
        return {"fc": [(0.1, 0.2)] * repeats}


def test_round_robin_order_warmups_and_more_samples_for_short_models():
    log: list[str] = []
    short, long = FakeRunner("short", 0.01, log), FakeRunner("long", 0.2, log)
    out = interleaved_iterations([short, long], rounds=3, min_round_s=0.1, warmup=1, per_layer_repeats=2)
    # sizing: 2 steps each; per round: short 1 warm-up + ceil(0.1/0.01)=10 timed, long 1 + 2 timed
    sizing, rounds = log[:4], log[4:]
    assert sizing == ["short", "short", "long", "long"]
    one_round = ["short"] * 11 + ["long"] * 3
    assert rounds == one_round * 3
    assert len(out[0].samples) == 30 and len(out[1].samples) == 6
    assert out[0].layer_samples == {"fc": [(0.1, 0.2)] * 2} and out[1].optimizer_impl == "fake"


def test_min_statistic_picks_the_least_disturbed_iteration():
    log: list[str] = []
    # the disturbed steps: the 3rd to 5th timed steps of round 1 run 50 ms longer
    r = FakeRunner("m", 0.1, log, extra=[0, 0, 0, 0, 0.05, 0.05, 0.05])
    (m,) = interleaved_iterations([r], rounds=2, min_round_s=0.1, warmup=1)
    phases_min, phases_median = m.phases("min"), m.phases("median")
    assert phases_min["iteration"] == pytest.approx(0.1)
    assert phases_min["forward"] == pytest.approx(0.05)
    assert phases_median["iteration"] >= phases_min["iteration"]
    assert max(m.iteration_samples) == pytest.approx(0.15)


def test_measured_iteration_statistics_by_hand():
    m = MeasuredIteration(((1.0, 1.0, 1.0), (2.0, 0.5, 1.0), (4.0, 2.0, 0.5)))
    assert m.phases("min") == {"forward": 1.0, "backward": 0.5, "optimizer": 0.5, "iteration": 3.0}
    assert m.phases("median") == {"forward": 2.0, "backward": 1.0, "optimizer": 1.0, "iteration": 3.5}


def test_kernel_timer_min_plumbing_with_a_fake_clock():
    ticks = iter([0, 1, 1, 3, 3, 8, 8, 10, 10, 14, 14, 17, 17, 20])  # warm-up 1, sizing 2, then 5, 2, 4, 3, 3
    timer = KernelTimer("cpu", repeats=5, min_block_s=0.0, long_kernel_s=100.0, clock=lambda: next(ticks),
                        statistic="min")
    t = timer.time(lambda: None)
    assert (t.min_s, t.median_s, t.seconds) == (2, 3, 2)
    assert Timing(3.0, 0.0, 5, 1, 2.0, "median").seconds == 3.0
    from dlsim.errors import DlsimError
    with pytest.raises(DlsimError):
        KernelTimer("cpu", statistic="mean")
