"""The mechanisms software stacks switch on, each held to its closed form (`dlsim.plan.zero`):
parameter gathers prefetched one unit ahead (FSDP2's implicit prefetch), ZeRO-1/2's updated
parameters gathered beside the next forward pass, all dispatched when the step ends (NeMo's
distributed Adam, overlap_param_sync), the gradient buffer reduced in fp32."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import run_simulation, simulate
from dlsim.plan.comm import Layout
from dlsim.plan.commcost import ClusterPricer
from dlsim.plan.gradbuckets import gradient_buckets
from dlsim.plan.layertable import build_layer_table
from dlsim.plan.templates import forward_steps, units_of
from dlsim.spec.strategy import make_strategy

SMALL = {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 512, "positions": 512}
DP = 8


def _setup():
    model = as_model("gpt2", SMALL)
    cluster = as_cluster("dgx-h100")
    cluster = replace(cluster, device=replace(cluster.device, overlap_slowdown=0.0))  # no slowdown: exact
    return model, cluster


def _units(model, cluster, **fields):
    """Per parameter unit in forward order: (forward seconds of micro-batch 0, all-gather seconds)."""
    s = make_strategy(dp=DP, microbatch_size=1, num_microbatches=2, stack="eager", **fields)
    entries = build_layer_table(model, cluster.device, "fp32", batch=1, tp=1)
    buckets = gradient_buckets(entries, s, "fp32", lambda e: e.params > 0)
    steps = forward_steps(entries, 1, unit_of=units_of(entries, buckets))
    order = list(dict.fromkeys(st.unit for st in steps if st.unit >= 0))
    compute = {u: sum(st.duration for st in steps if st.unit == u) for u in order}
    lead = sum(st.duration for st in steps[:next(i for i, st in enumerate(steps) if st.unit >= 0)])
    pricer = ClusterPricer(cluster, Layout(DP, 1, 1, cluster.devices_per_node), "auto")
    ranks = list(range(DP))
    gathers = {u: pricer.collective("allgather", buckets[u].gather_nbytes, ranks).seconds for u in order}
    return lead, [(compute[u], gathers[u]) for u in order], pricer, ranks, entries


def prefetch_walk(units: list[tuple[float, float]], start: float = 0.0) -> float:
    """Closed form of a pass whose units are gathered one ahead: the first two gathers issued at the
    pass's start, unit j+1's once unit j starts, one after another; each unit waits for its own:
    G_q = max(G_{q-1}, issue_q) + g_q, start_j = max(end_{j-1}, G_j), end_j = start_j + f_j."""
    ready, busy, now = {}, start, start
    for j in range(len(units)):
        for q in range(j, min(len(units), j + 2)):
            if q not in ready:
                busy = max(busy, start if q <= 1 else now) + units[q][1]
                ready[q] = busy
        now = max(now, ready[j]) + units[j][0]
    return now


def test_zero3_gathers_are_prefetched_one_unit_ahead():
    """The first forward pass of a ZeRO-3 iteration ends where the prefetch closed form says, and
    earlier than gathering each unit only when it is reached."""
    model, cluster = _setup()
    lead, units, _, _, _ = _units(model, cluster, zero=3)
    sim = run_simulation(model, cluster, dp=DP, zero=3, microbatch_size=1, num_microbatches=2, stack="eager",
                         dtype="fp32", trace=True, trace_ranks="0")
    tasks = [e for e in sim.trace["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("F ")
             and e["name"].endswith("mb0") and e.get("pid") == 1]  # trace process ids count ranks from 1
    end = max(e["ts"] + e["dur"] for e in tasks) / 1e6
    assert end == pytest.approx(prefetch_walk(units) + lead, rel=1e-6, abs=1e-9)
    unprefetched = sum(f + g for f, g in units) + lead
    assert end < unprefetched


def dispatched_walk(units: list[tuple[float, float]]) -> float:
    """Closed form of a pass whose units' gathers were all dispatched at its start, one after
    another: R_j = g_0 + ... + g_j, start_j = max(end_{j-1}, R_j), end_j = start_j + f_j."""
    ready = now = 0.0
    for f, g in units:
        ready += g
        now = max(now, ready) + f
    return now


def test_updated_parameters_gathered_beside_the_next_forward():
    """ZeRO-1 with param_gather_overlap: the iteration loses the all-gather after the step and gains
    only what micro-batch 0's forward waits for (the dispatched closed form less its compute)."""
    model, cluster = _setup()
    lead, units, pricer, ranks, entries = _units(model, cluster, zero=1)
    plain = simulate(model, cluster, dp=DP, zero=1, microbatch_size=1, num_microbatches=2, stack="eager", dtype="fp32")
    over = simulate(model, cluster, dp=DP, zero=1, microbatch_size=1, num_microbatches=2, stack="eager", dtype="fp32",
                    param_gather_overlap=True)
    end_gather = pricer.collective("allgather", sum(e.params for e in entries) * 4, ranks).seconds
    exposed = dispatched_walk(units) - sum(f for f, _ in units)
    assert over.iteration_time_s - plain.iteration_time_s == pytest.approx(exposed - end_gather, rel=1e-6, abs=1e-9)
    assert over.iteration_time_s < plain.iteration_time_s


