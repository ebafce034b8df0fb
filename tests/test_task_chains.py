"""A pass instantiated again as a chain (`TaskGraph.add_chain`, read from what its first micro-batch
made: `dlsim.plan.iteration._Builder._chain`) makes the same tasks, field for field, as building every
micro-batch's pass step by step (`emit`)."""

from __future__ import annotations

import dataclasses

import pytest

import dlsim.plan.iteration as iteration
from simkit import captured_graph

CASES = [
    # plain passes, data-parallel buckets, selective recomputation, ZeRO-1
    dict(model="gpt2", cluster="dgx-a100", tp=2, pp=2, dp=2, global_batch=16, microbatch_size=2,
         recompute="selective", zero=1),
    # tensor-parallel collectives inside every pass (priced alone, holding their ports), the model's stack
    dict(model="megatron-gpt-1.7b", cluster="dgx-a100", overrides={"layers": 8}, tp=2, pp=2, dp=2,
         global_batch=16, microbatch_size=1, recompute="full"),
    # a convolutional network, no tensor parallelism
    dict(model="vgg16", cluster="dgx-h100", tp=1, pp=2, dp=4, global_batch=64, microbatch_size=4),
]


def _fields(graph) -> list[tuple]:
    return [tuple(getattr(t, f.name) for f in dataclasses.fields(t)) for t in graph.tasks]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["model"])
def test_chains_make_the_tasks_emit_makes(monkeypatch, case):
    kw = dict(case)
    model, cluster = kw.pop("model"), kw.pop("cluster")
    chained = captured_graph(monkeypatch, model, cluster, **kw)
    made = [0]
    real = iteration._Builder._chain

    def counted(self, steps, pos):
        got = real(self, steps, pos)
        made[0] += got is not None
        return got
    with monkeypatch.context() as m:
        m.setattr(iteration._Builder, "_chain", counted)
        captured_graph(monkeypatch, model, cluster, **kw)
    assert made[0] > 0  # the case does replay passes as chains
    with monkeypatch.context() as m:
        m.setattr(iteration._Builder, "_chain", lambda self, steps, pos: None)
        stepwise = captured_graph(monkeypatch, model, cluster, **kw)
    assert len(chained.tasks) == len(stepwise.tasks)
    assert _fields(chained) == _fields(stepwise)
    assert chained.orders == stepwise.orders
