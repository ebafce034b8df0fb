"""Knowing the host (issue 15 item 5): a profile records its host; another host warns with the speed ratio;
``calibrate compute --quick`` re-times a few entries against a tolerance."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import yaml

from dlsim.calibrate.host_probe import compare_hosts, host_identity
from dlsim.calibrate.quick_check import pick_gemms, verdict
from dlsim.cost.lookup import GemmRow

ROOT = Path(__file__).resolve().parents[1]
CPUINFO = """processor\t: 0
model name\t: Fake CPU 9000
flags\t\t: fpu sse4_2 avx avx2 fma avx512f amx_tile
processor\t: 1
model name\t: Fake CPU 9000
flags\t\t: fpu sse4_2 avx avx2 fma avx512f amx_tile
"""


def _speeds(gemm_gflops: float, stream_gbs: float):
    return lambda threads: {"threads": threads or 2, "gemm_flops_per_s": gemm_gflops * 1e9,
                            "stream_bytes_per_s": stream_gbs * 1e9}


def test_identity_from_cpuinfo():
    ident = host_identity(CPUINFO)
    assert ident["cpu"] == "Fake CPU 9000" and ident["logical_cpus"] == 2
    assert ident["isa_flags"] == ["amx_tile", "avx", "avx2", "avx512f", "fma", "sse4_2"]
    other = host_identity(CPUINFO.replace(" avx512f", ""))
    assert other["flags_sha1"] != ident["flags_sha1"]


def test_same_host_measures_nothing():
    ident = host_identity(CPUINFO)
    def never(_threads):
        raise AssertionError("the same host must not be timed")
    assert compare_hosts({**ident, "threads": 2}, ident, speeds=never).same


def test_other_host_gives_the_measured_ratio():
    recorded = {**host_identity(CPUINFO), "threads": 2,
                "reference": {"gemm_gflop_per_s": 200.0, "stream_gbyte_per_s": 40.0}}
    here = host_identity(CPUINFO.replace("Fake CPU 9000", "Other CPU 1"))
    c = compare_hosts(recorded, here, speeds=_speeds(100.0, 30.0))
    assert not c.same and c.differences == ("cpu",)
    assert c.gemm_ratio == pytest.approx(0.5) and c.stream_ratio == pytest.approx(0.75)
    line = c.line("p", recorded)
    assert "0.50x" in line and "0.75x" in line and "Fake CPU 9000" in line and "\n" not in line


def _fake_profile(tmp_path: Path, cpu: str = "Intel Xeon Faked 1234", gemm_gflops: float = 1e4) -> Path:
    src = ROOT / "hardware_profiles" / "cpu-epyc-2core"
    out = tmp_path / "faked"
    out.mkdir()
    for name in ("profile.yaml", "gemm.csv", "conv.csv", "memory.csv", "device.csv", "gemm-warm.csv",
                 "conv-warm.csv", "memory-warm.csv"):
        shutil.copy(src / name, out / name)
    meta = yaml.safe_load((src / "meta.yaml").read_text())
    meta["host"] = {"cpu": cpu, "logical_cpus": 2, "flags_sha1": "000000000000", "threads": 2,
                    "reference": {"gemm_gflop_per_s": gemm_gflops, "stream_gbyte_per_s": 1e3}}
    (out / "meta.yaml").write_text(yaml.safe_dump(meta))
    return out


@pytest.mark.torch
def test_prediction_on_another_host_warns_with_ratio(tmp_path, monkeypatch, cli):
    pytest.importorskip("torch")
    import dlsim.api.hostcheck as hc
    from dlsim.api.estimate import estimate
    monkeypatch.setattr(hc, "_speeds", lambda when: _speeds(50.0, 20.0))
    hc._checked.cache_clear()
    prof = _fake_profile(tmp_path, gemm_gflops=200.0)
    rec = estimate("lenet5", prof / "profile.yaml", 4).to_dict()
    assert len(rec["warnings"]) == 1
    w = rec["warnings"][0]
    assert "another host" in w and "Intel Xeon Faked 1234" in w and "0.25x" in w and "0.02x" in w
    assert rec["host"]["gemm_ratio"] == pytest.approx(0.25)
    # the CLI prints it as one warning line on stderr
    hc._checked.cache_clear()
    code, _, err = cli("estimate", "lenet5", "-c", prof, "--batch", "4")
    assert code == 0 and [ln for ln in err.splitlines() if ln.startswith("warning:")] == [f"warning: {w}"]


@pytest.mark.torch
def test_the_host_check_is_measured_once_per_host(tmp_path, monkeypatch):
    """Every estimate with a CPU profile measured on another host spent 10-17 s probing this host again
    (issue 34): this host's reference speeds are timed once and kept in the host cache with their date."""
    pytest.importorskip("torch")
    import dlsim.api.hostcheck as hc
    from dlsim.api.estimate import estimate
    from dlsim.calibrate import host_probe
    monkeypatch.setenv("DLSIM_CACHE_DIR", str(tmp_path / "cache"))
    timed = []
    monkeypatch.setattr(host_probe, "reference_speeds", lambda threads: timed.append(threads) or
                        _speeds(50.0, 20.0)(threads))
    prof = _fake_profile(tmp_path, gemm_gflops=200.0)
    for _ in range(3):  # three predictions, as three processes would make them
        hc._checked.cache_clear()
        rec = estimate("lenet5", prof, 4).to_dict()
        assert rec["host"]["gemm_ratio"] == pytest.approx(0.25)
    assert timed == [2] and rec["host"]["speeds_measured"].startswith("20")  # a date: taken from the cache
    monkeypatch.setenv("DLSIM_CACHE_DIR", "off")  # the cache turned off: timed every time
    hc._checked.cache_clear()
    estimate("lenet5", prof, 4)
    assert timed == [2, 2]


