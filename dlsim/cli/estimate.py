"""``dlsim estimate``: one device, one training iteration."""

from __future__ import annotations

import click

from dlsim.api.estimate import estimate
from dlsim.cli import main
from dlsim.cli.options import json_option, parse_overrides, set_option
from dlsim.cli.output import add_assumed, emit_json, json_safe, wants_summary
from dlsim.errors import InfeasibleError
from dlsim.units import format_bytes
from dlsim.report.text import estimate_table


@main.command("estimate")
@click.argument("model")
@click.option("--cluster", "-c", required=True, help="Hardware profile: built-in name or directory.")
@click.option("--batch", type=int, default=None, help="Samples per iteration [default: 32].")
@click.option("--dtype", default=None, help="fp32, tf32, fp16, bf16 (default: the model's).")
@click.option("--optimizer", type=click.Choice(["sgd", "momentum", "adam"]), default=None,
              help="Optimizer (state memory, step) [default: adam].")
@click.option("--model-only", is_flag=True, help="Ignore measured tables; price everything with the roofline model.")
@click.option("--all", "show_all", is_flag=True, help="Show every layer (default: the 25 slowest).")
@set_option
@json_option
def estimate_cmd(model: str, cluster: str, batch: int | None, dtype: str | None, optimizer: str | None, model_only: bool,
                 show_all: bool, overrides: tuple[str, ...], json_out: str | None) -> None:
    """Predict one training iteration of MODEL on one device of a cluster profile.

    Prints per-layer forward / backward times (and where each number came from), the iteration
    time, throughput and memory. Exits with 1 when the iteration does not fit in device memory
    (after printing or writing the record).
    """
    result = estimate(model, cluster, batch, dtype=dtype, optimizer=optimizer, measured=not model_only,
                      overrides=parse_overrides(overrides))
    rec = add_assumed(result.to_dict())
    for line in rec.get("warnings", []):
        click.echo(f"warning: {line}", err=True)
    if json_out is not None:
        emit_json(rec, json_out)
    if wants_summary(json_out):
        json_safe(rec)
        click.echo(estimate_table(rec, None if show_all else 25))
    if rec.get("fits_in_memory") is False:
        need, have = rec.get("memory_bytes", {}), rec.get("memory_capacity_bytes")
        total = need.get("total") if isinstance(need, dict) else need
        short = f": needs {format_bytes(total)}, the device has {format_bytes(have)}" \
            if isinstance(total, (int, float)) and isinstance(have, (int, float)) else ""
        raise InfeasibleError(f"does not fit in device memory{short} (batch {rec.get('batch')})")
