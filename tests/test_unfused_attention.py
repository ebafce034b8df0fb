"""An unfused attention core's batched GEMMs at the rate a measured standard-attention chain implies
(`dlsim.cost.unfused`): the chain it was derived from is reproduced exactly, the causal chain it was
not derived from is predicted within the stated tolerance, and the simulation and the evaluator move
by the closed form."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from dlsim.api.analytic import estimate_strategy
from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import simulate
from dlsim.cost.layers import layer_cost
from dlsim.cost.pricing import gemm_seconds
from dlsim.cost.unfused import core_gemm_efficiency
from dlsim.errors import SpecError
from dlsim.io.paths import profile_dirs
from dlsim.io.profile_yaml import load_profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import validate_attention_kernels as vak  # the benchmark's one pricing of the chain

A100 = load_profile("dgx-a100").device
H100 = load_profile("dgx-h100").device
"""No standard-attention chain: [FA3]'s standard attention is not the fp16 chain of [FA2]'s benchmark."""
CAUSAL_TOLERANCE = 0.16
"""The causal chains come out 8-14% fast: besides the added mask (priced), the benchmark builds the
L x L mask in fp32 and casts it on every call (not counted: a few % at 8k)."""


def published(head_dim: int, causal: bool):
    """([FA2] Figure 4's sequence lengths, PyTorch standard attention's TFLOP/s), out-of-memory entries left out."""
    rates = vak.FA2_FIGURE_4[("standard_attention", head_dim, causal)]
    return [(n, r) for n, r in zip(vak.LENGTHS, rates) if r is not None]


@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_measured_chain_is_reproduced_exactly(head_dim):
    """Non-causal, A100: the core's forward and backward as dlsim prices them (the projections left out)
    take 3.5 W / R, R the figure's rate: the unfused core's GEMM rate is derived from it."""
    for length, rate in published(head_dim, False):
        seconds = vak.unfused_seconds(A100, length, head_dim, False)
        assert seconds == pytest.approx(3.5 * vak.work(length, head_dim) / (rate * 1e12), rel=1e-9)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_causal_chains_are_predicted_within_the_tolerance(head_dim):
    """Held out: the A100's causal chain [FA2] (counting half the products) from the non-causal rate plus
    the mask's kernel."""
    for length, rate in published(head_dim, True):
        predicted = vak.predicted_tflops(A100, "standard_attention", length, head_dim, True)
        assert predicted == pytest.approx(rate, rel=CAUSAL_TOLERANCE)


def test_between_and_beyond_the_measured_head_dimensions():
    """Head dimension 96 lies between the measured 64 and 128; 160 holds 128's rate; another dtype or a
    device without the measurement leaves the GEMMs on the roofline."""
    e = {d: core_gemm_efficiency(A100, "bf16", "forward", 2048, d) for d in (64, 96, 128, 160)}
    assert e[64] < e[96] < e[128] == e[160]
    assert core_gemm_efficiency(A100, "fp32", "forward", 2048, 128) is None
    assert core_gemm_efficiency(H100, "bf16", "forward", 2048, 128) is None


def without_chain(name: str):
    cluster = as_cluster(name)
    eff = cluster.device.efficiency
    attention = MappingProxyType({k: v for k, v in eff.attention.items() if k != "standard_attention"})
    return replace(cluster, device=replace(cluster.device, efficiency=replace(eff, attention=attention)))


def test_simulation_and_evaluator_move_by_the_closed_form():
    """One A100, a 2-layer GPT with unfused attention, 2 micro-batches, no recomputation: the measured
    chain adds 2 layers x 2 micro-batches x each core GEMM's difference (forward and backward) to the
    iteration, in the simulation and in the evaluator alike."""
    model = as_model("gpt2")
    kw = dict(overrides={"layers": 2}, dp=1, microbatch_size=1, num_microbatches=2, stack="megatron-lm-2022",
              sequence_parallel=False, recompute="none", dtype="bf16")
    times = {}
    for label, cluster in (("measured", as_cluster("dgx-a100")), ("roofline", without_chain("dgx-a100"))):
        r = simulate("gpt2", cluster, nodes=1, **kw)
        est = estimate_strategy("gpt2", cluster, nodes=1, **kw)
        assert est["iteration_time_s"] == pytest.approx(r.iteration_time_s, rel=1e-9)
        times[label] = r.iteration_time_s
    attn = next(layer for layer in model.layers if layer.type == "attention")
    fused = frozenset({"scale_mask_softmax", "strided_attention", "bias_dropout_add"})
    cost = layer_cost(attn, 1, "bf16", fused)
    delta = 0.0
    for pass_name, p in (("forward", cost.forward), ("backward", cost.backward_data)):
        e = core_gemm_efficiency(A100, "bf16", pass_name, p.unfused.length, p.unfused.head_dim)
        for g in p.gemms:
            if g.count > 1:
                delta += g.flops / (A100.peak_flops["bf16"] * e) + A100.launch_overhead - gemm_seconds(g, A100, "bf16")
    assert delta > 0
    assert times["measured"] - times["roofline"] == pytest.approx(2 * 2 * delta, rel=1e-9)


def test_several_measurements_need_their_head_dimensions(tmp_path):
    text = (profile_dirs()[0] / "dgx-a100" / "profile.yaml").read_text()
    bad = text.replace("        - head_dim: 128\n          seq: [512, 1024, 2048, 4096, 8192]\n",
                       "        - seq: [512, 1024, 2048, 4096, 8192]\n")
    assert bad != text
    (tmp_path / "profile.yaml").write_text(bad)
    with pytest.raises(SpecError, match="distinct head_dim"):
        load_profile(tmp_path)


def test_every_simulation_says_where_its_attention_time_comes_from():
    """The result's notes name the measured kernel, or say that an unmeasured one is the roofline's."""
    def note(model, cluster, **kw):
        r = simulate(model, cluster, nodes=1, dp=1, microbatch_size=1, num_microbatches=1, **kw)
        return next(n for n in r.notes if n.startswith("attention:"))
    assert "flash_attention measured on this device ([FA2]" in note("gpt2", "dgx-a100", stack="pytorch",
                                                                      fused_kernels=["flash_attention"])
    assert "standard-attention chain implies" in note("gpt2", "dgx-a100", stack="megatron-lm-2022")
    unmeasured = note("gpt2", "dgx-a100", stack="megatron-lm-2022", fused_kernels=["cudnn_attention"])
    assert "cudnn_attention has no measurement in dgx-a100's profile" in unmeasured
    assert "flash_attention, xformers_attention" in unmeasured
    assert "no measured standard-attention chain in dgx-h100's profile" in note("gpt2", "dgx-h100",
                                                                              stack="megatron-lm-2022")


def test_the_jean_zay_profile_keeps_the_dgx_a100_device():
    """benchmarks/stack_runs/jean-zay-a100 copies dgx-a100's device data (the same A100 SXM4 80GB; profiles
    have no inheritance): held equal so that a measurement added to one cannot miss the other."""
    root = Path(__file__).resolve().parents[1]
    assert load_profile(root / "benchmarks" / "stack_runs" / "jean-zay-a100").device == A100