@pytest.mark.torch
def test_prediction_with_real_probe(tmp_path):
    """The real reference kernels run (about 2 s) and give positive ratios against an absurd record."""
    pytest.importorskip("torch")
    import dlsim.api.hostcheck as hc
    from dlsim.api.estimate import estimate
    hc._checked.cache_clear()
    prof = _fake_profile(tmp_path, gemm_gflops=1e6)
    host = estimate("lenet5", prof, 4).to_dict()["host"]
    assert not host["same_host"] and 0 < host["gemm_ratio"] < 0.1 and 0 < host["stream_ratio"] < 1.0


@pytest.mark.torch
def test_profile_without_host_is_noted_not_warned():
    pytest.importorskip("torch")
    import dlsim.api.hostcheck as hc
    from dlsim.api.estimate import estimate
    hc._checked.cache_clear()
    meta = yaml.safe_load((ROOT / "hardware_profiles" / "cpu-epyc-2core" / "meta.yaml").read_text())
    rec = estimate("lenet5", "cpu-epyc-2core", 4).to_dict()
    if "host" in meta:
        assert "host" in rec
    else:
        assert "warnings" not in rec and any("records no host" in n for n in rec["notes"])


def test_pick_and_verdict():
    rows = [GemmRow("fp32", m, 64, 64, 1, t) for m, t in ((1, 1e-4), (2, 2e-3), (4, 4e-3), (8, 8e-3), (16, 1.6e-2),
                                                           (32, 0.5))]
    picked = pick_gemms(rows, 3)
    assert [r.m for r in picked] == [2, 4, 16]
    v = verdict([1.02, 0.97, 1.05])
    assert v.hold and v.max_abs == pytest.approx(0.05)
    assert not verdict([1.02, 0.97, 1.4]).hold        # one entry beyond the worst-case tolerance
    assert not verdict([1.12, 1.15, 1.13]).hold       # the median beyond its tolerance
    assert "no longer hold" in verdict([3.0]).line()


@pytest.mark.torch
def test_quick_detects_stale_tables(tmp_path):
    """Tables whose times are a third of this machine's do not hold; the host is not recorded then."""
    pytest.importorskip("torch")
    from dlsim.api.calibrate_quick import quick_check
    src = ROOT / "hardware_profiles" / "cpu-epyc-2core"
    out = tmp_path / "stale"
    out.mkdir()
    rows = list(csv.DictReader(open(src / "gemm.csv")))
    keep = [r for r in rows if r["set"] == "grid" and r["count"] == "1" and r["dtype"] == "fp32"
            and 1e-3 <= float(r["time_s"]) <= 8e-3][:20]
    with open(out / "gemm.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in keep:
            w.writerow({**r, "time_s": str(float(r["time_s"]) / 3.0)})
    meta = yaml.safe_load((src / "meta.yaml").read_text())
    meta.pop("host", None)
    (out / "meta.yaml").write_text(yaml.safe_dump(meta))
    rec = quick_check(out, gemms=3, passes=1)
    assert not rec["hold"] and rec["mean_time_ratio"] > 1.5 and len(rec["entries"]) == 3
    assert rec["wall_s"] < 30
    after = yaml.safe_load((out / "meta.yaml").read_text())
    assert "host" not in after and after["checks"][-1]["hold"] is False


def test_quick_without_calibration_is_one_line(tmp_path, cli):
    code, out, err = cli("calibrate", "compute", "--quick", "--out", tmp_path)
    assert code == 1 and "give --model and --batch" in err and len(err.strip().splitlines()) == 1


@pytest.mark.torch
def test_quick_on_a_new_directory_calibrates_the_model_only(tmp_path, cli, monkeypatch):
    """--quick is the fast path: on a new OUT the --model kernels in one pass of 3 calls, no generic grid; on
    an OUT that holds a calibration it checks it."""
    pytest.importorskip("torch")
    from test_host_probes import Fakes, tiny_model
    Fakes(monkeypatch)  # the host probes are tests/test_host_probes.py's
    out = tmp_path / "quick"
    code, text, err = cli("calibrate", "compute", "--quick", "--out", out, "--model", tiny_model(tmp_path),
                          "--batch", "2", "--no-flush-cache", "-q")
    assert code == 0, err
    run = yaml.safe_load((out / "meta.yaml").read_text())["runs"][-1]
    assert (run["grid"], run["passes"]) == (False, 1) and "quick calibration" in err
    assert {r["set"] for r in csv.DictReader(open(out / "gemm.csv"))} == {"model"}
    assert (out / "profile.yaml").exists()
