"""Steady-state extension (dlsim.sim.steady) against the full event simulation: deep 1F1B pipelines
simulated for a few steady periods and extended give the same record as simulating every
micro-batch, within float rounding (1e-9 relative; the record's `events`, the work the simulator
did, and its notes aside)."""

from __future__ import annotations

import pytest

import dlsim.sim.scenario_run as api  # the event clock of a scenario: its steady shortcut and graph run
from dlsim.api.simulate import run_simulation, simulate

RTOL = 1e-9


def _close(a, b, path=""):
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert abs(a - b) <= RTOL * max(1.0, abs(b)), (path, a, b)
    else:
        assert a == b, (path, a, b)


def _record(result) -> dict:
    d = result.to_dict()
    sim = d.get("simulation", d)
    sim.pop("events", None)
    sim.pop("notes", None)
    d.pop("notes", None)
    return d


def _full(monkeypatch, *args, **kwargs):
    with monkeypatch.context() as m:
        m.setattr(api, "simulate_steady", lambda x, info: None)
        return simulate(*args, **kwargs)


MEGATRON_2022 = dict(fused_kernels=("scale_mask_softmax", "strided_attention", "bias_dropout_add"),
                     tp_async_backward=True)
CASES = [
    dict(pp=4, tp=2, dp=2, num_microbatches=48, recompute="full"),
    dict(pp=4, tp=1, dp=4, num_microbatches=60, recompute="none"),
    dict(pp=4, tp=2, dp=1, num_microbatches=60, recompute="selective"),
    dict(pp=6, tp=2, dp=1, num_microbatches=60, recompute="selective"),
    dict(pp=4, tp=2, dp=2, num_microbatches=48, zero=1),
    dict(pp=4, tp=2, dp=2, num_microbatches=48, overlap=False),
    # Megatron-LM 2022's stack (benchmarks/validate_published.py): asynchronous tensor-parallel backward
    # communication beside the kernels, sequence parallelism, stated fused kernels (reduced to about 2·pp
    # micro-batches, pp dividing the periods left: dlsim.sim.steady.reduced_microbatches; they extend
    # exactly since priced collectives arbitrate port ties as the full simulation does)
    dict(pp=4, tp=2, dp=1, num_microbatches=60, recompute="selective", sequence_parallel=True, **MEGATRON_2022),
    dict(pp=4, tp=4, dp=1, num_microbatches=64, recompute="full", sequence_parallel=True, **MEGATRON_2022),
    dict(pp=6, tp=2, dp=1, num_microbatches=90, recompute="selective", sequence_parallel=True, **MEGATRON_2022),
    # period of 2 micro-batches (overlapped collectives and stage-to-stage sends share the NVLink ports)
    dict(pp=6, tp=2, dp=1, num_microbatches=90, recompute="full", **MEGATRON_2022),
    dict(pp=4, tp=2, dp=1, num_microbatches=60, recompute="selective", sequence_parallel=True),
    # ZeRO-3: parameter gathers and gradient reduce-scatters every pass, on one communication stream
    dict(pp=4, tp=2, dp=2, num_microbatches=48, recompute="full", zero=3),
]
KW = dict(overrides={"layers": 12}, nodes=8, microbatch_size=1, schedule="1f1b")


def _extended(result) -> bool:
    return any("steady-state extension" in n for n in result.notes)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_extension_equals_full_simulation(monkeypatch, case):
    """Where the periodicity check passes the record is extended, else the full simulation answers:
    the same record either way."""
    fast = simulate("megatron-gpt-1.7b", "dgx-a100", **KW, **case)
    full = _full(monkeypatch, "megatron-gpt-1.7b", "dgx-a100", **KW, **case)
    assert not _extended(full)
    if _extended(fast):
        assert fast.events < full.events
    _close(_record(fast), _record(full))


def test_extension_applies_to_uniform_pipelines():
    applied = [_extended(simulate("megatron-gpt-1.7b", "dgx-a100", **KW, **case)) for case in CASES]
    assert sum(applied) >= 4, applied


@pytest.mark.slow  # about 20 s alone (a full pp-64 simulation); .ci/run runs it
def test_megatron_1t_extension_equals_full_simulation(monkeypatch):
    """The benchmark's deep pipeline (pp 64) with fewer micro-batches, so that the full run stays short."""
    kwargs = dict(nodes=384, tp=8, pp=64, dp=6, microbatch_size=1, num_microbatches=270, schedule="1f1b",
                  recompute="full")
    fast = simulate("megatron-gpt-1t", "dgx-a100", **kwargs)
    _close(_record(fast), _record(_full(monkeypatch, "megatron-gpt-1t", "dgx-a100", **kwargs)))


