"""The whole-run model (dlsim run): failures and checkpoints, energy, cost, bad input."""

from __future__ import annotations

import math
import numpy as np
import pytest

from dlsim.api.run import RunOptions, checkpoint_of, run, run_model
from dlsim.api.simulate import simulate
from dlsim.cost.checkpoint import StageStates, checkpoint_plan
from dlsim.cost.reliability import daly_interval, expected_run, optimal_interval, young_interval
from dlsim.errors import SpecError
from dlsim.io.profile_yaml import load_profile
from dlsim.plan.zero import model_state_bytes
from dlsim.sim.failures import simulate_failures, simulated_optimum


def test_daly_interval_is_the_simulated_optimum_within_its_monte_carlo_error():
    m, d, r, work = 3600.0, 60.0, 300.0, 60 * 3600.0
    tau = daly_interval(d, m)
    assert tau == pytest.approx(optimal_interval(d, r, m), rel=2e-3)  # the closed form is the model's optimum
    opt = simulated_optimum(work, np.geomspace(tau / 2, tau * 2, 9), d, r, m, trials=200, seed=3, boot=60)
    assert abs(opt["interval_s"] - tau) <= 3 * opt["stderr_s"] + 0.01 * tau
    # Young's first-order interval agrees only where δ << M
    assert young_interval(1.0, 36000.0) == pytest.approx(daly_interval(1.0, 36000.0), rel=0.01)


def test_closed_form_wall_time_equals_the_simulated_mean():
    m, d, r, work, tau = 1800.0, 30.0, 240.0, 40 * 3600.0, 400.0
    exp = expected_run(work, tau, d, r, m)
    runs = simulate_failures(work, tau, d, r, m, trials=400, seed=1)
    s = runs.summary()
    assert abs(s["wall_s_mean"] - exp.wall_s) < 4 * s["wall_s_stderr"]
    assert s["failures_mean"] == pytest.approx(exp.failures, rel=0.05)
    assert exp.wall_s == pytest.approx(exp.work_s + exp.checkpoint_s + exp.lost_s + exp.restart_s)
    # same seed, same draws
    assert np.array_equal(runs.wall_s, simulate_failures(work, tau, d, r, m, trials=400, seed=1).wall_s)


def test_async_checkpoint_monte_carlo_loses_more_with_a_longer_lag():
    m, work, tau = 1800.0, 20 * 3600.0, 300.0
    short = simulate_failures(work, tau, 2.0, 200.0, m, trials=300, seed=2, lag_s=10.0).summary()
    long = simulate_failures(work, tau, 2.0, 200.0, m, trials=300, seed=2, lag_s=250.0).summary()
    assert long["lost_work_s_mean"] > short["lost_work_s_mean"]


@pytest.mark.parametrize("zero,hybrid", [(0, False), (1, False), (2, False), (3, False), (3, True)])
def test_checkpoint_is_the_model_states_each_rank_holds(zero, hybrid):
    from dlsim.api.models import as_model
    s = simulate("gpt2", "dgx-h100", dp=16, microbatch_size=2, dtype="bf16", zero=zero, hybrid_shard=hybrid, nodes=2)
    plan = checkpoint_of(s, load_profile("dgx-h100"))
    params = sum(layer.params for layer in as_model("gpt2").layers)
    held = model_state_bytes(params, "bf16", "adam", zero, 8 if hybrid else 16)  # FSDP hybrid: shards of a node
    dev = s.devices[0].memory
    assert (dev["weights"], dev["optimizer"]) == pytest.approx((held["weights"], held["optimizer"]), rel=1e-9)
    # the busiest writer writes all it holds (weights and optimizer state, no gradients) ...
    assert plan.rank_bytes == pytest.approx(held["weights"] + held["optimizer"], rel=1e-9)
    # ... and the whole checkpoint holds every state once, however it is sharded
    full = model_state_bytes(params, "bf16", "adam", 0, 1)
    assert plan.total_bytes == pytest.approx(full["weights"] + full["optimizer"], rel=1e-9)
    assert plan.read_bytes == pytest.approx(16 * (held["weights"] + held["optimizer"]), rel=1e-9)


def test_checkpoint_writers_follow_the_sharding():
    st = [StageStates(10.0, 60.0, 32)]                       # tp 2: 16 dp ranks per tp rank
    z0 = checkpoint_plan(0, 16, False, st, 8)
    z1 = checkpoint_plan(1, 16, False, st, 8)
    z3 = checkpoint_plan(3, 16, False, st, 8)
    assert (z0.writer_ranks, z0.total_bytes) == (2, 2 * 70.0)
    assert (z1.writer_ranks, z1.total_bytes) == (32, 2 * 10.0 + 32 * 60.0)
    assert (z3.writer_ranks, z3.total_bytes) == (32, 32 * 70.0)
    assert z0.node_bytes == 2 * 70.0 and z3.node_bytes == 8 * 70.0
    assert z1.read_bytes == 32 * 70.0                        # every rank reads what it holds


