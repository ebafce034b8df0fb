"""Channel and filter parallelism as per-layer choices (Dryden et al. SC'19): layer groups whose
convolutions are split by input channels or by filters over the dp devices, with the collectives of
each split by hand."""

from __future__ import annotations

import pytest

from dlsim.api.simulate import prepare, simulate
from dlsim.spec.strategy import LayerGroup
from test_spatial import cnn

DP, B = 4, 2


def _entries(mode: str):
    p = prepare(cnn(), "dgx1-v100", dp=DP, microbatch_size=B, stack="eager",
                layer_groups=(LayerGroup("c1", "loss", mode),))
    return {e.name: e for e in p.builder.strategy_base(p.strategy).entries}, p.builder.model


def _bytes(model, name: str) -> float:
    return model.layer(name).out_elements * DP * B * 4  # the group's whole batch, fp32


def test_filter_split_gathers_its_input_and_reduces_its_input_gradient():
    es, model = _entries("filter")
    c1, c2 = es["c1"], es["c2"]
    assert c1.tp.role == c2.tp.role == "column" and c1.params == model.layer("c1").params // DP
    assert c1.batch == DP * B
    assert [(c.op, c.nbytes) for c in c2.tp.before] == [("allgather", _bytes(model, "r1"))]
    assert [(c.op, c.nbytes) for c in c2.tp.after_bwd] == [("allreduce", _bytes(model, "r1"))]
    assert c1.tp.after_bwd == ()  # the network's input needs no gradient


def test_channel_split_reduces_its_output_and_gathers_its_input_gradient():
    es, model = _entries("channel")
    c1, c2 = es["c1"], es["c2"]
    assert c1.tp.role == c2.tp.role == "row" and c2.params == model.layer("c2").params // DP
    assert [(c.op, c.nbytes) for c in c1.tp.after_fwd] == [("allreduce", _bytes(model, "c1"))]
    assert [(c.op, c.nbytes) for c in c2.tp.after_fwd] == [("allreduce", _bytes(model, "c2"))]
    assert [(c.op, c.nbytes) for c in c2.tp.after_bwd] == [("allgather", _bytes(model, "r1"))]
    assert c1.forward.seconds < simulate(cnn(), "dgx1-v100", microbatch_size=DP * B, stack="eager").iteration_time_s


def test_choices_per_layer_and_switch_from_data_groups():
    """Data-parallel first layer, the second convolution channel-split: entering it all-gathers the
    workers' samples forward and returns each its samples' input gradient by one all-to-all."""
    p = prepare(cnn(), "dgx1-v100", dp=DP, microbatch_size=B, stack="eager",
                layer_groups=(LayerGroup("c1", "r1", "data"), LayerGroup("c2", "pool", "channel"),
                              LayerGroup("gap", "loss", "filter")))
    es = {e.name: e for e in p.builder.strategy_base(p.strategy).entries}
    model = p.builder.model
    r1 = model.layer("r1").out_elements * DP * B * 4
    assert [(c.op, c.nbytes) for c in es["c2"].tp.before] == [("allgather", r1)]
    assert [(c.op, c.nbytes) for c in es["c2"].tp.after_bwd] == [("alltoall", r1)]
    assert es["c1"].batch == B and es["c2"].batch == DP * B and es["fc"].tp.role == "column"
    r = simulate(cnn(), "dgx1-v100", dp=DP, microbatch_size=B, stack="eager", layer_groups=p.strategy.layer_groups)
    assert r.iteration_time_s > 0 and r.feasible


def test_sample_by_filter_hybrid_splits_inside_tp_groups_with_segmented_allreduces():
    """dp 2 x tp 4, every convolution split by filters inside its tp group: 1/4 of each split layer's
    parameters per device, its gradients all-reduced over the 2 ranks holding the same shard."""
    p = prepare(cnn(), "dgx1-v100", dp=2, tp=4, microbatch_size=B, stack="eager",
                layer_groups=(LayerGroup("c1", "loss", "filter"),))
    es = {e.name: e for e in p.builder.strategy_base(p.strategy).entries}
    assert es["c1"].tp.role == es["c2"].tp.role == "column" and es["c2"].batch == B and es["c2"].tp_degree == 4
    assert es["c2"].params == p.builder.model.layer("c2").params // 4
    sharded = simulate(cnn(), "dgx1-v100", dp=2, tp=4, microbatch_size=B, stack="eager",
                       layer_groups=p.strategy.layer_groups, overlap=False)
    plain = simulate(cnn(), "dgx1-v100", dp=8, microbatch_size=B, stack="eager", overlap=False)
    assert sharded.devices[0].memory["gradients"] < 0.5 * plain.devices[0].memory["gradients"]
    with pytest.raises(Exception, match="model groups"):
        simulate(cnn(), "dgx1-v100", dp=2, tp=4, layer_groups=(LayerGroup("c1", "loss", "model"),))
