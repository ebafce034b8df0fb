"""Warm tables: the kernels of models whose training step the estimate prices partly warm, timed back to back."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")


def test_auto_warm_tables_for_a_model_that_fits_and_resume(tmp_path):
    from dlsim.api.calibrate_compute import calibrate_compute, warm_matters
    from dlsim.api.estimate import estimate
    from dlsim.api.models import as_model
    from dlsim.io.kernel_tables import read_table
    from dlsim.io.profile_yaml import load_profile
    from dlsim.io.yamlfile import read_yaml
    out = tmp_path / "cpu-warm"
    rec = calibrate_compute(out, models=["lenet5"], batches=[2], grid=False, repeats=1, flush_cache=True,
                            algorithms=["mkldnn"], threads=1, warm="auto")
    assert not rec["failed"]
    cold, warm = read_table("gemm", out / "gemm.csv"), read_table("gemm_warm", out / "gemm-warm.csv")
    assert {r.key for r in warm} == {r.key for r in cold}  # the model's own kernels, both regimes
    assert read_table("conv_warm", out / "conv-warm.csv") and not (out / "device-warm.csv").exists()
    meta = read_yaml(out / "meta.yaml")
    fits, ws = warm_matters(as_model("lenet5"), 2, "fp32", meta["device"]["last_level_cache_bytes"])
    assert fits and meta["runs"][-1]["warm_models_working_set_bytes"] == {"lenet5 batch 2 fp32": ws}
    assert {"gemm_warm", "conv_warm", "memory_warm"} <= set(load_profile(out).tables)
    notes = estimate("lenet5", out, 2).notes
    assert any(n.startswith("cache regime: warm") for n in notes)
    again = calibrate_compute(out, models=["lenet5"], batches=[2], grid=False, repeats=1, flush_cache=True,
                              algorithms=["mkldnn"], threads=1, warm="auto")
    assert again["measured"] == 0


def test_warm_none_and_a_model_too_big_for_the_cache(tmp_path):
    from dlsim.api.calibrate_compute import WARM_REACH, plan, warm_matters
    from dlsim.api.models import as_model
    matters, ws = warm_matters(as_model("alexnet"), 4, "fp32", 32 * 2**20)
    assert not matters and ws > WARM_REACH * 32 * 2**20  # priced within 1/8 of cold: no warm rows
    assert warm_matters(as_model("lenet5"), 64, "fp32", 32 * 2**20)[0]
    kept = plan(["lenet5", "alexnet"], [2, 1], grid=False, only=lambda m, b, d: m.name == "lenet5")
    assert kept == plan(["lenet5"], [2], grid=False)
    from dlsim.api.calibrate_compute import calibrate_compute
    from dlsim.errors import SpecError
    with pytest.raises(SpecError, match="warm"):
        calibrate_compute(tmp_path / "x", warm="tepid", grid=False)