def _options(**kw):
    base = dict(tokens=2e9, usd_per_gpu_hour=2.0, usd_per_kwh=0.1, trials=0)
    return RunOptions(**{**base, **kw})


def test_run_without_failures_is_iterations_times_iteration_time():
    r = run("gpt2", "dgx-h100", tokens=2e9, options=_options(failures=False), dp=8, microbatch_size=4, dtype="bf16")
    assert r.wall_s == pytest.approx(r.iterations * r.iteration_time_s, rel=1e-12)
    assert r.iterations == math.ceil(2e9 / (r.iteration["global_batch"] * 1024))
    assert r.goodput == pytest.approx(1.0)
    assert r.gpu_hours == pytest.approx(r.wall_s * 8 / 3600)


def test_energy_adds_up_over_the_per_device_breakdown():
    r = run("gpt2", "dgx-h100", tokens=2e9, options=_options(), dp=4, pp=2, num_microbatches=4, microbatch_size=2,
            dtype="bf16")
    it = r.energy["iteration"]
    per_device = sum(d["total_energy_j"] * d["multiplicity"] for d in it["per_device"])
    assert per_device == pytest.approx(it["devices_j"], rel=1e-12)
    assert it["it_j"] == pytest.approx(per_device + it["nodes_j"], rel=1e-12)
    assert it["facility_j"] == pytest.approx(it["it_j"] * it["pue"], rel=1e-12)
    for d in it["per_device"]:   # each device's seconds add up to the iteration
        assert sum(d["seconds"].values()) == pytest.approx(r.iteration_time_s, rel=1e-9)
    parts = r.energy["parts_it_j"]
    assert sum(parts.values()) == pytest.approx(r.energy["it_j"], rel=1e-12)
    assert parts["training"] == pytest.approx(it["it_j"] * r.iterations, rel=1e-9)
    assert r.cost["total_usd"] == pytest.approx(r.gpu_hours * 2.0 + r.energy["facility_kwh"] * 0.1, rel=1e-12)


def test_more_gpus_fail_more_often():
    a = run("gpt2", "dgx-h100", tokens=2e9, options=_options(), dp=8, nodes=1, dtype="bf16")
    b = run("gpt2", "dgx-h100", tokens=2e9, options=_options(), dp=64, nodes=8, dtype="bf16")
    assert b.failures["mtbf_s"] == pytest.approx(a.failures["mtbf_s"] / 8)


def test_run_model_is_seeded_and_its_monte_carlo_matches_the_expectation():
    s = simulate("gpt2", "dgx-h100", dp=8, microbatch_size=4, dtype="bf16")
    from dlsim.api.models import as_model
    o = RunOptions(tokens=5e11, node_failures_per_1000_node_days=2000.0, trials=200, seed=4)
    r1 = run_model([(s, 100_000)], as_model("gpt2"), load_profile("dgx-h100"), o)
    r2 = run_model([(s, 100_000)], as_model("gpt2"), load_profile("dgx-h100"), o)
    assert r1.monte_carlo == r2.monte_carlo
    mc = r1.monte_carlo
    assert abs(mc["wall_s_mean"] - r1.wall_s) < 4 * mc["wall_s_stderr"] + 1e-9 * r1.wall_s


@pytest.mark.parametrize("args,needle", [
    (["--tokens", "0"], "token budget"),
    (["--tokens", "1B", "--node-failures-per-1000-node-days", "-2"], "non-negative"),
    (["--tokens", "1B", "--storage-aggregate-write", "0"], "positive"),
])
def test_bad_input_is_one_line_and_exit_1(cli, args, needle):
    code, out, err = cli("run", "gpt2", "-c", "dgx-h100", "--dp", "8", *args)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err


def test_run_and_simulate_tokens_on_the_command_line(cli):
    code, out, err = cli("run", "gpt2", "-c", "dgx-h100", "--dp", "8", "--dtype", "bf16", "--tokens", "2B",
                         "--trials", "20", "--usd-per-gpu-hour", "2")
    assert code == 0, err
    assert "time to train" in out and "goodput" in out and "cost $" in out and "Monte Carlo (20 runs" in out
    code, out, err = cli("simulate", "gpt2", "-c", "dgx-h100", "--dp", "8", "--dtype", "bf16", "--tokens", "2B")
    assert code == 0 and "time to train 2B tokens" in out


def test_storage_tier_without_bandwidth_is_refused(tmp_path):
    src = load_profile("dgx-h100").source
    folder = tmp_path / "p"
    folder.mkdir()
    text = open(src).read().replace("  aggregate_write_gbytes_per_s: 2000", "")
    (folder / "profile.yaml").write_text(text)
    with pytest.raises(SpecError, match="storage.aggregate_write_gbytes_per_s: missing required field"):
        run("gpt2", str(folder), tokens=1e9, options=_options(), dp=8, dtype="bf16")