def test_fp32_reduction_doubles_the_bf16_gradient_bytes():
    """grad_reduce_dtype fp32 (FSDP2, PyTorch DDP under autocast): the buckets' bytes and the gradient
    memory are those of fp32 gradients, the gathered parameters stay bf16."""
    model, cluster = _setup()
    kw = dict(dp=DP, zero=3, microbatch_size=1, num_microbatches=1, stack="eager", dtype="bf16")
    bf16 = simulate(model, cluster, **kw)
    fp32 = simulate(model, cluster, grad_reduce_dtype="fp32", **kw)
    params = model.params
    gb = lambda r: r.devices[0].memory["gradients"]  # noqa: E731
    assert gb(fp32) == pytest.approx(2 * gb(bf16), rel=1e-9)
    assert gb(bf16) == pytest.approx(params * 2 / DP, rel=1e-9)
    assert fp32.iteration_time_s > bf16.iteration_time_s


def test_zero1_allreduce_prices_the_whole_buffer_on_both_clocks(monkeypatch):
    """zero_grad_reduce allreduce (DeepSpeed 0.6.5's BF16_Optimizer): ZeRO-1's gradient buckets are
    all-reduced whole after the flush; the reduction the simulation runs is the all-reduce closed form
    of each bucket, one after another (it replaces the reduce-scatter's), and the evaluator agrees."""
    from simkit import captured_graph

    from dlsim.api.simulate import _default_pricer
    from dlsim.io.kernel_tables import load_kernel_times
    from dlsim.plan.evaluate import Evaluator
    model, cluster = _setup()
    kw = dict(dp=DP, zero=1, microbatch_size=1, num_microbatches=2, stack="eager", dtype="fp32", overlap=False)
    rs = simulate(model, cluster, **kw)
    ar = simulate(model, cluster, zero_grad_reduce="allreduce", **kw)
    s = make_strategy(**kw)
    entries = build_layer_table(model, cluster.device, "fp32", batch=1, tp=1)
    nbytes = [b.nbytes for b in gradient_buckets(entries, s, "fp32", lambda e: e.params > 0)]
    pricer = ClusterPricer(cluster, Layout(DP, 1, 1, cluster.devices_per_node), "auto")
    ranks = list(range(DP))
    closed = {op: sum(pricer.collective(op, n, ranks).seconds for n in nbytes) for op in ("allreduce", "reduce_scatter")}
    g = captured_graph(monkeypatch, model, cluster, zero_grad_reduce="allreduce", **kw)
    syncs = [t for t in g.tasks if t.label and t.label[0] == "G" and t.device == g.tasks[0].device]
    assert {t.info["op"] for t in syncs} == {"allreduce"} and len(syncs) == len(nbytes)
    assert sum(t.duration for t in syncs) == pytest.approx(closed["allreduce"], rel=1e-9)
    assert ar.iteration_time_s - rs.iteration_time_s == pytest.approx(
        closed["allreduce"] - closed["reduce_scatter"], rel=1e-6, abs=1e-9)
    assert closed["allreduce"] > closed["reduce_scatter"]
    assert ar.devices[0].memory == rs.devices[0].memory  # the buffer ZeRO-1 keeps whole either way
    ev = Evaluator(model, cluster, "fp32", lambda lay, algo: _default_pricer(cluster, lay, algo, True),
                   load_kernel_times(cluster)[0] if cluster.tables else None)
    for sim, reduce in ((rs, "reduce_scatter"), (ar, "allreduce")):
        got = ev.evaluate(replace(s, zero_grad_reduce=reduce))
        assert not got.approximate and got.iteration_time_s == pytest.approx(sim.iteration_time_s, rel=1e-6)


@pytest.mark.parametrize("fields", [dict(zero=0), dict(zero=2), dict(zero=1, hybrid_shard=True)])
def test_zero1_allreduce_refused_elsewhere(fields):
    """zero_grad_reduce allreduce is ZeRO-1's without hybrid sharding: anything else is refused, naming
    the field."""
    from dlsim.errors import SpecError
    with pytest.raises(SpecError, match="applies to zero 1") as err:
        make_strategy(dp=16, zero_grad_reduce="allreduce", **fields)
    assert err.value.field == "zero_grad_reduce"


def test_search_gives_the_stacks_zero1_allreduce_to_zero1_candidates_only():
    """A stack's zero_grad_reduce (SearchSpace.zero_grad_reduce) goes to the ZeRO-1 candidates without
    hybrid sharding; the other stages and the hybrid-sharded ones stay searchable, reduce-scattering."""
    from collections import Counter

    from dlsim.plan.search import SearchSpace, candidates
    model, _ = _setup()
    space = SearchSpace(16, 16, 8, hybrid_shard=(False, True), zero_grad_reduce="allreduce")
    pool = list(candidates(model, space, Counter()))
    seen = {(s.zero, s.hybrid_shard, s.zero_grad_reduce) for s in pool if s.dp > 1}
    assert (1, False, "allreduce") in seen and (1, True, "reduce_scatter") in seen
    assert {z for z, _, _ in seen} == {0, 1, 2, 3}
    assert all(r == "reduce_scatter" for z, h, r in seen if z != 1 or h)
