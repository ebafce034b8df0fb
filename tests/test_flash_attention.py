"""A flash attention core priced as one kernel (`dlsim.cost.flash`): no score in memory, causal tiles
skipped, the measured kernel by sequence length; its closed form held to the simulation and the evaluator."""

from __future__ import annotations

import math

import pytest

from dlsim.api.analytic import estimate_strategy
from dlsim.api.simulate import simulate
from dlsim.cost.flash import flash_seconds
from dlsim.cost.layers import layer_cost
from dlsim.cost.pricing import gemm_seconds, price_pass
from dlsim.cost.roofline import roofline_time
from dlsim.errors import SpecError
from dlsim.io.paths import profile_dirs
from dlsim.io.profile_yaml import load_profile
from dlsim.plan.contextparallel import split_sequence
from dlsim.spec.model import build_model

H100 = load_profile("dgx-h100").device
PEAK = 989.4e12
"""[H100-WP] BF16 dense peak, the denominator of the profile's flash-attention fractions."""
S = 0.915
"""The profile's sustained fraction ([FRYER] 730 / [TORCHMM] 797.51): [FA3]'s short-benchmark rates times S."""
L, HEADS, D = 2048, 16, 2048
LLAMA = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 2048, "seq_len": 4096, "vocab": 1024}


def attention(causal: bool, seq: int = L):
    entry = {"name": "att", "type": "attention", "heads": HEADS, "causal": causal, "bias": False}
    return build_model("att", "bf16", (seq, D), "tensor", [entry]).layers[0]