INTERLEAVED = [
    # the first two: a transfer's all-gather and a backward kernel of one device request its port at one
    # instant in the cool-down, from two chains whose times only their last bits tell apart
    # (`dlsim.sim.ties`): simulated in full
    dict(virtual_stages=3, pp=4, tp=2, dp=2, num_microbatches=64, recompute="full"),
    dict(virtual_stages=3, pp=4, tp=2, dp=1, num_microbatches=96, recompute="selective"),
    dict(virtual_stages=2, pp=6, tp=2, dp=1, num_microbatches=96, recompute="none"),
    dict(virtual_stages=2, pp=4, tp=2, dp=2, num_microbatches=64, zero=1, pipeline_split="balanced"),
    dict(virtual_stages=2, pp=4, tp=2, dp=2, num_microbatches=64, zero=3, pipeline_split="balanced"),
    # asynchronous tensor-parallel backward communication (Megatron-LM 2022)
    dict(virtual_stages=2, pp=4, tp=2, dp=2, num_microbatches=64, zero=1, pipeline_split="balanced", **MEGATRON_2022),
]  # 12 blocks on 8 chunks: not Megatron's uniform split (the model's stack), balanced by cost


@pytest.mark.parametrize("case", INTERLEAVED, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_interleaved_extension_equals_full_simulation(monkeypatch, case):
    """The interleaved schedule repeats every pp micro-batches (all chunks of each): extended by whole
    periods of pp micro-batches where no near-tie lies past the cut, the same record as the full
    simulation either way."""
    kw = dict(KW, schedule="interleaved")
    fast = simulate("megatron-gpt-1.7b", "dgx-a100", **kw, **case)
    full = _full(monkeypatch, "megatron-gpt-1.7b", "dgx-a100", **kw, **case)
    if _extended(fast):
        assert fast.events < full.events
    _close(_record(fast), _record(full))


def test_interleaved_extension_applies_where_no_tie_lies_past_the_cut():
    applied = [_extended(simulate("megatron-gpt-1.7b", "dgx-a100", **dict(KW, schedule="interleaved"), **case))
               for case in INTERLEAVED]
    assert applied == [False, False, True, True, True, True]


def test_few_microbatches_beyond_the_reduced_count_are_extended(monkeypatch):
    """A third of the micro-batches left unsimulated is enough to try the extension (pp 4, 18
    micro-batches: 12 simulated; a pipeline of 128 stages and 256 micro-batches is simulated for 136)."""
    kwargs = dict(overrides={"layers": 12}, nodes=8, microbatch_size=1, schedule="1f1b", pp=4, tp=2, dp=1,
                  num_microbatches=18, stack="eager")
    fast = simulate("megatron-gpt-1.7b", "dgx-a100", **kwargs)
    assert _extended(fast)
    _close(_record(fast), _record(_full(monkeypatch, "megatron-gpt-1.7b", "dgx-a100", **kwargs)))


def test_trace_and_other_schedules_run_in_full():
    kwargs = dict(overrides={"layers": 12}, nodes=8, microbatch_size=1, pp=4, tp=2, dp=2, num_microbatches=48)
    traced = run_simulation("megatron-gpt-1.7b", "dgx-a100", schedule="1f1b", trace=True, **kwargs)
    assert traced.trace is not None
    assert not any("steady-state extension" in n for n in traced.result.notes)
    gpipe = simulate("megatron-gpt-1.7b", "dgx-a100", schedule="gpipe", **kwargs)
    assert not any("steady-state extension" in n for n in gpipe.notes)


def _inputs(monkeypatch, **case):
    """The IterationInputs `simulate` builds for `case` (megatron-gpt-1.7b, 12 layers, dgx-a100)."""
    seen = []
    with monkeypatch.context() as m:
        m.setattr(api, "simulate_steady", lambda x, info: seen.append(x))
        run_simulation("megatron-gpt-1.7b", "dgx-a100", **KW, **case)
    return seen[0]


def _by_key(graph):
    """Task id by (stream, label, how many tasks of that label came before it on the stream)."""
    out, seen = {}, {}
    for t in graph.tasks:
        n = seen.get((t.stream, t.label), 0)
        seen[(t.stream, t.label)] = n + 1
        out[(t.stream, t.label, n)] = t.tid
    return out


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[3], dict(pp=4, tp=2, dp=2, num_microbatches=48, zero=3)],
                         ids=["full-recompute", "dp4", "pp6", "zero3"])
def test_reduced_run_is_the_longer_run_before_divergence(monkeypatch, case):
    """Every task of the m1-micro-batch run that ends before `divergence` starts and ends exactly when
    its counterpart does in a run of more micro-batches (and one starting before it starts then): the
    periodicity check, held below that time, looks at the full run's own timeline."""
    from dataclasses import replace

    from dlsim.plan.iteration import build_iteration
    from dlsim.sim.engine import execute
    from dlsim.sim.steady import divergence

    x = _inputs(monkeypatch, **case)
    p = x.strategy.pp
    runs = []
    for m in (p + 6, p + 11):
        graph = build_iteration(replace(x, strategy=replace(x.strategy, num_microbatches=m)))
        runs.append((graph, execute(graph)))
    (g1, t1), (g2, t2) = runs
    limit = divergence(g1, t1, p, p + 6)
    assert 0.5 * t1.makespan < limit < t1.makespan
    other = _by_key(g2)
    checked = 0
    for key, tid in _by_key(g1).items():
        if t1.start[tid] < limit:
            twin = other[key]
            assert t1.start[tid] == t2.start[twin], key
            if t1.end[tid] < limit:
                assert t1.end[tid] == t2.end[twin], key
                checked += 1
    assert checked > len(g1.tasks) // 2


