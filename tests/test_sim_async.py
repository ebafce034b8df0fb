"""Parameter-server training over many iterations: BSP, SSP, ASP (Downpour), staleness and waiting."""

import pytest

from dlsim.api.simulate import simulate
from dlsim.plan.comm import Layout
from dlsim.results import Estimate, Source
from dlsim.sim.ps import PSInputs, simulate_ps
from dlsim.spec.strategy import Variability, make_strategy
from simkit import RingPricer, chain


def _run(sync, workers=4, shards=1, n=10, staleness=0, compute=1.0, update=0.01, alpha=0.001, beta=1e-9,
         model_bytes=1e6, var=None, **kw):
    s = make_strategy(dp=workers, sync=sync, staleness=staleness, ps_shards=shards, iterations=n,
                      variability=var or Variability(), **kw)
    x = PSInputs("m", "c", s, compute, model_bytes, Estimate(update, Source.MODEL), RingPricer(alpha, beta),
                 Layout(workers, 1, 1, 1))
    return simulate_ps(x)


def test_one_worker_by_hand():
    """W = S = 1, BSP: every iteration is pull + compute + push + apply."""
    msg = 0.001 + 1e6 * 1e-9
    r = _run("ps", workers=1, n=5)
    assert r.simulated_time_s == pytest.approx(5 * (msg + 1.0 + msg + 0.01))
    assert r.staleness_histogram == {0: 5}


def test_asynchronous_staleness_is_about_workers_minus_one():
    r = _run("async", workers=8, n=40).to_dict()
    assert 6.0 <= r["staleness_mean"] <= 7.5
    assert all(w["wait_s"] == 0 for w in r["workers_detail"])


@pytest.mark.parametrize("s", [0, 1, 3])
def test_staleness_is_bounded(s):
    var = Variability(jitter="exponential", jitter_cv=0.8, seed=4)
    r = _run("ssp", workers=4, n=30, staleness=s, var=var).to_dict()
    assert r["staleness_max"] <= (s + 1) * 4 - 1


def test_bsp_staleness_and_waiting():
    var = Variability(device_slowdown=((2, 2.0),))
    r = _run("ps", workers=4, n=10, var=var).to_dict()
    assert r["staleness_max"] == 0  # BSP: a round's pushes are one aggregated update (synchronous SGD)
    waits = [w["wait_s"] for w in r["workers_detail"]]
    assert waits[2] < min(waits[i] for i in (0, 1, 3))  # the straggler never waits; the others wait for it


def test_relaxing_synchronisation_raises_throughput_with_stragglers():
    var = Variability(jitter="lognormal", jitter_cv=0.5, seed=7)
    tput = [_run(sync, workers=8, n=30, staleness=2, var=var).throughput_samples_per_s
            for sync in ("ps", "ssp", "async")]
    assert tput[0] < tput[1] <= tput[2] * 1.0001


def test_simulate_api_parameter_server():
    r = simulate(chain(4, 512), "dgx-h100", dp=4, microbatch_size=8, sync="ssp", staleness=1, ps_shards=2,
                 iterations=6).to_dict()
    assert r["kind"] == "async_simulation" and r["workers"] == 4
    assert sum(r["staleness_histogram"].values()) == 4 * 6 * 2
    assert r["throughput_samples_per_s"] > 0 and r["iteration_compute_s"] > 0


def test_bsp_staleness_counts_rounds_since_the_pull():
    r = _run("ps", workers=4, n=8, fetch_every=2).to_dict()
    assert r["staleness_histogram"] == {"0": 16, "1": 16}


def test_async_throughput_is_per_worker_clock():
    """ASP with one straggler 4x slower: the fast workers keep their own rate (Dean et al. 2012);
    BSP runs everyone at the straggler's pace."""
    var = Variability(device_slowdown=((0, 4.0),))
    fast = _run("async", workers=4, n=10, var=var)
    bsp = _run("ps", workers=4, n=10, var=var)
    one = _run("async", workers=1, n=10).throughput_samples_per_s
    assert fast.throughput_samples_per_s == pytest.approx(one * (3 + 0.25), rel=0.02)
    assert bsp.throughput_samples_per_s == pytest.approx(one * 4 * 0.25, rel=0.1)
    assert bsp.throughput_samples_per_s < 0.35 * fast.throughput_samples_per_s
