"""A device's sustained matrix throughput (`Device.sustained_matrix_fraction`, `dlsim.cost.roofline`):
every matrix-unit efficiency times s, once; memory-bound and vector work untouched; the simulation of a
compute-bound chain moves by exactly the closed form."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlsim.api.simulate import simulate
from dlsim.cost.layers import layer_cost
from dlsim.cost.pricing import price_pass
from dlsim.cost.roofline import compute_efficiency, memory_efficiency, roofline_time
from dlsim.errors import SpecError
from dlsim.io.paths import profile_dirs
from dlsim.io.profile_yaml import load_profile
from dlsim.spec.model import build_model

H100 = load_profile("dgx-h100")
BURST = replace(H100, device=replace(H100.device, sustained_matrix_fraction=1.0))
S = 0.915
"""dgx-h100: [FRYER] ~730 TFLOPS sustained over [TORCHMM] 797.51 burst, bf16 8192^3 (profile.yaml)."""
WIDTH, TOKENS = 8192, 4096


def test_the_profile_states_the_sustained_fraction_of_its_sources():
    assert H100.device.sustained_matrix_fraction == S
    assert 730 / 797.51 == pytest.approx(S, abs=5e-4)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp8", "fp32"])
@pytest.mark.parametrize("gflop", [1.0, 137.0, 1100.0])
def test_matrix_efficiency_is_the_burst_curve_times_s_once(dtype, gflop):
    """fp8 goes through the bf16 curve and the fp8 ratio: s applies once, not twice."""
    w = gflop * 1e9
    assert compute_efficiency(w, H100.device, dtype) == pytest.approx(S * compute_efficiency(w, BURST.device, dtype),
                                                                    rel=1e-12)
    if dtype == "fp8":
        assert compute_efficiency(w, H100.device, "fp8") == pytest.approx(
            S * 0.883 * compute_efficiency(w, BURST.device, "bf16"), rel=1e-12)


def test_memory_bound_and_vector_work_is_not_scaled():
    assert compute_efficiency(1e9, H100.device, "bf16", matrix=False) == compute_efficiency(
        1e9, BURST.device, "bf16", matrix=False)
    assert memory_efficiency(1e8, H100.device) == memory_efficiency(1e8, BURST.device)
    t = roofline_time(1e6, 1e9, H100.device, "bf16", matrix=False)
    assert t.seconds == roofline_time(1e6, 1e9, BURST.device, "bf16", matrix=False).seconds


def chain():
    entries = [{"name": f"fc{i}", "type": "linear", "out_features": WIDTH, "bias": False} for i in range(2)]
    return build_model("chain", "bf16", (WIDTH,), "tensor", entries)


def test_simulation_of_a_compute_bound_chain_moves_by_the_closed_form():
    """Two 4096 x 8192 x 8192 linear layers on one H100, two micro-batches: each pass's GEMM time
    (t − launches) is 1/s of its burst time, and the simulated iteration moves by the sum of those
    (the first layer's input needs no gradient: no ∇x there)."""
    model = chain()
    kw = dict(dp=1, microbatch_size=TOKENS, num_microbatches=2, dtype="bf16", stack="pytorch")
    t_s = simulate(model, H100, nodes=1, **kw).iteration_time_s
    t_b = simulate(model, BURST, nodes=1, **kw).iteration_time_s
    delta = 0.0
    for i, layer in enumerate(model.layers):
        cost = layer_cost(layer, TOKENS, "bf16")
        for name in ("forward", "backward_weight") + (("backward_data",) if i else ()):
            p = getattr(cost, name)
            launch = p.kernels * H100.device.launch_overhead
            burst = price_pass(p, "linear", name, BURST.device, "bf16").seconds - launch
            sustained = price_pass(p, "linear", name, H100.device, "bf16").seconds - launch
            assert sustained == pytest.approx(burst / S, rel=1e-12)  # compute-bound
            delta += 2 * (sustained - burst)
    assert delta > 0
    assert t_s - t_b == pytest.approx(delta, rel=1e-9)


@pytest.mark.parametrize("value", ["0", "1.2", "-0.5"])
def test_a_fraction_out_of_range_is_one_clear_error(tmp_path, value):
    text = (profile_dirs()[0] / "dgx-h100" / "profile.yaml").read_text()
    bad = text.replace("sustained_matrix_fraction: 0.915", f"sustained_matrix_fraction: {value}")
    assert bad != text
    (tmp_path / "profile.yaml").write_text(bad)
    with pytest.raises(SpecError, match="sustained_matrix_fraction"):
        load_profile(tmp_path)
