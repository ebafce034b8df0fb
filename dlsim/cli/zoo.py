"""``dlsim models``, ``dlsim profiles``, ``dlsim model show``."""

from __future__ import annotations

import click

from dlsim.api.models import describe_model, profiles as list_profile_records, zoo
from dlsim.cli import main
from dlsim.cli.options import json_option, parse_overrides, set_option
from dlsim.cli.output import add_assumed, emit_record
from dlsim.report.text import model_table, models_table, profiles_table


@main.command("models")
@json_option
def models_cmd(json_out: str | None) -> None:
    """List the built-in model zoo."""
    emit_record(zoo(), json_out, models_table)


@main.command("profiles")
@json_option
def profiles_cmd(json_out: str | None) -> None:
    """List the built-in hardware profiles."""
    emit_record(list_profile_records(), json_out, profiles_table)


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
    emit_record(add_assumed(describe_model(model, batch, dtype, parse_overrides(overrides))), json_out, model_table)
