"""The evaluator's long pipelines walked through their periodic regime (`dlsim.plan.evaluate.periodic`):
the extended walk equals the walk of every op within 1e-9 of the iteration, across schedules, depths,
micro-batch counts, unequal stages and transfers, and it is taken where it applies."""

from __future__ import annotations

import random

import pytest

import dlsim.plan.evaluate.pipeline as walks
from dlsim.plan.evaluate.pipeline import pipeline_walk


def _case(rng: random.Random, schedule: str, p: int, v: int, shape: str):
    K = p * v
    if shape == "uniform":
        f, b = [1.0] * K, [2.0] * K
    elif shape == "heavy last":  # the output layer and loss on the last stage
        f, b = [1.0] * (K - 1) + [1.3], [2.0] * (K - 1) + [2.6]
    else:
        f = [rng.uniform(0.5, 1.5) for _ in range(K)]
        b = [x * rng.uniform(1.8, 2.2) for x in f]
    c = [rng.choice((0.0, rng.uniform(0.0, 0.2), rng.uniform(0.0, 3.0))) for _ in range(K - 1)]
    return f, b, c


def _error(full, fast) -> float:
    end = max(max(row) for row in full)
    return max(abs(x - y) for a, b in zip(full, fast) for x, y in zip(a, b)) / end


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("interleaved", 2), ("interleaved", 3)])
@pytest.mark.parametrize("shape", ["uniform", "heavy last", "random"])
def test_extended_walk_is_the_full_walk(schedule, v, shape):
    rng = random.Random(f"{schedule}{v}{shape}")
    for p in (2, 4, 8):
        for m in (3 * p, 12 * p, 40 * p + (1 if schedule == "1f1b" else 0)):
            f, b, c = _case(rng, schedule, p, v, shape)
            full = pipeline_walk(schedule, p, m, v, f, b, c, periodic=False)
            assert _error(full, pipeline_walk(schedule, p, m, v, f, b, c)) < 1e-9, (p, m)


def test_a_start_dependent_first_microbatch_is_kept():
    """A `run_op` that times micro-batch 0's forwards its own way (ZeRO-1/2's first gathers) and the
    others from the start time alone: the extension keeps its effect on everything after."""
    p, m, v = 4, 160, 1
    f, b, c = [1.0, 1.0, 1.0, 1.2], [2.0, 2.0, 2.0, 2.5], [0.1, 0.1, 0.1]

    def run_op(r, op, k, t):
        if op.kind == "F" and op.microbatch == 0:
            return max(t, 5.0 * (r + 1)) + f[k]
        return t + (f[k] if op.kind == "F" else b[k])

    full = pipeline_walk("1f1b", p, m, v, (), (), c, run_op, periodic=False)
    assert _error(full, pipeline_walk("1f1b", p, m, v, (), (), c, run_op)) < 1e-9


def test_the_shortcut_walks_few_microbatches(monkeypatch):
    """A long pipeline is walked for a few periods only; a short one op by op."""
    walked = []
    inner = walks.walk_ops

    def spy(schedule, p, m, *rest):
        walked.append(m)
        return inner(schedule, p, m, *rest)

    monkeypatch.setattr(walks, "walk_ops", spy)
    p, v = 8, 1
    f, b, c = [1.0] * 7 + [1.3], [2.0] * 7 + [2.6], [0.05] * 7
    pipeline_walk("1f1b", p, 1024, v, f, b, c)
    assert walked and max(walked) < 64
    walked.clear()
    pipeline_walk("1f1b", p, 12, v, f, b, c)
    assert walked == [12]


def test_evaluator_with_and_without_the_shortcut(monkeypatch):
    """Whole strategies, ZeRO 0-3 (the stream walked pass by pass beside the reductions, including
    streams that fall further behind every period): the same evaluation with the shortcut as without."""
    from collections import Counter
    from dataclasses import replace

    import dlsim.plan.evaluate.pipeline as pipeline_mod
    import dlsim.plan.evaluate.stream as stream_mod
    from dlsim.api.models import as_cluster, as_model
    from dlsim.api.simulate import default_pricers
    from dlsim.plan.evaluate import Evaluator
    from dlsim.plan.scenario import ScenarioBuilder
    from dlsim.plan.search import SearchSpace, candidates

    model = as_model("gpt3-175b", {"layers": 16, "hidden": 512, "heads": 8, "seq_len": 512, "positions": 512})
    cluster = replace(as_cluster("dgx-a100"), nodes=4)
    space = SearchSpace(32, 512, 8, max_microbatch_size=1, recompute=("none",), sequence_parallel=(False,),
                        fixed={"tp": 1, "dtype": "bf16"})
    pool = [s for s in candidates(model, space, Counter()) if s.pp >= 4 and s.num_microbatches >= 8 * s.pp]
    assert len({s.zero for s in pool}) == 4 and {s.schedule for s in pool} == {"1f1b", "interleaved"}

    def evaluations():
        ev = Evaluator.of(ScenarioBuilder(model, cluster, "bf16", default_pricers(cluster)))
        return [ev.evaluate(s) for s in pool]

    fast = evaluations()
    monkeypatch.setattr(pipeline_mod, "periodic_walk", lambda *a: None)
    monkeypatch.setattr(stream_mod, "periodic_walk", lambda *a: None)
    slow = evaluations()
    for a, b in zip(fast, slow):
        assert a.approximate == b.approximate
        for x, y in zip((a.iteration_time_s, *a.breakdown().values()), (b.iteration_time_s, *b.breakdown().values())):
            assert abs(x - y) <= 1e-9 * b.iteration_time_s, a.strategy


def test_an_evaluation_does_not_depend_on_the_evaluations_before():
    """Chunks of alike layers share their step lists across stages and candidates: a candidate's
    gradient buckets and parameter units are those of its own chunks (they name layers by index), so
    an evaluator that timed other candidates first gives the same answer as a fresh one."""
    from collections import Counter
    from dataclasses import replace

    from dlsim.api.models import as_cluster, as_model
    from dlsim.api.simulate import default_pricers
    from dlsim.plan.evaluate import Evaluator
    from dlsim.plan.scenario import ScenarioBuilder
    from dlsim.plan.search import SearchSpace, candidates

    model = as_model("gpt3-175b", {"layers": 16, "hidden": 512, "heads": 4, "seq_len": 256, "positions": 256})
    cluster = replace(as_cluster("dgx-a100"), nodes=8)
    space = SearchSpace(64, 1024, 8, max_microbatch_size=1, recompute=("none",), sequence_parallel=(False,),
                        schedules=("1f1b",), fixed={"tp": 1, "dtype": "bf16"})
    pool = [s for s in candidates(model, space, Counter()) if s.pp > 1 and s.zero == 3]
    assert len({(s.pp, s.num_microbatches) for s in pool}) > 1

    def fresh():
        return Evaluator.of(ScenarioBuilder(model, cluster, "bf16", default_pricers(cluster)))

    shared = fresh()
    for s in pool:
        got, alone = shared.evaluate(s), fresh().evaluate(s)
        assert got.iteration_time_s == alone.iteration_time_s and got.breakdown() == alone.breakdown(), s
