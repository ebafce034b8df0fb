"""FP8 GEMMs (Transformer Engine): projection GEMMs at the FP8 peak plus their casts, BF16 elsewhere."""

from __future__ import annotations

import pytest
from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import simulate
from dlsim.cost.roofline import compute_efficiency, peak, roofline_time
from dlsim.errors import SpecError
from dlsim.plan.fp8 import AMAX_HISTORY, CAST_BYTES, apply_fp8
from dlsim.plan.layertable import build_layer_table

TINY = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 4, "ffn_hidden": 4096, "seq_len": 2048, "vocab": 1000}


def _tables(cluster="dgx-h100", m=4):
    c = as_cluster(cluster)
    model = as_model("llama3-8b", TINY)
    bf16 = build_layer_table(model, c.device, "bf16", batch=1, tp=1)
    return model, c.device, bf16, apply_fp8(bf16, model, c.device, m)


def test_linear_forward_is_bf16_minus_gemm_plus_fp8_gemm_and_casts():
    model, device, bf16, fp8 = _tables(m=4)
    i = next(k for k, e in enumerate(bf16) if e.type == "linear" and "gate_up" in e.name)
    layer = model.layers[bf16[i].index]
    rows, k, n = TINY["seq_len"], layer.in_shapes[0][-1], layer.out_shape[-1]
    flops = 2 * rows * k * n
    t = lambda dt, b: roofline_time(flops, (rows * k + k * n + rows * n) * b, device, dt, matrix=True).seconds  # noqa
    cast = lambda elems, kernels=1: roofline_time(0.0, elems * CAST_BYTES, device, "bf16", matrix=False,  # noqa
                                                  kernels=kernels).seconds
    scale = roofline_time(0.0, 2 * 3 * AMAX_HISTORY * 4.0, device, "bf16", matrix=False).seconds
    expected = bf16[i].forward.seconds - t("bf16", 2) + t("fp8", 1) + cast(rows * k) + cast(k * n / 4) + scale
    assert fp8[i].forward.seconds == pytest.approx(expected, rel=1e-9)
    assert fp8[i].forward.seconds < bf16[i].forward.seconds
    # the fp8 efficiency is the bf16 curve times the profile's published best-shape ratio
    assert compute_efficiency(flops, device, "fp8") == pytest.approx(
        device.fp8_efficiency_ratio * compute_efficiency(flops, device, "bf16"))
    assert peak(device, "fp8", True) == pytest.approx(2 * peak(device, "bf16", True), rel=1e-3)


def test_bf16_layers_untouched():
    model, _, bf16, fp8 = _tables()
    for a, b in zip(bf16, fp8):
        if a.type not in ("linear", "attention") or a.name == "lm_head":
            assert a.forward == b.forward and a.backward == b.backward
    head = next(k for k, e in enumerate(bf16) if e.name == "lm_head")
    assert fp8[head].forward == bf16[head].forward  # the output projection feeding the loss stays bf16


def test_fp8_run_keeps_bf16_state_and_is_faster():
    kw = dict(dp=1, microbatch_size=1, num_microbatches=2, overrides=TINY, fused_kernels=("flash_attention",))
    b = simulate("llama3-8b", "dgx-h100", dtype="bf16", **kw)
    f = simulate("llama3-8b", "dgx-h100", dtype="fp8", **kw)
    assert f.strategy["dtype"] == "fp8"
    assert f.iteration_time_s < b.iteration_time_s
    for kind in ("weights", "gradients", "optimizer"):
        assert f.devices[0].memory[kind] == b.devices[0].memory[kind]
    assert any("fp8 GEMMs" in n and "0.883" in n for n in f.notes)


@pytest.mark.parametrize("cluster", ["dgx-a100", "dgx1-v100"])
def test_fp8_refused_without_fp8_tensor_cores(cluster, cli):
    with pytest.raises(SpecError, match="no FP8 tensor cores"):
        simulate("llama3-8b", cluster, dtype="fp8", overrides=TINY)
    code, out, err = cli("simulate", "llama3-8b", "--cluster", cluster, "--dtype", "fp8")
    assert code == 1 and not out and len(err.strip().splitlines()) == 1 and "FP8" in err


def test_estimate_points_fp8_to_the_simulator(cli):
    code, out, err = cli("estimate", "gpt2", "--cluster", "dgx-h100", "--dtype", "fp8")
    assert code == 1 and "dlsim simulate --dtype fp8" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("estimate", "gpt2", "--cluster", "dgx-a100", "--dtype", "fp8")
    assert code == 1 and "no FP8 tensor cores" in err
