"""One simulation per distinct run (`ScenarioBuilder.runs_as`, `dlsim.api.optimize_sims`): selective
recomputation that recomputes nothing (flash attention keeps no score matrix) runs as no
recomputation, task for task; a candidate that runs as another takes its simulation, with its own
strategy in the record, and the candidates simulated and their records are those of one simulation
per candidate."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from dlsim.api.models import as_cluster, as_model
from dlsim.api.optimize_sims import as_run_of, simulate_by_time
from dlsim.api.simulate import _default_pricer, simulate
from dlsim.plan.evaluate import Evaluator
from dlsim.plan.search import SearchSpace, candidates
from dlsim.spec.strategy import make_strategy

SMALL_GPT = {"layers": 4, "hidden": 1024, "heads": 16, "seq_len": 1024, "positions": 1024}
FLASH = ("flash_attention",)


def _setup():
    model, cluster = as_model("gpt3-175b", SMALL_GPT), as_cluster("dgx-a100")
    ev = Evaluator(model, cluster, "bf16", lambda lay, algo: _default_pricer(cluster, lay, algo, False))
    return model, cluster, ev


def test_selective_with_nothing_to_recompute_runs_as_none():
    model, cluster, ev = _setup()
    s = make_strategy(tp=2, pp=2, dp=2, global_batch=16, microbatch_size=1, recompute="selective", fused_kernels=FLASH,
                      dtype="bf16")
    assert ev.builder.runs_as(s) == replace(s, recompute="none")
    unfused = replace(s, fused_kernels=())  # the attention core's score matrix is recomputed
    assert ev.builder.runs_as(unfused) is unfused
    offloaded = replace(s, offload="activations")
    assert ev.builder.runs_as(offloaded) is offloaded
    full = replace(s, recompute="full")
    assert ev.builder.runs_as(full) is full
    # the two runs: the same record but for the strategy's field
    sel, none = (simulate(model, cluster, x).to_dict() for x in (s, replace(s, recompute="none")))
    assert sel["strategy"]["recompute"] == "selective" and none["strategy"]["recompute"] == "none"
    assert {k for k in sel if sel[k] != none[k]} == {"strategy"}
    twin = as_run_of(simulate(model, cluster, replace(s, recompute="none")), replace(s, recompute="none"), s)
    assert twin.to_dict() == sel


def test_one_simulation_per_run_changes_no_record():
    model, cluster, ev = _setup()
    space = SearchSpace(8, 16, 8, max_microbatch_size=2,
                        fixed={"fused_kernels": FLASH, "dtype": "bf16", "schedule": "1f1b", "zero": 0})
    pool = [s for s in candidates(model, space, Counter()) if s.recompute in ("none", "selective")][:40]
    evals = [ev.evaluate(s) for s in pool]
    shared = simulate_by_time(model, cluster, evals, 4, 8, False, 1, ev.builder.runs_as)
    alone = simulate_by_time(model, cluster, evals, 4, 8, False, 1, lambda s: s)
    assert sum(e.strategy.recompute == "selective" for e, _ in alone) >= 2  # twins among the simulated
    assert [(e.strategy, r.to_dict()) for e, r in shared] == [(e.strategy, r.to_dict()) for e, r in alone]
