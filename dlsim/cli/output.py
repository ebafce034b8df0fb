"""Output helpers shared by commands: JSON to stdout or to a file (written atomically)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from dlsim.io.files import write_atomic


def emit_json(record: Any, destination: str | None) -> None:
    """Print `record` as JSON (destination ``-`` or None) or write it to a file."""
    text = json.dumps(record, indent=2) + "\n"
    if destination in (None, "-"):
        click.echo(text, nl=False)
    else:
        write_atomic(Path(destination), text)
        click.echo(f"wrote {destination}", err=True)
