"""The command classes of `dlsim`: grouped ``--help`` and options whose value may be left out.

``--help`` of every command is drawn by rich-click (a maintained click extension) in the panels that
`dlsim.cli.help_panels` names, so that 60 options read as a dozen groups. An option whose value is
optional (``--json [FILE]``: ``is_flag=False`` with a ``flag_value``) takes the next word as its value, as
click does; when that leaves a required argument missing (``dlsim simulate --json gpt2 --cluster ...``),
the word was the argument and the option the bare flag, and the command line is read again that way.
"""

from __future__ import annotations

from typing import Any, Iterator

import click
from rich_click import RichCommand, RichGroup


def _optional_value_options(command: click.Command) -> dict[str, Any]:
    """Option spelling -> the value the option takes without one, for the options whose value is optional."""
    out: dict[str, Any] = {}
    for param in command.params:
        # click marks such an option with `_flag_needs_value` (is_flag=False with a flag_value), the attribute
        # its own parser reads to decide whether the next word is the value
        if isinstance(param, click.Option) and not param.is_flag and getattr(param, "_flag_needs_value", False):
            out.update({name: param.flag_value for name in param.opts if name.startswith("--")})
    return out


def released_words(args: list[str], options: dict[str, Any]) -> Iterator[list[str]]:
    """`args` with one ``OPTION WORD`` pair read as the bare option and a positional WORD, first pair first:
    ``["--json", "gpt2", "-c", "x"]`` -> ``["gpt2", "--json=-", "-c", "x"]`` (the flag's value spelled out, so
    that the option cannot take the next word instead)."""
    for i, word in enumerate(args[:-1]):
        if word == "--":
            return
        following = args[i + 1]
        if word in options and not following.startswith("-"):
            yield [*args[:i], following, f"{word}={options[word]}", *args[i + 2:]]


class _Panelled:
    """Gives each context the help configuration with `dlsim.cli.help_panels`' option groups."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        from dlsim.cli.help_panels import help_config
        extra.setdefault("rich_help_config", help_config())
        return super().make_context(info_name, args, parent, **extra)  # type: ignore[misc]


class DlsimCommand(_Panelled, RichCommand):
    """A dlsim command: grouped help; an optional-value option never takes a required argument's word;
    its output files are checked before it runs (`dlsim.cli.output.check_outputs`: a path that cannot
    be written is refused before any work, not after it)."""

    def invoke(self, ctx: click.Context) -> Any:
        from dlsim.cli.output import check_outputs
        check_outputs(ctx)
        return super().invoke(ctx)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, list(args), parent, **dict(extra))
        except click.MissingParameter as missing:
            if not isinstance(missing.param, click.Argument):
                raise
            for candidate in released_words(list(args), _optional_value_options(self)):
                try:
                    return super().make_context(info_name, candidate, parent, **dict(extra))
                except click.MissingParameter:
                    continue
            raise


class DlsimGroup(_Panelled, RichGroup):
    """A dlsim command group (calibrate, validate, plan, import, model): its commands are `DlsimCommand`s."""

    command_class = DlsimCommand
    group_class = type  # subgroups of the same class
