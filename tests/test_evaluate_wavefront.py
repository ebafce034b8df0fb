"""The schedule's dependency structure walked (`dlsim.plan.evaluate.wavefront`) equals the op-by-op walk
to the bit: op by op over the structure, level by level in numpy, and with a caller timing each op."""

import random

import pytest

from dlsim.plan.evaluate import pipeline as P
from dlsim.plan.evaluate import wavefront as W
from dlsim.plan.pipeline import FORWARD

CASES = [("1f1b", 16, 40, 1), ("interleaved", 8, 24, 3), ("gpipe", 6, 10, 1), ("1f1b", 32, 24, 1)]


def _times(p: int, v: int, seed: int) -> tuple[list[float], list[float], list[float]]:
    rng = random.Random(seed)
    K = p * v
    return ([rng.uniform(0.5, 2.0) for _ in range(K)], [rng.uniform(1.0, 4.0) for _ in range(K)],
            [rng.uniform(0.0, 0.3) for _ in range(K - 1)])


def _op_by_op(monkeypatch, *args):
    """`walk_ops` with no structure to walk (its own op-by-op search)."""
    with monkeypatch.context() as mp:
        mp.setattr(P, "reused_structure", lambda *a: None)
        return P.walk_ops(*args)


@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_structure_walks_equal_the_op_by_op_walk(monkeypatch, schedule, p, m, v):
    f, b, c = _times(p, v, p * m)
    want = _op_by_op(monkeypatch, schedule, p, m, v, f, b, c, None, True)
    st = W.structure.__wrapped__(schedule, p, m, v)  # a fresh one: walked op by op first
    E = W.walk(st, f, b, c)
    assert "levels" not in st.__dict__
    assert [[E[j] for j in ids] for ids in st.last] == want[0]
    assert [E[st.offsets[r]:st.offsets[r + 1]] for r in range(p)] == want[1]
    st.walks[0] = W.VECTOR_AFTER  # from now on level by level where the levels pay
    assert W.walk(st, f, b, c) == E


def test_levels_walk_equals_the_op_by_op_one():
    st = W.structure.__wrapped__("1f1b", 128, 200, 1)  # about 80 ops per level
    f, b, c = _times(128, 1, 7)
    scalar = W.walk(st, f, b, c)
    st.walks[0] = W.VECTOR_AFTER
    assert st.vectorised
    assert W.walk(st, f, b, c) == scalar


@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_timed_structure_walk_equals_the_op_by_op_one(monkeypatch, schedule, p, m, v):
    f, b, c = _times(p, v, 3 * p + m)

    def run_op(r, op, k, t):  # the first micro-batch's forwards depend on when they start
        if op.kind == FORWARD and op.microbatch == 0:
            return t + f[k] + max(0.0, 2.5 - t) * 0.4
        return t + (f[k] if op.kind == FORWARD else b[k])

    want = _op_by_op(monkeypatch, schedule, p, m, v, (), (), c, run_op, True)
    st = W.structure(schedule, p, m, v)
    E = P._walk_timed(st, schedule, p, m, v, c, run_op)
    assert [[E[j] for j in ids] for ids in st.last] == want[0]
    assert [E[st.offsets[r]:st.offsets[r + 1]] for r in range(p)] == want[1]
