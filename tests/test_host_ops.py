"""Host time per ATen operator: counted per captured layer, measured by a probe, charged by the estimate
(`dlsim.importers.torch_export`, `dlsim.calibrate.host_ops`, `dlsim.cost.hostops`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dlsim.errors import SpecError
from dlsim.spec.model import build_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.torch
def test_captured_layers_count_the_operators_an_eager_step_dispatches():
    torch = pytest.importorskip("torch")
    import torchnets
    from dlsim.importers.torch_export import capture
    from dlsim.importers.torch_meter import dispatch_counter
    for name in ("tensor_ops", "resnet"):  # resnet: the batch norms' counters (folded nodes) are charged too
        net, x = torchnets.build(name)
        captured = capture(net, (x,), measure=False)
        counts = [n.entry["host_ops"] for n in captured.nodes if "host_ops" in n.entry]
        with dispatch_counter() as fwd:
            y = net(x)
        with dispatch_counter() as bwd:
            torch.autograd.backward([y], [torch.randn_like(y)])
        assert sum(c[0] for c in counts) == fwd.count
        # the engine's own operator outside any autograd node (the output gradient's copy) is nobody's
        assert bwd.count - 1 <= sum(c[1] for c in counts) <= bwd.count


def test_estimate_charges_the_measured_rate_per_operator(tmp_path):
    from dlsim.api.estimate import estimate
    prof = tmp_path / "prof"
    shutil.copytree(ROOT / "hardware_profiles" / "cpu-epyc-2core", prof,
                    ignore=shutil.ignore_patterns("passes", "1thread", "median-run", "single-pass-run"))
    entries = [{"name": "fc", "type": "linear", "out_features": 8, "host_ops": [3, 7]},
               {"name": "act", "type": "relu", "host_ops": [1, 2]},
               {"name": "view", "type": "reshape", "shape": [2, 4], "host_ops": [1, 1]}]
    model = build_model("m", "fp32", (16,), "tensor", entries)
    before = estimate(model, prof, 4, optimizer="sgd")
    with open(prof / "device.csv", "a") as handle:
        handle.write("host_op_forward_s,1e-05,s,probe\nhost_op_backward_s,2e-06,s,probe\n")
    after = estimate(model, prof, 4, optimizer="sgd")
    extra = {t.name: (a.forward.seconds - t.forward.seconds, a.backward_data.seconds - t.backward_data.seconds)
             for t, a in zip(before.layers, after.layers)}
    assert extra["fc"] == pytest.approx((3e-5, 14e-6), rel=1e-9)
    assert extra["act"] == pytest.approx((1e-5, 4e-6), rel=1e-9)
    assert extra["view"] == pytest.approx((1e-5, 2e-6), rel=1e-9)
    assert any("per ATen operator" in n for n in after.notes)
    assert after.optimizer_step.seconds == before.optimizer_step.seconds  # no in-loop extra measured: as timed
    with open(prof / "device.csv", "a") as handle:
        handle.write("optimizer_in_loop_extra_s,5e-05,s,probe\n")
    looped = estimate(model, prof, 4, optimizer="sgd")
    from dlsim.api.models import as_cluster
    from dlsim.io.kernel_tables import load_kernel_times
    tables, _ = load_kernel_times(as_cluster(prof))
    cold = getattr(tables, "cold", tables).optimizer_step("sgd", model.params, 1)
    assert looped.optimizer_step.seconds == pytest.approx(cold.seconds + 5e-5, rel=1e-9)
    assert "flushed cache" in looped.optimizer_step.note and "in the loop" in looped.optimizer_step.note


def test_bad_host_ops_is_one_line():
    with pytest.raises(SpecError, match="host_ops must be"):
        build_model("m", "fp32", (16,), "tensor", [{"name": "a", "type": "relu", "host_ops": [1, -2]}])


def test_optimizer_step_in_the_loop_follows_the_steps_footprint(tmp_path):
    """A step whose footprint fits the last-level cache (32 MiB in this profile) pays the back-to-back row
    + h_fit; one that overflows it pays the flushed-cache row + h (dlsim.cost.hostops)."""
    from dlsim.api.estimate import estimate
    from dlsim.calibrate.compute_plan import step_signature
    prof = tmp_path / "prof"
    shutil.copytree(ROOT / "hardware_profiles" / "cpu-epyc-2core", prof,
                    ignore=shutil.ignore_patterns("passes", "1thread", "median-run", "single-pass-run"))
    model = build_model("m", "fp32", (16,), "tensor",
                        [{"name": "fc", "type": "linear", "out_features": 8, "host_ops": [3, 7]}])
    signature = step_signature("sgd", model.params, 1)
    for table, seconds in (("memory.csv", 3e-4), ("memory-warm.csv", 1e-4)):
        with open(prof / table, "a") as handle:
            handle.write(f"fp32,sgd,step,{signature},1000,100,{seconds},0,12,model\n")
    with open(prof / "device.csv", "a") as handle:
        handle.write("host_op_forward_s,1e-05,s,probe\nhost_op_backward_s,2e-06,s,probe\n"
                     "optimizer_in_loop_extra_s,5e-05,s,probe\noptimizer_in_loop_extra_fit_s,2e-05,s,probe\n")
    fits = estimate(model, prof, 4, optimizer="sgd").optimizer_step
    assert fits.seconds == pytest.approx(1e-4 + 2e-5, rel=1e-9) and "back to back" in fits.note
    # 2^21 samples: the layer's 8-wide fp32 output alone is 64 MiB, twice the cache
    overflows = estimate(model, prof, 2**21, optimizer="sgd").optimizer_step
    assert overflows.seconds == pytest.approx(3e-4 + 5e-5, rel=1e-9) and "flushed cache" in overflows.note
