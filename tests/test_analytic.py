"""`simulate --analytic` (`dlsim.api.analytic.estimate_strategy`): the evaluator's answer for one
strategy, held to the event simulation within the tolerance it states, refused where it models
nothing."""

from __future__ import annotations

import json

import pytest

from dlsim.api.analytic import estimate_strategy
from dlsim.api.simulate import simulate
from dlsim.cli import run
from dlsim.errors import SpecError

SMALL = {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 512, "positions": 512}


@pytest.mark.parametrize("fields", [dict(dp=8, global_batch=32), dict(dp=2, tp=2, pp=2, global_batch=16, zero=1),
                                    dict(dp=4, pp=2, global_batch=16, schedule="interleaved", virtual_stages=2),
                                    # Megatron-LM's scatter-gather pipeline transfers: 1/tp of each boundary
                                    # sent, all-gathered over the receiver's tensor-parallel group (flagged:
                                    # the gathers' contention with the tensor-parallel collectives is not timed)
                                    dict(dp=1, tp=8, pp=2, global_batch=16, p2p_scatter_gather=True),
                                    dict(dp=2, tp=8, pp=2, global_batch=32, p2p_scatter_gather=True,
                                         schedule="interleaved", virtual_stages=2)])
def test_the_analytic_estimate_is_within_its_stated_tolerance_of_the_simulation(fields):
    rec = estimate_strategy("gpt2", "dgx-h100", overrides=SMALL, **fields)
    sim = simulate("gpt2", "dgx-h100", overrides=SMALL, **fields)
    assert rec["kind"] == "analytic_estimate" and rec["strategy"] == {**sim.strategy}
    assert abs(rec["iteration_time_s"] / sim.iteration_time_s - 1) <= rec["tolerance"]
    assert rec["peak_memory_bytes"] >= sim.peak_memory_bytes * (1 - 1e-9)
    assert sum(v for k, v in rec["breakdown_s"].items() if k != "total") == pytest.approx(rec["iteration_time_s"])


def test_what_only_the_simulation_models_is_refused(capsys):
    with pytest.raises(SpecError, match="parameter-server"):
        estimate_strategy("gpt2", "dgx-h100", overrides=SMALL, dp=4, sync="ps")
    assert run(["simulate", "gpt2", "-c", "dgx-h100", "--analytic", "--trace", "t.json", "--set", "layers=2"]) == 1
    assert "drop --trace" in capsys.readouterr().err


def test_the_cli_prints_and_records_the_analytic_estimate(capsys):
    assert run(["simulate", "gpt2", "-c", "dgx-h100", "--set", "layers=2", "--dp", "4", "--global-batch", "8",
                "--analytic", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["kind"] == "analytic_estimate" and rec["stack"]["name"] == "pytorch" and rec["tokens_per_s"] > 0
    assert run(["simulate", "gpt2", "-c", "dgx-h100", "--set", "layers=2", "--dp", "4", "--global-batch", "8",
                "--analytic"]) == 0
    assert "analytic estimate (held within 3% of the event simulation)" in capsys.readouterr().out


def test_a_scripts_loaded_objects_keep_their_builder_and_get_the_fresh_numbers():
    """`estimate_strategy` on loaded model and cluster objects keeps their scenario builder across calls
    (`dlsim.api.analytic._KEPT`); every record equals the one a fresh builder gives (by name)."""
    from dlsim.api.analytic import _KEPT
    from dlsim.api.models import as_cluster, as_model

    model, cluster = as_model("gpt2", {"layers": 4}), as_cluster("dgx-a100")
    for fields in ({"pp": 2, "dp": 2, "global_batch": 16}, {"tp": 2, "pp": 2, "global_batch": 16, "zero": 1},
                   {"dp": 4, "global_batch": 16, "zero": 3}):
        fresh = estimate_strategy("gpt2", "dgx-a100", overrides={"layers": 4}, **fields)
        first = estimate_strategy(model, cluster, **fields)
        again = estimate_strategy(model, cluster, **fields)
        assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True) == json.dumps(fresh, sort_keys=True)
    assert any(b.model is model and b.cluster is cluster for b in _KEPT._kept.values())
