"""Validation against real PyTorch runs (tiny models, few iterations) and held-out kernel shapes."""

from __future__ import annotations

import json
import math

import pytest

from dlsim.cost.lookup import ConvRow, GemmRow, conv_shape
from dlsim.errors import DlsimError
from dlsim.validate.compute_heldout import conv_layer, heldout_convs, heldout_gemms, nearest_measured


def test_heldout_gemms_are_off_grid_inside_the_hull_and_seeded():
    axis = [1, 4, 16, 64]
    rows = [GemmRow("fp32", m, n, k, 1, 1e-5) for m in axis for n in axis for k in axis if m * n * k <= 16 * 64 * 64]
    shapes = heldout_gemms(rows, "fp32", 12, seed=3)
    assert len(shapes) == 12 and shapes == heldout_gemms(rows, "fp32", 12, seed=3)
    for g in shapes:
        assert all(1 <= d <= 64 and d not in axis for d in (g.m, g.n, g.k))
        assert g.m * g.n * g.k <= 16 * 64 * 64
    assert heldout_gemms(rows, "bf16", 5) == []


def test_nearest_measured_are_the_closest_table_shapes_in_log_space():
    from dlsim.cost.layers import Gemm
    axis = [1, 4, 16, 64]
    rows = [GemmRow("fp32", m, n, k, 1, 1e-5) for m in axis for n in axis for k in axis]
    rows += [GemmRow("fp32", 5, 5, 5, 3, 1e-5), GemmRow("bf16", 5, 5, 5, 1, 1e-5)]   # batched / other dtype
    near = nearest_measured(rows, [Gemm(5, 5, 5), Gemm(60, 2, 16)], "fp32", 3)
    # log 5 is nearer log 4 than log 16 in every axis: (4, 4, 4) first; then one axis moved to 16 (or to 1)
    assert near[0][0] == Gemm(4, 4, 4)
    assert set(near[0][1:]) <= {Gemm(16, 4, 4), Gemm(4, 16, 4), Gemm(4, 4, 16)}
    # 60 -> 64, 2 lies between 1 and 4 (log 2 is 0.69 from log 1 and 0.69 from log 4), 16 exact
    assert near[1][0] in (Gemm(64, 1, 16), Gemm(64, 4, 16)) and set(near[1][:2]) == {Gemm(64, 1, 16), Gemm(64, 4, 16)}
    assert nearest_measured(rows, [Gemm(5, 5, 5)], "fp8", 2) == [[]]


def test_heldout_convs_are_new_batches_or_new_geometries():
    shape = conv_shape(8, 10, 10, 16, 3, 3, 1, 1, 1, 1)
    rows = [ConvRow("fp32", "forward", "mkldnn", n, shape, 1e-4) for n in (2, 4)]
    picks = heldout_convs(rows, "mkldnn", 4)
    assert ("forward", shape, 3, "new-batch") in picks
    wider = [s for _, s, _, kind in picks if kind == "new-geometry"]
    assert wider == [conv_shape(8, 10, 10, 24, 3, 3, 1, 1, 1, 1)]
    assert conv_layer(shape).out_shape == (16, 10, 10)


pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    """A real calibration of this machine for LeNet-5 at batch 2 plus a small GEMM grid."""
    from dlsim.api.calibrate_compute import calibrate_compute
    from dlsim.calibrate.compute_plan import gemm_grid
    from dlsim.calibrate.compute_run import Backend, run_calibration
    from dlsim.calibrate.compute_timer import KernelTimer
    out = tmp_path_factory.mktemp("prof") / "cpu-tiny"
    run_calibration(gemm_grid(["fp32"], max_dim=32, attention=False), out, Backend.create("cpu"),
                    KernelTimer("cpu", repeats=1, min_block_s=0.0), device_params=False)
    calibrate_compute(out, models=["lenet5"], batches=[2], grid=False, repeats=1, flush_cache=False,
                      algorithms=["mkldnn"], threads=1)
    return out


