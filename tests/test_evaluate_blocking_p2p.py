"""The analytic evaluator times blocking pipeline exchanges (`p2p_overlap` off, the megatron-lm stacks'
Megatron-LM default) as the simulation does: a pass's send holds its stage until it is done
(`dlsim.plan.evaluate.timing.Timing._blocking_sends`, `dlsim.plan.p2pplan`)."""

from __future__ import annotations

import pytest

from dlsim.api.analytic import estimate_strategy
from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import simulate

SMALL = {"layers": 8, "hidden": 256, "heads": 4, "seq_len": 128, "positions": 128}


@pytest.mark.parametrize("schedule,v,m", [("1f1b", 1, 8), ("1f1b", 1, 64), ("interleaved", 2, 8),
                                          ("interleaved", 2, 64), ("gpipe", 1, 6)])
def test_blocking_exchanges_cost_what_the_simulation_says(schedule, v, m):
    model, cluster = as_model("gpt2", SMALL), as_cluster("dgx-a100")
    fields = {"dp": 1, "tp": 1, "pp": 4, "microbatch_size": 2, "num_microbatches": m, "schedule": schedule,
              "virtual_stages": v, "stack": "eager", "pipeline_split": "balanced"}
    times = {}
    for overlap in (True, False):
        est = estimate_strategy(model, cluster, p2p_overlap=overlap, **fields)
        sim = simulate(model, cluster, p2p_overlap=overlap, **fields)
        assert not est["approximate"]
        assert est["iteration_time_s"] == pytest.approx(sim.iteration_time_s, rel=1e-9), overlap
        times[overlap] = sim.iteration_time_s
    assert times[False] > times[True]  # the sends now hold the stages