def test_counts_tried_smallest_first(monkeypatch):
    """pp + FIRST_MARGIN micro-batches first; the larger count only where no cut passed before the divergence."""
    import dlsim.sim.steady as steady

    tried = []
    real = steady.build_iteration
    monkeypatch.setattr(steady, "build_iteration", lambda x: (tried.append(x.strategy.num_microbatches), real(x))[1])
    assert _extended(simulate("megatron-gpt-1.7b", "dgx-a100", **KW, **CASES[0], stack="eager"))
    assert tried == [4 + steady.FIRST_MARGIN]
    tried.clear()
    # where the first count finds no cut (refused here), the second count
    real_extend = steady.extend
    refused = []
    monkeypatch.setattr(steady, "extend", lambda *a, **k: refused.append(1) if not refused else real_extend(*a, **k))
    assert _extended(simulate("megatron-gpt-1.7b", "dgx-a100", **KW, **CASES[0], stack="eager"))
    assert tried == [4 + steady.FIRST_MARGIN, 4 + 1 + steady.MARGIN]


@pytest.mark.slow  # about 30 s alone (a full ZeRO-3 GPT-3 175B simulation); .ci/run runs it
def test_zero3_pipeline_extended_from_its_longer_count(monkeypatch):
    """A ZeRO-3 pipeline whose communication backlog outlasts both short counts is extended from
    ZERO3_DEPTHS·pp micro-batches, and equals the full simulation."""
    import dlsim.sim.steady as steady

    tried = []
    real = steady.build_iteration
    monkeypatch.setattr(steady, "build_iteration", lambda x: (tried.append(x.strategy.num_microbatches), real(x))[1])
    kwargs = dict(nodes=128, tp=8, pp=8, dp=16, microbatch_size=1, num_microbatches=96, schedule="1f1b",
                  recompute="full", sequence_parallel=True, zero=3)
    fast = simulate("gpt3-175b", "dgx-a100", **kwargs)
    assert _extended(fast) and tried[-1] == steady.ZERO3_DEPTHS * 8
    _close(_record(fast), _record(_full(monkeypatch, "gpt3-175b", "dgx-a100", **kwargs)))


def test_no_cut_past_the_divergence(monkeypatch):
    """A window reaching past `divergence` is never accepted, however periodic it looks."""
    from dataclasses import replace

    from dlsim.plan.iteration import build_iteration
    from dlsim.sim.engine import execute
    from dlsim.sim.steady import divergence, extend

    seen = []
    with monkeypatch.context() as m:
        m.setattr(api, "simulate_steady", lambda x, info: seen.append((x, info)))
        run_simulation("megatron-gpt-1.7b", "dgx-a100", **KW, **CASES[0], pipeline_split="balanced")
    x, info = seen[0]  # (the cut of 38 tasks and 4 micro-batches found on this partition)
    graph = build_iteration(replace(x, strategy=replace(x.strategy, num_microbatches=10)))
    tl = execute(graph)
    assert extend(graph, tl, info, 38, 4, divergence(graph, tl, 4, 10)) is not None
    assert extend(graph, tl, info, 38, 4, 0.0) is None


def test_zigzag_critical_path_is_repeated_by_its_stride(monkeypatch):
    """GPT-3's layers on 8 stages with Megatron-LM 2022's asynchronous tensor-parallel backward: the
    critical path runs micro-batch i forward through every stage and back, then the first stage's
    forward of i + 8, so it returns to a counterpart of itself only pp = 8 periods later. The reduced
    run (24 of 40 micro-batches: 8 divides the 16 periods left) repeats that segment twice: the full
    simulation's record."""
    import dlsim.sim.steady as steady

    strides = []
    real = steady._segment
    monkeypatch.setattr(steady, "_segment", lambda *a: (lambda r: (strides.append(r and r[2]), r)[1])(real(*a)))
    kwargs = dict(overrides={"layers": 16}, nodes=16, tp=8, pp=8, dp=2, global_batch=80, microbatch_size=1,
                  recompute="selective", stack="megatron-lm-2022", schedule="1f1b")
    fast = simulate("gpt3-175b", "dgx-a100", **kwargs)
    assert _extended(fast) and strides[-1] == 8
    full = _full(monkeypatch, "gpt3-175b", "dgx-a100", **kwargs)
    assert fast.events < full.events
    _close(_record(fast), _record(full))
