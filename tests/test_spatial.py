"""Spatial parallelism (Dryden et al. IPDPS'19; dlsim.plan.spatial): halo volumes against their
closed forms, the simulated exchange against T_halo, the compute split, the sample x spatial
hybrid's gradient group, the analytic evaluator beside the simulation, one-line refusals."""

from __future__ import annotations

import pytest

from dlsim.api.simulate import run_simulation, simulate
from dlsim.errors import SpecError
from dlsim.plan.evaluate import Evaluator
from dlsim.plan.spatial import block, spatial_grid, split_spatial
from dlsim.spec.model import build_model
from simkit import RingPricer

C, H, W = 16, 64, 48
ALPHA, BETA = 2e-6, 1e-10


def cnn(h: int = H, w: int = W):
    """conv 3x3 (same) -> relu -> conv 5x5 (same) -> bn -> maxpool 3/2 -> global avg pool -> fc -> loss."""
    layers = [("c1", "conv2d", {"out_channels": 32, "kernel": 3, "padding": 1}), ("r1", "relu", {}),
              ("c2", "conv2d", {"out_channels": 24, "kernel": 5, "padding": 2}), ("bn", "batchnorm", {}),
              ("pool", "maxpool", {"kernel": 3, "stride": 2, "padding": 1}), ("gap", "global_avgpool", {}),
              ("fc", "linear", {"out_features": 10}), ("loss", "cross_entropy", {})]
    entries = [{"name": n, "type": t, **a, "where": f"layers[{i}]"} for i, (n, t, a) in enumerate(layers)]
    return build_model("cnn", "fp32", (C, h, w), "tensor", entries)


def test_grid_and_blocks():
    assert spatial_grid(4) == (2, 2) and spatial_grid(8) == (4, 2) and spatial_grid(4, 1) == (4, 1)
    assert spatial_grid(6) == (3, 2) and spatial_grid(7) == (7, 1)
    assert [block(10, 4, i) for i in range(4)] == [(0, 2), (2, 5), (5, 7), (7, 10)]


def test_halo_volumes_in_one_dimension_are_the_closed_form():
    """Rows split 4 ways: a same K x K convolution's interior rank receives floor(K/2) rows of the
    whole width from each of its two neighbours (forward on x, C_in channels; backward on dy,
    C_out channels); an edge rank from one; the first layer has no backward halo (no dx)."""
    _, splits = split_spatial(cnn(), (4, 1))
    c1, c2 = splits["c1"], splits["c2"]
    assert sorted(c1.forward) == sorted([(q - 1, q, 1.0 * W * C) for q in (1, 2, 3)]
                                        + [(q + 1, q, 1.0 * W * C) for q in (0, 1, 2)])
    assert c1.backward == ()
    fwd = {(s, d): x for s, d, x in c2.forward}
    bwd = {(s, d): x for s, d, x in c2.backward}
    assert fwd == {(q + o, q): 2.0 * W * 32 for q in range(4) for o in (-1, 1) if 0 <= q + o < 4}
    assert bwd == {(q + o, q): 2.0 * W * 24 for q in range(4) for o in (-1, 1) if 0 <= q + o < 4}
    # interior share of the busiest rank: its 16 output rows but the 2 (K = 5) next to its neighbour
    assert c2.interior == pytest.approx(14 / 16)
    assert splits["bn"].reduce_forward == 2 * 24 and splits["gap"].role == "reduce"
    assert splits["fc"].role == "replicated" and splits["r1"].role == "split" and splits["r1"].forward == ()


def test_halo_in_two_dimensions_has_faces_and_corners():
    """A 2 x 2 grid: each rank gets floor(K/2) rows of W/2 columns, floor(K/2) columns of H/2 rows
    and the floor(K/2)^2 corner from the diagonal rank."""
    _, splits = split_spatial(cnn(), (2, 2))
    k = 2  # the 5 x 5 convolution's halo width
    for q in range(4):
        got = {s: x for s, d, x in splits["c2"].forward if d == q}
        row_nb, col_nb, diag = q ^ 2, q ^ 1, q ^ 3
        assert got == {row_nb: k * W / 2 * 32, col_nb: k * H / 2 * 32, diag: k * k * 32.0}


