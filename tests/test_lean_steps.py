"""The pass templates' lean form (`dlsim.plan.templates`, `lean=True`: the tuples the analytic evaluator
keeps, made without making `Step`s) equals the `Step`s the simulator's templates make, field by field
(`lean` below: the positions of `dlsim.plan.evaluate.leansteps`), for every
kind of step the templates make: tensor-parallel collectives and asynchronous backward overlaps,
chunked GEMMs beside their collectives, expert-parallel all-to-alls, context-parallel rings, spatial
halos, bucket splits, parameter units with FSDP2's copy-out."""

from __future__ import annotations

import pytest

from dlsim.api.simulate import prepare
from dlsim.plan.evaluate import Evaluator
from dlsim.plan.templates import backward_steps, forward_steps, op_recompute_steps, selective_recompute_steps

SMALL = {"layers": 2, "hidden": 1024, "heads": 16, "seq_len": 1024, "positions": 1024}
MOE = {"layers": 2, "seq_len": 512, "hidden": 1024, "heads": 8, "kv_heads": 2, "ffn_hidden": 1024, "vocab": 4096}



def lean(steps) -> list[tuple]:
    """`steps` in the evaluator's lean form (`dlsim.plan.evaluate.leansteps`: kind, kernel seconds, the
    collective's op, bytes and messages (None, 0 and () without one), group, buckets, unit, slowdown)."""
    out = []
    for st in steps:
        c = st.collective
        op, nbytes, messages = (None, 0.0, ()) if c is None else (c.op, c.nbytes, c.messages)
        out.append((st.kind, st.duration, op, nbytes, messages, st.group, st.buckets, st.unit, st.slowdown))
    return out


@pytest.mark.parametrize("model, cluster, fields", [
    ("gpt3-175b", "dgx-a100", dict(overrides=SMALL, dp=2, tp=2, pp=2, num_microbatches=2, tp_async_backward=True)),
    ("gpt3-175b", "dgx-h100", dict(overrides=SMALL, dp=2, tp=2, sequence_parallel=True, tp_comm_overlap=True)),
    ("mixtral-8x7b", "dgx-h100", dict(overrides=MOE, dp=4, ep=2)),
    ("llama3-8b", "dgx-h100", dict(overrides={"layers": 2}, cp=2, dtype="bf16")),
    ("resnet18", "dgx1-v100", dict(spatial=4, stack="eager")),
])
def test_lean_templates_equal_the_steps_made_lean(model, cluster, fields):
    p = prepare(model, cluster, microbatch_size=1, **fields)
    ev = Evaluator.of(p.builder)
    s = p.strategy
    t = ev.strategy_table(s)
    for a, b in ev.ranges(s, t):
        es = t.entries[a:b]
        ready = {e.index: (j,) for j, e in enumerate(es[::3])}
        units = {e.index: i // 3 for i, e in enumerate(es)}
        lead = {0: 1e-4, 1: 2e-4}
        for tp in {1, s.tp}:
            assert forward_steps(es, tp, lean=True) == lean(forward_steps(es, tp))
            assert forward_steps(es, tp, "recompute", units, lead, lean=True) == \
                lean(forward_steps(es, tp, "recompute", units, lead))
            for overlap in (False, True):
                assert backward_steps(es, tp, ready, overlap=overlap, lean=True) == \
                    lean(backward_steps(es, tp, ready, overlap=overlap))
                assert backward_steps(es, tp, ready, units, overlap, lead, lean=True) == \
                    lean(backward_steps(es, tp, ready, units, overlap, lead))
        assert selective_recompute_steps(es, lean=True) == lean(selective_recompute_steps(es))
        assert op_recompute_steps(es, ev.instance, lean=True) == lean(op_recompute_steps(es, ev.instance))
