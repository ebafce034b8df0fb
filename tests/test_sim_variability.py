"""Stragglers, jitter and heterogeneous devices: seeded, deterministic, and where they bite."""

import numpy as np
import pytest

from dlsim.api.models import as_model
from dlsim.api.simulate import simulate
from dlsim.plan.variability import draw, rank_slowdowns
from dlsim.spec.strategy import Variability
from simkit import chain


@pytest.fixture(scope="module")
def model():
    return chain(6, 512)


def test_a_slow_replica_sets_the_pace(model):
    """Without overlap: T = 2·(compute + optimizer) of the slow replica + the all-reduce."""
    single = simulate(model, "dgx-h100", dp=1, microbatch_size=16)
    even = simulate(model, "dgx-h100", dp=4, microbatch_size=16, overlap=False)
    comm = even.iteration_time_s - single.iteration_time_s
    slow = simulate(model, "dgx-h100", dp=4, microbatch_size=16, overlap=False,
                    variability=Variability(device_slowdown=((1, 2.0),)))
    assert slow.simulated_devices == 4
    assert slow.iteration_time_s == pytest.approx(2 * single.iteration_time_s + comm, rel=1e-12)
    idle = {d.rank: d.breakdown.idle + d.breakdown.exposed_comm for d in slow.devices}
    assert idle[1] == pytest.approx(comm) and idle[0] > idle[1]


@pytest.mark.parametrize("dist", ["normal", "lognormal", "exponential", "uniform"])
def test_jitter_draws_have_mean_one_and_cv(dist):
    x = draw(Variability(jitter=dist, jitter_cv=0.2), np.random.default_rng(0), (200_000,))
    assert x.mean() == pytest.approx(1.0, abs=0.01) and x.std() == pytest.approx(0.2, rel=0.05)


def test_stragglers_are_a_seeded_fraction():
    a = rank_slowdowns(Variability(straggler_fraction=0.1, straggler_slowdown=1.5, seed=1), 100)
    b = rank_slowdowns(Variability(straggler_fraction=0.1, straggler_slowdown=1.5, seed=1), 100)
    c = rank_slowdowns(Variability(straggler_fraction=0.1, straggler_slowdown=1.5, seed=2), 100)
    assert a == b != c and len(a) == 10 and set(a.values()) == {1.5}


def test_jitter_slows_synchronous_training_on_average(model):
    base = simulate(model, "dgx-h100", dp=8, microbatch_size=16).iteration_time_s
    runs = [simulate(model, "dgx-h100", dp=8, microbatch_size=16,
                     variability=Variability(jitter="normal", jitter_cv=0.1, seed=s)).iteration_time_s
            for s in range(5)]
    assert np.mean(runs) > base and len(set(runs)) == 5


def test_a_slow_stage_is_the_pipeline_bottleneck():
    gpt = as_model("gpt2", {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024})
    kw = dict(pp=2, microbatch_size=1, num_microbatches=8, stage_partition=(22, 23))
    even = simulate(gpt, "dgx-h100", **kw)
    slow = simulate(gpt, "dgx-h100", variability=Variability(device_slowdown=((1, 3.0),)), **kw)
    assert slow.iteration_time_s > 2 * even.iteration_time_s
    assert slow.devices[0].breakdown.bubble > even.devices[0].breakdown.bubble
