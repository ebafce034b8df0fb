"""optimize's space with context parallelism, hybrid sharding, offload and FP8: candidates, the
evaluator against the simulation, an end-to-end search."""

from __future__ import annotations

from collections import Counter

import pytest

from dlsim.api.models import as_cluster, as_model
from dlsim.api.optimize import optimize
from dlsim.api.simulate import _default_pricer, simulate
from dlsim.errors import SpecError
from dlsim.plan.evaluate import Evaluator
from dlsim.plan.search import SearchSpace, candidates
from dlsim.spec.strategy import make_strategy

TINY = {"layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 4, "ffn_hidden": 4096, "seq_len": 4096, "vocab": 1000}


def test_candidates_span_the_new_dimensions():
    model = as_model("llama3-8b", dict(TINY, seq_len=4100))  # 4100 = 4 x 1025: cp 2 splits it, cp 4 does not
    space = SearchSpace(16, 16, 8, cp=(1, 2, 4), hybrid_shard=(False, True), offload=("none", "optimizer"),
                        fixed={"tp": 2, "recompute": "none", "sequence_parallel": True})
    dropped = Counter()
    got = list(candidates(model, space, dropped))
    assert {s.cp for s in got} == {1, 2}
    assert dropped["cp does not split the sequence into 2 x cp chunks"] > 0
    assert all(s.devices == 16 and s.dp == 16 // (2 * s.pp * s.cp) for s in got)
    assert any(s.hybrid_shard and s.zero for s in got) and not any(s.hybrid_shard and not s.zero for s in got)
    assert {s.offload for s in got} == {"none", "optimizer"}
    plain = list(candidates(model, SearchSpace(16, 16, 8, fixed=space.fixed), Counter()))
    assert all(s.cp == 1 and not s.hybrid_shard and s.offload == "none" for s in plain)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("fields", [dict(dp=2, tp=2, pp=2, cp=1), dict(dp=2, tp=1, pp=2, cp=2),
                                    dict(dp=2, tp=2, pp=1, cp=2, zero=1)])
def test_evaluator_follows_the_simulation(dtype, fields):
    model, cluster = as_model("llama3-8b", TINY), as_cluster("dgx-h100")
    ev = Evaluator(model, cluster, dtype, lambda lay, algo: _default_pricer(cluster, lay, algo, False))
    s = make_strategy(microbatch_size=1, num_microbatches=4, dtype=dtype, **fields)
    e = ev.evaluate(s)
    r = simulate(model, cluster, s, measured=False, nodes=2)
    assert e.iteration_time_s == pytest.approx(r.iteration_time_s, rel=0.02)
    assert e.peak_memory_bytes == pytest.approx(r.peak_memory_bytes, rel=0.02)
    assert not any("context" in a for a in e.approximate)


def test_optimize_searches_context_parallel_and_fp8():
    r = optimize("llama3-8b", "dgx-h100", gpus=16, global_batch=8, overrides=TINY, cp=(1, 2),
                 fix=["dtype=fp8", "tp=2", "pp=1", "recompute=none", "zero=1"], top=2, jobs=1, max_simulations=4,
                 stack="eager")
    d = r.to_dict()
    assert d["space"]["cp"] == [1, 2]
    assert {row["strategy"]["cp"] for row in d["ranked"]} == {1, 2}
    assert any("cp2" in row["label"] for row in d["ranked"])
    assert d["dtype"] == "fp8"


def test_optimize_refuses_bad_dimensions():
    with pytest.raises(SpecError, match="context-parallel"):
        optimize("llama3-8b", "dgx-h100", gpus=8, global_batch=8, overrides=TINY, cp=(0,))
    with pytest.raises(SpecError, match="offload"):
        optimize("llama3-8b", "dgx-h100", gpus=8, global_batch=8, overrides=TINY, offload=("disk",))
