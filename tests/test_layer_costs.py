"""Per-operator costs against hand-computed values."""

import pytest

from dlsim.cost.layers import layer_cost
from dlsim.spec.model import build_model


def one(entry, shape, kind="tensor"):
    return build_model("t", "fp32", shape, kind, [dict(entry, name="x")]).layers[0]


def test_conv2d_costs_and_im2col_gemms():
    # 64 -> 128 channels, 3x3, stride 2, pad 1 on 56x56: output 28x28
    layer = one({"type": "conv2d", "out_channels": 128, "kernel": 3, "stride": 2, "padding": 1, "bias": False},
                [64, 56, 56])
    assert layer.out_shape == (128, 28, 28)
    c = layer_cost(layer, 8)
    macs = 8 * 128 * 28 * 28 * 64 * 9
    assert c.forward.flops == 2 * macs and c.backward_data.flops == 2 * macs and c.backward_weight.flops == 2 * macs
    assert c.forward.work == macs
    assert c.forward.depth == 6 + 2 + 2  # ⌈log2 64⌉ + ⌈log2 3⌉ + ⌈log2 3⌉
    (g,) = c.forward.gemms
    assert (g.m, g.n, g.k) == (128, 8 * 28 * 28, 64 * 9)
    (gx,) = c.backward_data.gemms
    assert (gx.m, gx.n, gx.k) == (64 * 9, 8 * 28 * 28, 128)
    (gw,) = c.backward_weight.gemms
    assert (gw.m, gw.n, gw.k) == (128, 64 * 9, 8 * 28 * 28)
    assert c.forward.bytes_read == (8 * 64 * 56 * 56 + 128 * 64 * 9) * 4
    assert c.saves_input


def test_grouped_conv_counts_per_group():
    layer = one({"type": "conv2d", "out_channels": 32, "kernel": 3, "padding": 1, "groups": 32, "bias": False},
                [32, 10, 10])
    assert layer.params == 32 * 9
    c = layer_cost(layer, 1)
    assert c.forward.flops == 2 * 32 * 100 * 9
    assert c.forward.gemms[0].count == 32


def test_linear_on_sequence_uses_all_rows():
    layer = one({"type": "linear", "out_features": 3072}, [128, 768])
    c = layer_cost(layer, 4)
    rows = 4 * 128
    assert c.forward.flops == 2 * rows * 768 * 3072 + rows * 3072
    assert c.matmul_flops == 2 * rows * 768 * 3072
    assert c.forward.depth == 10 and c.backward_data.depth == 12 and c.backward_weight.depth == 9


def test_attention_matmul_flops():
    layer = one({"type": "attention", "heads": 12}, [1024, 768])
    c = layer_cost(layer, 2)
    rows = 2 * 1024
    proj = 2 * rows * 768 * (3 * 768) + 2 * rows * 768 * 768
    scores = 2 * (2 * 12) * 1024 * 1024 * 64 * 2
    assert c.matmul_flops == proj + scores
    assert layer.params == 4 * 768 * 768 + 4 * 768


def test_elementwise_is_memory_traffic():
    layer = one({"type": "relu"}, [64, 10, 10])
    c = layer_cost(layer, 2, "bf16")
    assert c.forward.bytes_read == c.forward.bytes_written == 2 * 6400 * 2
    assert c.backward_weight.kernels == 0 and c.saves_output


def test_views_are_free():
    c = layer_cost(one({"type": "flatten"}, [8, 4, 4]), 16)
    assert c.forward.bytes == 0 and c.flops == 0


def test_lstm_gemms():
    layer = one({"type": "lstm", "hidden": 100, "layers": 2}, [35, 50])
    assert layer.params == 4 * (50 * 100 + 100 * 100) + 8 * 100 + 4 * (100 * 100 + 100 * 100) + 8 * 100
    c = layer_cost(layer, 3)
    gemm_flops = 2 * 3 * 35 * 400 * (50 + 100) + 2 * 3 * 35 * 400 * (100 + 100)
    assert c.forward.matmul_flops == gemm_flops


def test_bad_batch():
    with pytest.raises(ValueError):
        layer_cost(one({"type": "relu"}, [4]), 0)
