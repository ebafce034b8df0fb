"""Calibration timing (cache flush outside the timed region) and the hold-out re-measurement of planned kernels."""

from __future__ import annotations

import pytest

from dlsim.calibrate.microbatch_bench import Tensors, bench_layers, time_microbatches, time_once
from dlsim.calibrate.microbatch_exec import PlanRunner
from dlsim.calibrate.microbatch_holdout import HoldoutTimer
from dlsim.cost.conv_methods import conv_geometry
from dlsim.calibrate.conv_workspace import Workspace
from dlsim.calibrate.conv_numpy import workspace_size
from dlsim.plan.microbatch import BenchTable, Kernel, plan_wr

G1 = conv_geometry(1, 4, 8, 8, 6, 3, 3, padding=1)


class Events:
    """A fake clock and flush that log their calls, and a Tensors whose runs are logged too."""

    def __init__(self):
        self.log, self.now = [], 0.0

    def clock(self) -> float:
        self.log.append("clock")
        self.now += 1.0
        return self.now

    def flush(self) -> None:
        self.log.append("flush")
        self.now += 100.0            # a flush costs far more than a micro-batch: it must not be timed


class LoggedTensors(Tensors):
    def run(self, method, pass_name, g, start, ws, accumulate):
        self.events.log.append(("run", start, accumulate))
        self.events.now += 10.0
        super().run(method, pass_name, g, start, ws, accumulate)


def _tensors(events: Events) -> LoggedTensors:
    base = Tensors.make(G1, 4)
    t = LoggedTensors(base.x, base.w, base.dy, base.y, base.dx, base.dw)
    object.__setattr__(t, "events", events)
    return t


def test_flush_runs_before_and_outside_the_timed_region():
    ev = Events()
    t = _tensors(ev)
    g = G1.with_batch(2)
    seconds = time_once(t, "direct", "backward_weight", g, 2, Workspace(workspace_size("direct", "backward_weight", g)),
                        flush=ev.flush, clock=ev.clock)
    assert ev.log == ["flush", "clock", ("run", 0, False), ("run", 2, True), "clock"]
    assert seconds == pytest.approx((10.0 + 10.0 + 1.0) / 2)          # two runs and one clock tick, per micro-batch


def test_time_microbatches_flushes_every_repetition_and_drops_the_warm_up():
    ev = Events()
    t = _tensors(ev)
    median, samples = time_microbatches(t, "im2col", "forward", G1.with_batch(2), 4, repeats=3, min_samples=4,
                                        flush=ev.flush, clock=ev.clock)
    assert ev.log.count("flush") == 4 and len(samples) == 3
    assert all(ev.log[i + 1] == "clock" for i, e in enumerate(ev.log) if e == "flush")
    assert median == pytest.approx(10.5)


def _runners():
    layers = {"a": G1}
    rows = [("a", p, Kernel(alg, b, t, float(workspace_size(alg, p, G1.with_batch(b)))))
            for p in ("forward", "backward_data", "backward_weight")
            for alg, b, t in (("direct", 4, 4.0), ("im2col", 2, 1.0), ("im2col", 4, 3.0))]
    plan = plan_wr(BenchTable.from_rows(rows), 4, 1 << 20)
    return [PlanRunner(plan, layers), PlanRunner(plan, layers, undivided=True)]


def test_holdout_covers_each_distinct_configuration_once_and_sums_medians():
    runners = _runners()
    for r in runners[1:]:
        r.tensors = runners[0].tensors
    hold = HoldoutTimer(runners, flush=lambda: None)
    planned = {(layer, p, k.size, k.algorithm) for layer, p, ks, _ in runners[0].steps for k in ks}
    baseline = {(layer, p, k.size, k.algorithm) for layer, p, ks, _ in runners[1].steps for k in ks}
    assert set(hold.keys) == planned | baseline and len(hold.keys) == len(planned | baseline)
    assert all(b == 2 and a == "im2col" for _, _, b, a in planned)          # 2 x im2col(2) beats im2col(4) and direct
    for i, key in enumerate(hold.keys):
        hold.samples[key] = [1.0 + i, 100.0, 0.5 + i]                          # median 1 + i
    expected = sum(2 * (1.0 + hold.keys.index((layer, p, 2, "im2col"))) for layer, p, _, _ in runners[0].steps)
    assert hold.predicted_time_s(runners[0]) == pytest.approx(expected)
    runners[0].totals = [expected * 1.05]
    runners[0].per_kernel = [[1.0] for _ in runners[0].steps]
    rec = hold.record(runners[0])
    assert rec["error"] == pytest.approx(0.05) and rec["table_time_s"] == pytest.approx(3 * 2 * 1.0)


def test_holdout_times_real_kernels_with_positive_samples():
    runners = _runners()
    hold = HoldoutTimer(runners[:1], flush=lambda: None)
    for key in hold.keys:
        assert hold.time(key) > 0
    assert all(len(v) == 1 for v in hold.samples.values())
    assert not [r for r in bench_layers([("a", G1)], 2, (2,), repeats=1, min_samples=1, prune=False,
                                        methods=("direct",)) if r[2].time_s <= 0]
