"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlsim.cli import run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cli(capsys):
    """Run the dlsim CLI in-process; returns (exit code, stdout, stderr)."""
    def invoke(*args: str):
        code = run([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return invoke


@pytest.fixture(autouse=True)
def quick_loop_probe(monkeypatch):
    """A calibration in a test measures the loop probe's shares on one process of each regime (the MLP,
    whose step overflows the cache, and the small MLP, whose step fits), not 28; tests/test_loop_probe.py
    runs the probe itself."""
    import functools

    from dlsim.calibrate import compute_run, loop_probe
    monkeypatch.setattr(compute_run, "loop_probe_rows", functools.partial(loop_probe.loop_probe_rows, 1, ("mlp", "mlp_small")))