def test_causal_forward_is_half_the_products_at_the_measured_causal_rate():
    """Forward: the projections as GEMMs plus one kernel of half the core's products at [FA3]'s cuDNN
    causal rate at 2k (484 TFLOP/s), nothing for the L x L scores."""
    cost = layer_cost(attention(True), 1, "bf16", frozenset({"cudnn_attention"}))
    f = cost.forward
    assert f.flash is not None and f.flash.causal and f.flash.length == L
    core = 2 * (2 * L * L * (D // HEADS) * HEADS)  # QK^T and PV, full products
    kernel = (core / 2) / (484e12 * S) + H100.launch_overhead
    assert flash_seconds(f, H100, "bf16").seconds == pytest.approx(kernel, rel=1e-12)
    projections = sum(gemm_seconds(g, H100, "bf16") for g in f.gemms if g.count == 1)
    copy = sum(roofline_time(p.flops, p.bytes, H100, "bf16", matrix=False, kernels=p.kernels,
                             kernel=f"{op}.{name}").seconds for op, name, p in f.parts)
    assert price_pass(f, "attention", "forward", H100, "bf16").seconds == pytest.approx(
        projections + kernel + copy, rel=1e-12)


def test_causal_backward_scales_the_plain_backward_by_the_forward_ratio():
    """No causal backward is published: 465 (backward, 2k) x 484 / 617 (forward causal / plain)."""
    b = layer_cost(attention(True), 1, "bf16", frozenset({"cudnn_attention"})).backward_data
    work = 5 * 2 * L * L * (D // HEADS) * HEADS / 2
    rate = 465e12 * 484 / 617 * S
    assert flash_seconds(b, H100, "bf16").seconds == pytest.approx(work / rate + H100.launch_overhead, rel=1e-12)
    plain = layer_cost(attention(False), 1, "bf16", frozenset({"cudnn_attention"})).backward_data
    assert flash_seconds(plain, H100, "bf16").seconds == pytest.approx(2 * work / (465e12 * S) + H100.launch_overhead,
                                                                       rel=1e-12)


def test_flash_attention_2_is_slower_than_cudnn_and_interpolates_in_log_length():
    """FlashAttention-2 at 3k: between its 2k (298) and 4k (319) causal rates, linearly in log L."""
    seq = 3072
    f = layer_cost(attention(True, seq), 1, "bf16", frozenset({"flash_attention"})).forward
    rate = (298 + (319 - 298) * 0.5849625007211562) * 1e12 * S  # log2(3072 / 2048) = 0.585
    work = 2 * 2 * seq * seq * (D // HEADS) * HEADS / 2
    assert flash_seconds(f, H100, "bf16").seconds == pytest.approx(work / rate + H100.launch_overhead, rel=1e-9)
    cudnn = layer_cost(attention(True, seq), 1, "bf16", frozenset({"cudnn_attention"})).forward
    assert flash_seconds(cudnn, H100, "bf16").seconds < flash_seconds(f, H100, "bf16").seconds


def test_unmeasured_dtype_is_the_roofline_of_the_work_and_the_tensors_only():
    """fp32 (no measurement): half the products at the GEMM curve, bytes of Q, K, V and the output only."""
    f = layer_cost(attention(True), 1, "fp32", frozenset({"flash_attention"})).forward
    work = 2 * 2 * L * L * (D // HEADS) * HEADS / 2
    expect = roofline_time(work, 4 * L * D * 4, H100, "fp32", matrix=True).seconds
    assert flash_seconds(f, H100, "fp32").seconds == pytest.approx(expect, rel=1e-12)
    unfused = layer_cost(attention(True), 1, "fp32").forward
    assert price_pass(f, "attention", "forward", H100, "fp32").seconds < \
        price_pass(unfused, "attention", "forward", H100, "fp32").seconds


def test_context_parallel_ring_runs_one_causal_step_and_the_rest_unmasked():
    """cp 2, load-balanced causal chunks: the rank's half of the products in two steps of equal work,
    the first at the causal rate, the second at the plain one, both at the local length (2k)."""
    model = build_model("att", "bf16", (2 * L, D), "tokens", [
        {"name": "att", "type": "attention", "heads": HEADS, "causal": True, "bias": False}])
    cost = layer_cost(split_sequence(model, 2).layers[0], 1, "bf16", frozenset({"cudnn_attention"}))
    f = cost.forward
    assert f.flash.cp == 2 and f.flash.length == L
    work = 2 * 2 * L * (2 * L) * (D // HEADS) * HEADS / 2  # local queries against all keys, halved
    expect = (work / 2) / (484e12 * S) + (work / 2) / (617e12 * S) + 2 * H100.launch_overhead
    assert flash_seconds(f, H100, "bf16").seconds == pytest.approx(expect, rel=1e-12)


def test_simulation_and_evaluator_time_the_closed_form():
    """One device, a 2-layer Llama, 2 micro-batches: swapping cuDNN's kernel for FlashAttention-2 moves
    the simulated iteration by 2 x 2 x the closed forms' difference (forward and backward of each
    attention core), and the evaluator agrees with the simulation for each kernel."""
    kw = dict(stack="megatron-core", dp=1, microbatch_size=1, num_microbatches=2, dtype="bf16",
              tp_comm_overlap=False, sequence_parallel=False)
    times, cores = {}, {}
    for kernel in ("cudnn_attention", "flash_attention"):
        fused = [kernel, "bias_dropout_add"]
        r = simulate("llama3-8b", "dgx-h100", overrides=LLAMA, nodes=1, fused_kernels=fused, **kw)
        est = estimate_strategy("llama3-8b", "dgx-h100", overrides=LLAMA, nodes=1, fused_kernels=fused, **kw)
        assert est["iteration_time_s"] == pytest.approx(r.iteration_time_s, rel=1e-9)
        times[kernel] = r.iteration_time_s
        layer = build_model("att", "bf16", (4096, 1024), "tokens", [
            {"name": "att", "type": "attention", "heads": 8, "kv_heads": 8, "causal": True, "bias": False,
             "rotary": True}]).layers[0]
        cost = layer_cost(layer, 1, "bf16", frozenset(fused))
        cores[kernel] = sum(flash_seconds(p, H100, "bf16").seconds for p in (cost.forward, cost.backward_data))
    delta = 2 * 2 * (cores["flash_attention"] - cores["cudnn_attention"])
    assert delta > 0
    assert times["flash_attention"] - times["cudnn_attention"] == pytest.approx(delta, rel=1e-9)


def test_a_malformed_measurement_is_one_clear_error(tmp_path):
    text = (profile_dirs()[0] / "dgx-h100" / "profile.yaml").read_text()
    bad = text.replace("forward_causal_tflops: [410, 484, 518, 529, 539]", "forward_causal_tflops: [410, 484]")
    assert bad != text
    (tmp_path / "profile.yaml").write_text(bad)
    with pytest.raises(SpecError, match="forward_causal_tflops has 2 entries, seq has 5"):
        load_profile(tmp_path)


A100 = load_profile("dgx-a100").device
A100_PEAK = 312e12
"""[A100] 16-bit dense peak, the denominator of the A100 profile's flash-attention fractions."""


def test_a_pair_timed_together_takes_the_measured_time_of_the_pair():
    """[FA2] Figure 4 times forward and backward together on the A100 (rate R, the backward counted as
    2.5 forwards): the forward and its backward of a causal core at 2k take 3.5 W / R, R = 155 TFLOP/s,
    W half the forward's full products; without the mask 187 TFLOP/s and the full products."""
    for causal, rate in ((True, 155e12), (False, 187e12)):
        cost = layer_cost(attention(causal), 1, "bf16", frozenset({"flash_attention"}))
        work = 2 * (2 * L * L * (D // HEADS) * HEADS) / (2 if causal else 1)
        pair = sum(flash_seconds(p, A100, "bf16").seconds for p in (cost.forward, cost.backward_data))
        assert pair == pytest.approx(3.5 * work / rate + 2 * A100.launch_overhead, rel=1e-12)
        assert "timed together" in flash_seconds(cost.forward, A100, "bf16").note
    measured = A100.efficiency.attention["flash_attention"]
    assert measured.at("forward", False, 2048, 128) == pytest.approx(187e12 / A100_PEAK)
    assert measured.at("backward", True, 2048, 64) == pytest.approx(140e12 / A100_PEAK)
    assert measured.at("forward", False, 2048, 96) == pytest.approx(
        (162 + (187 - 162) * math.log(96 / 64) / math.log(2)) * 1e12 / A100_PEAK)


LINE = "          forward_backward_causal_tflops: [99, 133, 155, 173, 182, 189]\n"


@pytest.mark.parametrize("edit, message", [
    ("", "give either forward_backward_tflops, forward_backward_causal_tflops or the per-pass curves"),
    (LINE + "          forward_tflops: [1, 2, 3, 4, 5, 6]\n", "give either"),
])
def test_a_pair_timed_together_needs_both_curves_and_nothing_else(tmp_path, edit, message):
    text = (profile_dirs()[0] / "dgx-a100" / "profile.yaml").read_text()
    bad = text.replace(LINE, edit)
    assert bad != text
    (tmp_path / "profile.yaml").write_text(bad)
    with pytest.raises(SpecError, match=message):
        load_profile(tmp_path)