def test_local_layers_are_the_busiest_block():
    local, _ = split_spatial(cnn(66, 48), (4, 1))
    by = {layer.name: layer for layer in local.layers}
    assert local.input_shape == (C, 17, 48)                      # ceil(66 / 4) rows
    assert by["c2"].out_shape == (24, 17, 48) and by["c2"].in_shapes[0] == (32, 21, 52)  # + 2 x 2 halo rows/cols
    assert by["pool"].out_shape == (24, 9, 24) and by["fc"].in_shapes == ((24,),)


def test_simulated_halo_exchange_is_the_closed_form():
    """Blocking halos (no overlap), 8 samples, a Hockney pricer: the busiest (interior) rank's
    exchange is 2 messages of floor(K/2)·W·C·N·4 bytes, T = 2(α + nβ), for each direction."""
    n = 8
    run = run_simulation(cnn(), "dgx1-v100", spatial=4, spatial_w=1, microbatch_size=n, halo_overlap=False,
                         stack="eager", pricer=RingPricer(ALPHA, BETA), trace=True)
    halos = {e["name"].split(": ", 1)[1].removesuffix(" mb0"): e["dur"] * 1e-6 for e in run.trace["traceEvents"]
             if e.get("ph") == "X" and e.get("cat") == "comm" and e["args"].get("op") == "halo"}
    assert halos["c1's input"] == pytest.approx(2 * (ALPHA + 1 * W * C * n * 4 * BETA))
    assert halos["c2's input"] == pytest.approx(2 * (ALPHA + 2 * W * 32 * n * 4 * BETA))
    assert halos["c2's output gradient"] == pytest.approx(2 * (ALPHA + 2 * W * 24 * n * 4 * BETA))
    assert "c1's output gradient" not in halos


def test_compute_divides_and_halos_overlap_the_interior():
    one = simulate(cnn(), "dgx1-v100", microbatch_size=8, stack="eager", measured=False)
    four = simulate(cnn(), "dgx1-v100", spatial=4, microbatch_size=8, stack="eager", measured=False)
    blocking = simulate(cnn(), "dgx1-v100", spatial=4, microbatch_size=8, stack="eager", measured=False,
                        halo_overlap=False)
    assert four.iteration_time_s < one.iteration_time_s
    assert four.iteration_time_s <= blocking.iteration_time_s
    assert four.devices[0].memory["activations"] < 0.4 * one.devices[0].memory["activations"]


def test_sample_spatial_hybrid_reduces_gradients_over_all_ranks():
    r = simulate(cnn(), "dgx1-v100", dp=2, spatial=4, microbatch_size=4, stack="eager")
    assert r.devices[0].multiplicity * len(r.devices) == 8
    assert r.strategy["spatial"] == 4 and r.strategy["global_batch"] == 8


def test_evaluator_beside_the_simulation():
    from dlsim.api.simulate import prepare
    for fields in (dict(spatial=4), dict(spatial=4, dp=2), dict(spatial=2, pp=2, num_microbatches=4)):
        p = prepare("resnet18", "dgx1-v100", microbatch_size=4, stack="eager", **fields)
        e = Evaluator.of(p.builder).evaluate(p.strategy)
        sim = simulate("resnet18", "dgx1-v100", microbatch_size=4, stack="eager", **fields)
        assert e.approximate and "spatial" in " ".join(e.approximate)
        assert e.iteration_time_s == pytest.approx(sim.iteration_time_s, rel=0.05)


def test_refusals_are_one_line():
    with pytest.raises(SpecError, match="spatial parallelism with tp > 1"):
        simulate(cnn(), "dgx1-v100", spatial=2, tp=2)
    with pytest.raises(SpecError, match="splits images"):
        simulate("gpt2", "dgx1-v100", spatial=2, overrides={"layers": 2})
    with pytest.raises(SpecError, match="does not divide spatial"):
        simulate(cnn(), "dgx1-v100", spatial=4, spatial_w=3)
