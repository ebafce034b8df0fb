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