def test_measure_iteration_times_every_layer(tiny_profile):
    from dlsim.calibrate.compute_ops import make_optimizer
    from dlsim.io.model_yaml import load_model
    from dlsim.validate.compute_iteration import measure_iteration
    model = load_model("lenet5")
    m = measure_iteration(model, 2, make_optimizer, warmup=1, repeats=2)
    samples = m.iteration_samples
    assert len(samples) == 2 and min(samples) > 0
    assert m.phases()["iteration"] == pytest.approx(sum(samples) / 2)  # the median of two
    assert m.phases("min")["iteration"] == min(samples)
    assert m.phases("min")["forward"] == min(p[0] for p in m.samples)
    layers = m.layers()
    assert set(layers) == {layer.name for layer in model.layers}
    assert all(f > 0 for f, _ in layers.values())
    conv = next(layer.name for layer in model.layers if layer.type == "conv2d" and layer.inputs == ("input",))
    assert layers[conv][1] > 0  # ∇w of a layer fed by the input is timed too
    assert m.optimizer_impl in ("fused", "foreach")
    assert m.faulted_bytes_per_step is not None and m.faulted_bytes_per_step >= 0


def test_validate_model_record_and_cli(tiny_profile, cli, tmp_path):
    from dlsim.api.validate import validate_model
    rec = validate_model("lenet5", tiny_profile, 2, repeats=1, warmup=1, threads=1)
    assert rec["kind"] == "validate-model" and rec["measured_share"] > 0.9
    p, m = rec["predicted"], rec["measured"]
    assert rec["error"]["iteration"] == pytest.approx((p["iteration_s"] - m["iteration_s"]) / m["iteration_s"])
    assert p["iteration_s"] == pytest.approx(p["forward_s"] + p["backward_s"] + p["optimizer_s"])
    assert len(rec["layers"]) == 74 and all(math.isfinite(r["error"]) for r in rec["layers"])
    # the calibration measured the cost of a fresh page: the iteration's fresh pages are set apart
    fresh = rec["fresh_pages"]
    assert fresh["measured_s"] == pytest.approx(fresh["measured_bytes_per_step"] * fresh["seconds_per_byte"])
    if fresh["without"]["error"] is not None:
        assert fresh["without"]["predicted_s"] == pytest.approx(p["iteration_s"] - fresh["predicted_s"])
    png = tmp_path / "v.png"
    code, out, err = cli("validate", "lenet5", "--cluster", tiny_profile, "--batch", "2", "--repeats", "1",
                         "--threads", "1", "--json", "--plot", png)
    assert code == 0 and json.loads(out)["model"] == "lenet5" and png.stat().st_size > 1000
    code, out, err = cli("validate", "model", "lenet5", "--cluster", tiny_profile, "--batch", "2", "--repeats", "1",
                         "--no-layers", "--threads", "1")
    assert code == 0 and "end to end: predicted" in out and "fresh pages (allocator" in out


def test_no_layers_keeps_the_measurement_and_explains_the_gaps(tiny_profile, cli, tmp_path):
    """`validate model gpt2 ... --no-layers --json v.json` measured for 288 s, then exited 1 on
    `measured_forward_s is nan`, and the text printed `nan ns` columns (issue 34)."""
    out = tmp_path / "v.json"
    code, text, err = cli("validate", "model", "lenet5", "--cluster", tiny_profile, "--batch", "2", "--repeats", "1",
                          "--no-layers", "--threads", "1", "--json", out)
    assert code == 0, err
    rec = json.loads(out.read_text())
    assert rec["measured"]["iteration_s"] > 0 and rec["layers"]
    assert all(r["measured_forward_s"] is None and r["error"] is None for r in rec["layers"])
    assert rec["per_layer"]["measured"] is False and "--no-layers" in rec["per_layer"]["why"]
    assert "nan" not in text.lower() and "not measured (--no-layers)" in text


def test_validate_model_reports_every_step(tiny_profile):
    """`validate model` printed nothing for 5 minutes (issue 34): each training step is reported, between steps."""
    from dlsim.api.validate import validate_model
    seen = []
    validate_model("lenet5", tiny_profile, 2, repeats=2, warmup=1, threads=1, per_layer=True,
                   progress=lambda *event: seen.append(event))
    labels = [label for _, _, label, _ in seen]
    assert labels[:4] == ["building lenet5 in PyTorch", "warm-up step 1/1", "timed step 1/2", "timed step 2/2"]
    assert "per-layer steps (hooked, 3)" in labels and seen[-1][:2] == (6, 6)
    assert {status for *_, status in seen} == {"running"}  # timed here: the display's clock does not tick alone


