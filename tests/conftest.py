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
def quick_refault_probe(monkeypatch):
    """A calibration in a test measures the heap re-fault fraction on one probe process (the MLP), not
    eight; tests/test_refault_probe.py runs the probe itself."""
    import functools

    from dlsim.calibrate import compute_run, refault_probe
    monkeypatch.setattr(compute_run, "refault_rows", functools.partial(refault_probe.refault_rows, 1, ("mlp",)))
