"""An unfused attention priced from tables: its GEMMs plus the memory-bound kernels between them."""

from __future__ import annotations

import pytest

from dlsim.cost.layers import layer_cost
from dlsim.cost.lookup import GemmRow, MeasuredKernelTimes, MemoryRow
from dlsim.cost.pricing import price_pass
from dlsim.io.profile_yaml import load_profile
from dlsim.results import Source
from dlsim.spec.model import build_model


def attention(causal: bool, dropout: float):
    entry = {"name": "att", "type": "attention", "heads": 4, "causal": causal, "dropout": dropout}
    return build_model("att", "fp32", (16, 64), "tensor", [entry]).layers[0]


def gemm_rows(cost):
    return [GemmRow("fp32", g.m, g.n, g.k, g.count, g.flops / 1e10) for p in (cost.forward, cost.backward_data)
            for g in p.gemms]


def test_parts_hand_counted():
    cost = layer_cost(attention(causal=True, dropout=0.1), 2, "fp32")
    scores, acts = 2 * 4 * 16 * 16, 2 * 16 * 64
    ops = [(op, name, part.bytes) for op, name, part in cost.forward.parts]
    assert ops == [("relu", "forward", 2 * 4 * scores), ("relu", "forward", 2 * 4 * scores),
                   ("softmax", "forward", 2 * 4 * scores), ("dropout", "forward", scores * (4 + 4 + 1))] + \
        [("relu", "forward", 2 * 4 * acts)] * 4
    plain = layer_cost(attention(causal=False, dropout=0.0), 2, "fp32")
    assert [op for op, _, _ in plain.backward_data.parts] == ["relu", "softmax"] + ["relu"] * 4


def test_price_is_gemms_plus_measured_parts_and_falls_back_without_curves():
    cost = layer_cost(attention(causal=False, dropout=0.1), 2, "fp32")
    device = load_profile("dgx-h100").device
    f = cost.forward
    gemm_time = sum(g.flops / 1e10 for g in f.gemms)
    mem = [MemoryRow("fp32", op, name, f"part{i}", part.bytes, part.flops, 1e-6 * (i + 1))
           for i, (op, name, part) in enumerate(f.parts)]
    # several parts share (op, pass, bytes, flops): the exact lookup returns the median of their rows
    by_key: dict = {}
    for r, (_, _, part) in zip(mem, f.parts):
        by_key.setdefault((r.op, r.pass_name, round(part.bytes), round(part.flops)), []).append(r.time_s)
    import statistics
    parts_time = sum(statistics.median(by_key[(op, name, round(p.bytes), round(p.flops))]) for op, name, p in f.parts)
    with_parts = price_pass(f, "attention", "forward", device, "fp32", MeasuredKernelTimes(gemm_rows(cost), memory=mem))
    assert with_parts.source == Source.MEASURED and "memory-bound kernels" in with_parts.note
    assert with_parts.seconds == pytest.approx(gemm_time + parts_time, rel=1e-12)
    without = price_pass(f, "attention", "forward", device, "fp32", MeasuredKernelTimes(gemm_rows(cost)))
    from dlsim.cost.roofline import roofline_time
    rooflined = sum(roofline_time(p.flops, p.bytes, device, "fp32", matrix=False, kernels=p.kernels).seconds
                    for _, _, p in f.parts)  # parts without measured curves: each by the roofline
    assert without.seconds == pytest.approx(gemm_time + rooflined, rel=1e-12)
    assert without.source == Source.MODEL
