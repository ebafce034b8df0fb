"""``dlsim import torch``: a PyTorch module as a dlsim YAML description."""

from __future__ import annotations

from pathlib import Path

import click

from dlsim.cli import main
from dlsim.errors import SpecError


@main.group("import")
def import_group() -> None:
    """Import a network from another framework."""


@import_group.command("torch")
@click.argument("factory")
@click.option("--input-shape", required=True, help="Per-sample input shape, e.g. 3,224,224 (or L for --tokens).")
@click.option("--tokens", is_flag=True, help="The input is integer token ids.")
@click.option("--name", default=None, help="Model name (default: the factory's name).")
@click.option("--out", "-o", type=click.Path(path_type=Path), default=None, help="Write the YAML here (default: print).")
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
def torch_cmd(factory: str, input_shape: str, tokens: bool, name: str | None, out: Path | None, force: bool) -> None:
    """Trace FACTORY (FILE.py:NAME or module:NAME, a module or a function returning one) with torch.fx."""
    from dlsim.api.importers import import_torch

    try:
        shape = [int(d) for d in input_shape.replace("x", ",").split(",") if d.strip()]
    except ValueError:
        raise SpecError(f"--input-shape must be integers like 3,224,224, got {input_shape!r}") from None
    text = import_torch(factory, shape, tokens=tokens, name=name, out=out, force=force)
    if out is None:
        click.echo(text, nl=False)
    else:
        click.echo(f"wrote {out}", err=True)
