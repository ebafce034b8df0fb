"""`dlsim estimate` end to end and the single-device iteration model."""

import json

import pytest

from dlsim.api.estimate import estimate
from dlsim.cost.roofline import roofline_time
from dlsim.results import Source


def test_estimate_json_record(cli):
    code, out, err = cli("estimate", "resnet50", "--cluster", "dgx-h100", "--batch", "64", "--json")
    assert code == 0, err
    rec = json.loads(out)
    assert rec["kind"] == "estimate" and rec["batch"] == 64
    layer_sum = sum(layer["time_s"] for layer in rec["layers"]) + rec["optimizer_time_s"]
    assert rec["iteration_time_s"] == pytest.approx(layer_sum)
    assert rec["throughput_samples_per_s"] == pytest.approx(64 / rec["iteration_time_s"])
    assert len(rec["layers"]) == 175
    assert sum(rec["time_by_source_s"].values()) == pytest.approx(rec["iteration_time_s"])
    assert rec["memory_bytes"]["total"] == pytest.approx(sum(v for k, v in rec["memory_bytes"].items() if k != "total"))


def test_estimate_table_is_readable(cli):
    code, out, _ = cli("estimate", "resnet50", "--cluster", "dgx-h100", "--batch", "64")
    assert code == 0
    assert "iteration time" in out and "samples/s" in out and "layer1.0.conv2" in out


def test_iteration_scales_with_batch_and_precision():
    small = estimate("resnet50", "dgx-h100", 16)
    large = estimate("resnet50", "dgx-h100", 128)
    # more work in total, less per sample (small kernels do not fill the device)
    assert 1 < large.iteration_time_s / small.iteration_time_s < 8
    half = estimate("resnet50", "dgx-h100", 128, dtype="bf16")
    assert half.iteration_time_s < large.iteration_time_s / 2
    assert all(layer.forward.source == Source.MODEL for layer in large.layers)


def test_adam_state_memory_is_zero_paper_k12():
    """ZeRO (Rajbhandari et al. SC'20 §3.1): mixed-precision Adam holds 2+2+12 = 16 bytes per parameter."""
    r = estimate("resnet50", "dgx-h100", 1, dtype="bf16", optimizer="adam")
    m = r.memory
    assert (m.weights + m.gradients + m.optimizer) / r.params == pytest.approx(16)


def test_roofline_bounds(tmp_path):
    from dlsim.io.profile_yaml import load_profile
    dev = load_profile("dgx-h100").device
    mem = roofline_time(0, 3.35e9, dev, "fp32", matrix=False, kernels=0)
    assert mem.seconds == pytest.approx(1e-3 / dev.memory_efficiency)
    big = roofline_time(1e15, 0, dev, "bf16", matrix=True, kernels=0)
    # 1 PFLOP lies between the profile's bf16 points 4096^3 (0.797) and 8192^3 (0.806), sustained (0.915)
    s = dev.sustained_matrix_fraction
    assert s == 0.915
    eff = 1e15 / (989.4e12 * big.seconds)
    assert 0.797 * s < eff < 0.806 * s + 1e-12 and "efficiency tables" in big.note
    plain = roofline_time(1e15, 0, dev, "fp64", matrix=True, kernels=0)  # no fp64 curve: e_max·W/(W + W_half)
    assert plain.seconds == pytest.approx(
        1e15 / (66.9e12 * s * dev.compute_efficiency * 1e15 / (1e15 + dev.half_efficiency_flops)))


def test_a_sum_keeps_the_seconds_of_each_source():
    """A measured GEMM plus a roofline bias add: labelled by the weaker source, counted by each part's own."""
    from dlsim.results import Estimate
    gemm, bias = Estimate(3e-3, Source.MEASURED, "gemm table"), Estimate(1e-5, Source.MODEL, "roofline")
    total = gemm + bias + Estimate(2e-4, Source.INTERPOLATED, "host")
    assert total.source is Source.MODEL and total.seconds == pytest.approx(3.21e-3)
    assert total.by_source() == {Source.MEASURED: pytest.approx(3e-3), Source.INTERPOLATED: pytest.approx(2e-4),
                                 Source.MODEL: pytest.approx(1e-5)}
    assert total.table_share == pytest.approx(3.2 / 3.21)
    assert gemm.table_share == 1.0 and bias.table_share == 0.0 and (gemm + gemm).split == ()


def test_measured_share_counts_the_measured_part_of_each_pass(tmp_path):
    """A linear layer whose GEMMs the committed CPU profile measured (64x512x256 forward, its two backward
    GEMMs) is priced from the table, though its bias add is modelled: the record's time by source counts
    the GEMM as measured."""
    from dlsim.io.model_yaml import load_model
    path = tmp_path / "fc.yaml"
    path.write_text("name: fc\ndtype: fp32\ninput: {shape: [256]}\nlayers:\n"
                    "  - {name: fc, type: linear, out_features: 512}\n")
    rec = estimate(load_model(str(path)), "cpu-epyc-2core", 64, allocator="retained")
    fc = rec.layers[0]
    assert fc.forward.source is Source.MODEL  # labelled by the bias add, priced by the roofline
    assert fc.forward.by_source()[Source.MEASURED] == pytest.approx(0.000141822002)
    by = rec.time_by_source()
    assert by["measured"] >= 0.000141822002 and by["model"] < 0.1 * by["measured"]
