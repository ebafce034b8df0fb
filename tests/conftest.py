"""Shared fixtures."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from dlsim.cli import run

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    """A test marked `torch` skips, saying why and what to install, when PyTorch is not installed: the
    README's test command passes in a fresh venv without the `hardware` extra, and CI's second leg selects
    these tests with `-m torch` (tests/test_extras_marked.py holds every torch test to the marker)."""
    if importlib.util.find_spec("torch") is not None:
        return
    skip = pytest.mark.skip(reason="needs PyTorch: pip install torch (see docs/install.md)")
    for item in items:
        if item.get_closest_marker("torch") is not None:
            item.add_marker(skip)


@pytest.fixture
def cli(capsys):
    """Run the dlsim CLI in-process; returns (exit code, stdout, stderr)."""
    def invoke(*args: str):
        code = run([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return invoke


@pytest.fixture(scope="session")
def session_host_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("host-cache")


@pytest.fixture(autouse=True)
def quick_host_probes(monkeypatch, session_host_cache):
    """Every test's host probes go to one host cache of the test session (never the user's,
    `dlsim.io.host_cache`): measured by the first calibration that needs them, reused by the rest (a property
    of the host; each probe process is a new interpreter that takes seconds). The loop probe runs one process
    of each regime (the MLP, whose step overflows the cache, and the small MLP, whose step fits), not 28;
    tests/test_loop_probe.py runs the probe itself."""
    from dlsim.api import host_probes
    from dlsim.cost.allocation import REFAULT_QUANTITY
    from dlsim.cost.hostops import OPTIMIZER_FIT_QUANTITY
    monkeypatch.setenv("DLSIM_CACHE_DIR", str(session_host_cache))
    monkeypatch.setattr(host_probes, "ROUNDS", 1)
    monkeypatch.setattr(host_probes, "NETWORKS", {REFAULT_QUANTITY: ("mlp",), OPTIMIZER_FIT_QUANTITY: ("mlp_small",)})


def profile_with_rate(tmp_path: Path, rate: float, alpha: float | None = None) -> Path:
    """A copy of the committed CPU profile with a measured fresh-memory rate (2 threads; 3x that with 1) and,
    optionally, a heap re-fault fraction α in its device.csv."""
    src = ROOT / "hardware_profiles" / "cpu-epyc-2core"
    out = tmp_path / "prof"
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("passes", "1thread", "median-run", "single-pass-run"))
    text = (out / "device.csv").read_text()
    with open(out / "device.csv", "a") as f:
        f.write("" if text.endswith("\n") else "\n")
        f.write(f"fresh_memory_s_per_byte_t1,{rate * 3},s/byte,test\nfresh_memory_s_per_byte_t2,{rate},s/byte,test\n")
        if alpha is not None:
            f.write(f"heap_refault_fraction,{alpha},fraction,test\n")
    return out
