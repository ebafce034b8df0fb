"""``dlsim import torch`` / ``dlsim import onnx``: a network from another framework as a dlsim YAML description."""

from __future__ import annotations

from pathlib import Path

import click

from dlsim.cli import main
from dlsim.cli.output import OutputFile, force_option, forced
from dlsim.errors import SpecError

_CLUSTER_HELP = "Profile the fallback report prices the network on (default: cpu-epyc-2core)."


@main.group("import")
def import_group() -> None:
    """Import a network from another framework."""


def _emit(imported, out: str | None) -> None:  # noqa: ANN001
    if out is None:
        click.echo(imported.text, nl=False)
    click.echo(imported.report(), err=True)
    if out is not None:
        click.echo(f"wrote {out}", err=True)


@import_group.command("torch")
@click.argument("factory")
@click.option("--input-shape", required=True, help="Per-sample input shape, e.g. 3,224,224 (or L for --tokens).")
@click.option("--tokens", is_flag=True, help="The input is integer token ids.")
@click.option("--vocab", type=int, default=2, show_default=True, help="Token ids are drawn below this (--tokens).")
@click.option("--batch", type=int, default=2, show_default=True, help="Example batch the module is traced with (>= 2).")
@click.option("--name", default=None, help="Model name (default: the factory's name).")
@click.option("--cluster", default=None, help=_CLUSTER_HELP)
@click.option("--out", "-o", type=OutputFile(), default=None, help="Write the YAML here (default: print).")
@force_option
def torch_cmd(factory: str, input_shape: str, tokens: bool, vocab: int, batch: int, name: str | None,
              cluster: str | None, out: str | None) -> None:
    """Capture FACTORY (FILE.py:NAME or module:NAME, a module or a function returning one) with torch.export,
    forward and backward, at the operator level; operators dlsim has no model for are priced as generic
    (their FLOPs and bytes as PyTorch runs them) and listed with their share of the predicted step."""
    from dlsim.api.importers import import_torch_file

    try:
        shape = [int(d) for d in input_shape.replace("x", ",").split(",") if d.strip()]
    except ValueError:
        raise SpecError(f"--input-shape must be integers like 3,224,224, got {input_shape!r}") from None
    if not shape or any(d < 1 for d in shape):
        raise SpecError(f"--input-shape must be positive integers like 3,224,224, got {input_shape!r}")
    if vocab < 1:
        raise SpecError(f"--vocab must be positive, got {vocab}")
    imported = import_torch_file(factory, shape, batch=batch, tokens=tokens, vocab=vocab, name=name,
                                 out=Path(out) if out else None, force=forced(), cluster=cluster)
    _emit(imported, out)


@import_group.command("onnx")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--batch", type=int, default=None, help="Batch the report prices the step at (default: 2, or the graph's fixed batch).")
@click.option("--name", default=None, help="Model name (default: the file's name).")
@click.option("--cluster", default=None, help=_CLUSTER_HELP)
@click.option("--out", "-o", type=OutputFile(), default=None, help="Write the YAML here (default: print).")
@force_option
@click.option("--buffers", default="", help="Initializers that are registered buffers, not parameters, comma-separated "
              "(ONNX does not mark them; the report names those it counted but could not tell).")
def onnx_cmd(file: Path, batch: int | None, name: str | None, cluster: str | None, out: str | None,
             buffers: str) -> None:
    """Import FILE.onnx: shapes by onnx shape inference, operators mapped as for torch, the same report."""
    from dlsim.api.importers import import_onnx_file

    names = [n.strip() for n in buffers.split(",") if n.strip()]
    imported = import_onnx_file(file, name=name, out=Path(out) if out else None, force=forced(), cluster=cluster,
                                batch=batch, buffers=names)
    _emit(imported, out)
