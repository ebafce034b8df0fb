"""Options shared by several commands."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import click
import yaml

from dlsim.cli.output import OutputFile, force_option
from dlsim.errors import SpecError, excerpt
from dlsim.io.yamlfile import parse_yaml_text, yaml_problem

class FiniteFloat(click.types.FloatParamType):
    """A float option's type that refuses ``nan`` and ``inf`` (which click's float reads) as a usage error:
    no option of dlsim means anything by them, and a NaN slips past every ``<= 0`` check."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


FINITE_FLOAT = FiniteFloat()

_json_flag: Callable = click.option(
    "--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]", type=OutputFile(),
    help="Print the result record as JSON, or write it to FILE (never over an input; an existing FILE only "
         "with --force) and print the summary too.")


def json_option(command: Callable) -> Callable:
    """``--json [FILE]`` and ``--force``."""
    return _json_flag(force_option(command))

set_option: Callable = click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE",
    help="Override a model parameter, e.g. --set layers=48 (repeatable).")


def parse_overrides(items: tuple[str, ...]) -> dict[str, Any]:
    """``("layers=48", "hidden=4096")`` → ``{"layers": 48, "hidden": 4096}`` (values read as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"--set needs KEY=VALUE, got {excerpt(item)}")
        try:
            parsed = parse_yaml_text(value)
        except (yaml.YAMLError, RecursionError, ValueError) as exc:
            raise SpecError(f"--set {excerpt(key.strip(), 40)}: {yaml_problem(exc)[0]}") from None
        items_ = parsed if isinstance(parsed, list) else [parsed]
        if isinstance(parsed, list) and len(parsed) > 16 or not all(
                v is None or isinstance(v, (bool, int, float, str)) for v in items_):
            raise SpecError(f"--set {excerpt(key.strip(), 40)}: needs a number, a string or a short list of them, "
                            f"got {excerpt(value)}")
        out[key.strip()] = parsed
    return out


def refuse_unused(names: tuple[str, ...], why: str) -> None:
    """Refuse options the user gave (not defaults) that do nothing in this mode: one usage line naming
    them and `why` (an option silently ignored is a result the user did not ask for)."""
    ctx = click.get_current_context()
    given = [p for p in ctx.command.params if p.name in names
             and ctx.get_parameter_source(p.name) not in (None, click.core.ParameterSource.DEFAULT,
                                                          click.core.ParameterSource.DEFAULT_MAP)]
    if given:
        labels = ", ".join(max(p.opts, key=len) for p in given)
        raise click.UsageError(f"{labels} {'does' if len(given) == 1 else 'do'} nothing {why}")


def announce_empty_strategy(path: str | None) -> None:
    """Say so when a strategy file sets no field at all (empty, or comments only): the run then takes
    every field's default, which the user may not expect from a file they named."""
    if path is None:
        return
    from dlsim.io.yamlfile import read_yaml
    data = read_yaml(Path(path))
    if data is None or data == {}:
        click.echo(f"warning: strategy file {path} sets no field (it is empty or holds only comments): every "
                   "strategy field takes its default", err=True)
