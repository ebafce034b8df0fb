"""``dlsim models``, ``dlsim profiles``, ``dlsim model show``."""

from __future__ import annotations

import click

from dlsim.api.models import describe_model, profiles as list_profile_records, zoo
from dlsim.cli import main
from dlsim.cli.options import json_option, parse_overrides, set_option
from dlsim.cli.output import add_assumed, emit_json, json_safe, wants_summary
from dlsim.report.text import model_table, models_table, profiles_table


@main.command("models")
@json_option
def models_cmd(json_out: str | None) -> None:
    """List the built-in model zoo."""
    rows = zoo()
    if json_out is not None:
        emit_json(rows, json_out)
    if wants_summary(json_out):
        json_safe(rows)
        click.echo(models_table(rows))


@main.command("profiles")
@json_option
def profiles_cmd(json_out: str | None) -> None:
    """List the built-in hardware profiles."""
    rows = list_profile_records()
    if json_out is not None:
        emit_json(rows, json_out)
    if wants_summary(json_out):
        json_safe(rows)
        click.echo(profiles_table(rows))


@main.group("model")
def model_group() -> None:
    """Inspect a network description."""


@model_group.command("show")
@click.argument("model")
@click.option("--batch", type=int, default=1, show_default=True, help="Samples per batch.")
@click.option("--dtype", default=None, help="Data type (default: the model's).")
@set_option
@json_option
def show_cmd(model: str, batch: int, dtype: str | None, overrides: tuple[str, ...], json_out: str | None) -> None:
    """Per-layer output shape, parameters, FLOPs, work/depth per pass and activation memory.

    MODEL is a zoo name (see `dlsim models`) or a path to a YAML description.
    """
    rec = add_assumed(describe_model(model, batch, dtype, parse_overrides(overrides)))
    if json_out is not None:
        emit_json(rec, json_out)
    if wants_summary(json_out):
        json_safe(rec)
        click.echo(model_table(rec))
