"""Options shared by several commands."""

from __future__ import annotations

from typing import Any, Callable

import click
import yaml

from dlsim.errors import SpecError

json_option: Callable = click.option(
    "--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
    help="Print the result record as JSON (or write it to FILE).")

set_option: Callable = click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE",
    help="Override a model parameter, e.g. --set layers=48 (repeatable).")


def parse_overrides(items: tuple[str, ...]) -> dict[str, Any]:
    """``("layers=48", "hidden=4096")`` → ``{"layers": 48, "hidden": 4096}`` (values read as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"--set needs KEY=VALUE, got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out
