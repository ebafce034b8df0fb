"""Layer tables shared across scenario builders of one loaded model (`ScenarioBuilder._shared`) and
builders kept across predictions (`dlsim.api.simulate.Builders`): never a stale table, whatever the
order, device, dtype, accumulation or eviction."""

from __future__ import annotations

import pytest

import dlsim.plan.scenario as scenario
from dlsim.api.analytic import estimate_strategy
from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import Builders, prepare, simulate
from dlsim.spec.memo import derived

SMALL = {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 256, "positions": 256}
CASES = [
    ("dgx-a100", dict(dp=2, tp=2, global_batch=16)),
    ("dgx-h100", dict(dp=2, tp=2, global_batch=16)),
    ("dgx-h100", dict(dp=2, tp=2, global_batch=16, dtype="fp8")),
    ("dgx-h100", dict(dp=2, tp=2, global_batch=16, dtype="fp32")),
    ("dgx-h100", dict(dp=2, tp=2, pp=2, global_batch=8, num_microbatches=4, grad_accumulation="main_grad")),
    ("dgx-h100", dict(dp=2, tp=2, pp=2, global_batch=8, num_microbatches=4, grad_accumulation="autograd")),
    ("dgx-h100", dict(dp=2, tp=2, pp=2, global_batch=16, num_microbatches=8, grad_accumulation="autograd")),
    ("dgx-h100", dict(dp=2, tp=2, global_batch=16, sequence_parallel=True, tp_comm_overlap=True)),
    ("cpu-epyc-2core", dict(dp=1, global_batch=2)),  # measured kernel tables: a new table object per call
]


def _fresh(cluster, fields, how):
    return how(as_model("gpt3-175b", SMALL), cluster, **fields)


def _analytic(model, cluster, **fields):
    return estimate_strategy(model, cluster, **fields)["iteration_time_s"]


def _simulated(model, cluster, **fields):
    return simulate(model, cluster, **fields).to_dict()


@pytest.mark.parametrize("how", [_analytic, _simulated], ids=["analytic", "simulation"])
def test_tables_shared_across_builders_are_never_stale(how, monkeypatch):
    fresh = [_fresh(c, f, how) for c, f in CASES]
    model = as_model("gpt3-175b", SMALL)
    loaded = {c: as_cluster(c) for c, _ in CASES}  # one device object per profile: tables shared across calls
    order = CASES + CASES[::-1]
    assert [how(model, loaded[c], **f) for c, f in CASES] == fresh
    built = len(derived(model, "layer tables", dict))
    assert [how(model, loaded[c], **f) for c, f in CASES[::-1]] == fresh[::-1]
    # every table of the second pass was shared; a simulation loads the CPU profile's measured tables per call
    # (one table more), an estimate keeps its builder, and with it those tables (`dlsim.api.analytic._KEPT`)
    assert len(derived(model, "layer tables", dict)) == built + (how is _simulated)
    monkeypatch.setattr(scenario, "SHARED_TABLES", 2)  # evicted and built again
    other = as_model("gpt3-175b", SMALL)
    assert [how(other, loaded[c], **f) for c, f in order] == fresh + fresh[::-1]
    assert len(derived(other, "layer tables", dict)) <= 2


def test_one_model_shares_its_tables_and_a_kept_builder_its_evaluator():
    model, cluster = as_model("gpt3-175b", SMALL), as_cluster("dgx-h100")
    a = prepare(model, cluster, dp=2, tp=2, global_batch=16).builder
    b = prepare(model, cluster, dp=2, tp=2, global_batch=16).builder
    assert a is not b and a.base_table(2, False, 1) is b.base_table(2, False, 1)
    assert a.base_table(2, False, 1) is not prepare(model, "dgx-a100", dp=2, tp=2, global_batch=16).builder \
        .base_table(2, False, 1)
    kept = Builders(limit=1)
    one = prepare(model, cluster, dp=2, global_batch=16, builders=kept).builder
    assert prepare(model, cluster, tp=2, global_batch=16, builders=kept).builder is one
    assert prepare(model, cluster, tp=2, global_batch=16, dtype="fp8", builders=kept).builder is not one


def test_kept_builders_of_one_profile_share_tables_and_prices():
    """Clusters of one profile resized to other node counts (a sweep's gpus) share the measured
    tables, so the layer tables, and the collective prices of equal `price_key`s; a price is the
    fresh pricer's. On a shared network the price depends on where the ranks sit: not shared."""
    from dataclasses import replace

    from dlsim.api.simulate import default_pricers
    from dlsim.plan.comm import Layout
    from dlsim.spec.network import Fabric, TreeLevel

    model, base = as_model("gpt3-175b", SMALL), as_cluster("dgx-a100")
    kept = Builders()
    one, four = (prepare(model, replace(base, nodes=n), dp=2, tp=2, global_batch=16, builders=kept) for n in (1, 4))
    assert one.builder is not four.builder and one.builder.tables is four.builder.tables
    assert one.builder.base_table(2, False, 1) is four.builder.base_table(2, False, 1)
    s = one.strategy
    a, b = one.builder.pricer(s), four.builder.pricer(s)
    first = a.collective("allreduce", 3e6, [0, 2])
    assert b.collective("allreduce", 3e6, [0, 2]) is first
    fresh = default_pricers(four.builder.cluster)(Layout(2, 2, 1, base.devices_per_node), s.collective)
    assert fresh.collective("allreduce", 3e6, [0, 2]) == first
    shared_net = replace(base.inter, fabric=Fabric("fat-tree", levels=(TreeLevel(2, 4.0),)))
    far = prepare(model, replace(base, nodes=4, inter=shared_net), dp=16, tp=2, global_batch=16, builders=kept)
    assert far.builder.pricer(far.strategy).price_key("allreduce", list(range(0, 32, 2))) is None