def test_validate_kernels(tiny_profile, cli, tmp_path):
    from dlsim.api.validate import validate_kernels
    rec = validate_kernels(tiny_profile, gemms=4, convs=2, repeats=1, threads=1)
    assert rec["gemm"]["summary"]["count"] == 4
    assert {r["source"] for r in rec["gemm"]["rows"]} <= {"interpolated", "extrapolated"}
    assert rec["conv"]["summary"]["count"] == 2
    assert rec["gemm"]["drift_removed_summary"] == {"count": 0}           # no anchors asked for
    rec = validate_kernels(tiny_profile, gemms=3, convs=0, repeats=1, threads=1, anchors=2)
    for row in rec["gemm"]["rows"]:
        assert len(row["anchors"]) == 2 and row["drift"] > 0
        # the drift-removed error rescales the measured time by the anchors' drift
        assert math.isclose(row["drift_removed_error"],
                            row["predicted_s"] / (row["measured_s"] / row["drift"]) - 1, rel_tol=1e-9)
    assert rec["gemm"]["drift_removed_summary"]["count"] == 3
    assert 1 <= rec["gemm"]["anchor_summary"]["count"] <= 6
    png = tmp_path / "k.png"
    code, out, err = cli("validate", "kernels", "--cluster", tiny_profile, "--gemms", "2", "--convs", "0",
                         "--threads", "1", "--plot", png, "--anchors", "1")
    assert code == 0 and "gemm: 2 held-out shapes" in out and png.exists()
    assert "with that drift removed" in out


def test_validate_bad_input_is_one_line(cli, tmp_path):
    for args, reason in ((["lenet5", "--cluster", "nonesuch"], "no such profile"),
                         (["kernels", "--cluster", "dgx-h100"], "has no gemm table"),
                         (["nonesuch", "--cluster", "dgx-h100"], "no such model")):
        code, out, err = cli("validate", *args)
        assert code == 1 and err.count("\n") == 1 and reason in err, err


def test_zoo_plot_from_records(tmp_path):
    from dlsim.report.validation_plots import plot_zoo_validation
    recs = [{"model": m, "batch": 2, "predicted": {"iteration_s": p}, "measured": {"iteration_s": 1.0},
             "error": {"iteration": p - 1.0}} for m, p in (("a", 1.05), ("b", 0.85))]
    plot_zoo_validation(recs, tmp_path / "z.png")
    assert (tmp_path / "z.png").stat().st_size > 1000


def test_heldout_passes_shuffle_and_take_min_over_passes():
    """Each kernel is timed once per pass, in a new order each pass, and its time is the min over passes."""
    from types import SimpleNamespace

    from dlsim.api.validate import _timed_in_passes

    calls = []

    class FakeTimer:
        def time(self, fn):
            calls.append(fn())
            # kernel i's k-th sample: 10 + i, except its 2nd sample which is disturbed (+100)
            k = calls.count(calls[-1])
            return SimpleNamespace(seconds=10 + calls[-1] + (100 if k == 2 else 0))

    fns = [(lambda i=i: i) for i in range(5)]
    times = _timed_in_passes(fns, FakeTimer(), passes=3, statistic="min", seed=1)
    assert times == [10, 11, 12, 13, 14]
    assert sorted(calls) == sorted(list(range(5)) * 3)
    assert [calls[0:5], calls[5:10], calls[10:15]] != [list(range(5))] * 3   # shuffled at least once
    calls.clear()
    assert _timed_in_passes(fns, FakeTimer(), passes=3, statistic="median", seed=1) == [10, 11, 12, 13, 14]
    calls.clear()
    assert _timed_in_passes(fns, FakeTimer(), passes=1, statistic="min", seed=1) == [10, 11, 12, 13, 14]
    assert calls == list(range(5))                                             # one pass: original order


def test_validate_models_in_worker_processes(tiny_profile):
    """Each model timed in a spawned process of its own, stepped in round robin from this one."""
    from dlsim.api.validate import validate_models
    from dlsim.io.model_yaml import load_model
    from dlsim.api.validate_workers import WorkerRunner
    (rec,) = validate_models([("lenet5", 2, {})], tiny_profile, rounds=1, threads=1, per_layer_repeats=1,
                             min_round_s=0.0)
    assert rec["process"] == "one per model" and rec["measured"]["iteration_s"] > 0
    assert len(rec["measured"]["iteration_samples_s"]) >= 2
    assert all(r["measured_s"] > 0 for r in rec["layers"] if r["type"] == "conv2d")
    model = load_model("lenet5")
    run = WorkerRunner(model, 2, threads=1)
    try:
        f, b, o = run.step()
        assert f > 0 and b > 0 and o > 0 and run.threads == 1
    finally:
        run.close()
    import dataclasses
    with pytest.raises(DlsimError, match="no source file"):
        WorkerRunner(dataclasses.replace(model, source=""), 2)
