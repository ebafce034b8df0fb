"""DDP validation pieces that need no root: the link fit, the 2-host profile, plan de-duplication, allocator."""

from pathlib import Path

import pytest

from dlsim.api.validate import ddp_profile_text, fit_link
from dlsim.errors import SpecError
from dlsim.io.profile_yaml import load_profile
from dlsim.units import GBYTE_PER_S, US


def _rows(alpha, beta, sizes, burst=65536):
    # a token-bucket link: messages up to the bucket go at 10x the rate
    return [{"bytes": n, "one_way_s": alpha + n * beta / (10 if n <= burst else 1)} for n in sizes]


def test_fit_link_recovers_hockney_parameters_from_rate_limited_sizes():
    sizes = [4**e for e in range(5, 13)]
    fit = fit_link(_rows(100e-6, 1 / 25e6, sizes))
    assert fit["latency_s"] == pytest.approx(100e-6 + 1024 / 25e6 / 10)  # one-way time of the smallest message
    assert fit["bandwidth_bytes_per_s"] == pytest.approx(25e6, rel=1e-6)
    assert fit["large_message_median_abs_rel_error"] < 0.01


def test_fit_link_needs_two_large_sizes():
    with pytest.raises(SpecError):
        fit_link(_rows(1e-4, 1e-8, [1024, 4096, 1 << 20]))


def test_ddp_profile_loads_with_the_fitted_link(tmp_path: Path):
    base = tmp_path / "profile.yaml"
    base.write_text("name: one\ndevice: {name: cpu, peak_tflops: {fp32: 0.1}, memory_gib: 1, "
                    "memory_bandwidth_gbytes_per_s: 10}\nintra_node: {name: none, latency_us: 0, "
                    "bandwidth_gbytes_per_s: 10}\n")
    link = {"latency_s": 120e-6, "bandwidth_bytes_per_s": 24e6, "median_abs_rel_error": 0.1, "points": 8}
    out = tmp_path / "two.yaml"
    out.write_text(ddp_profile_text(base, link, hosts=2, rate="200mbit", name="two"))
    c = load_profile(out)
    assert (c.nodes, c.devices_per_node) == (2, 1)
    assert c.inter.latency == pytest.approx(120 * US)
    assert c.inter.bandwidth == pytest.approx(0.024 * GBYTE_PER_S)


def test_plan_measures_a_gemm_on_the_grid_and_in_a_model_once():
    from dlsim.api.calibrate_compute import plan
    from dlsim.calibrate.compute_plan import GemmTask
    tasks = plan(["lenet5"], [64], grid=True)
    keys = [(t.dtype, t.gemm) for t in tasks if isinstance(t, GemmTask)]
    assert len(keys) == len(set(keys))


def test_retain_freed_memory_applies_on_glibc():
    import platform
    from dlsim.calibrate.compute_timer import retain_freed_memory
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    assert retain_freed_memory() is True
