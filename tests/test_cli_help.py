"""Grouped `--help` (issue 34 item 7): the long commands' options in named panels, every option in exactly
one, and every command's help still drawn; `released_words` (an optional-value option gives a required
argument its word back)."""

from __future__ import annotations

import click
import pytest

from dlsim.cli import _register, main
from dlsim.cli.command import released_words
from dlsim.cli.help_panels import PANELS


def _command(path: str) -> click.Command:
    _register()
    command: click.Command = main
    for name in path.split()[1:]:
        command = command.commands[name]  # type: ignore[attr-defined]
    return command


@pytest.mark.parametrize("path", sorted(PANELS))
def test_every_option_is_in_exactly_one_panel(path):
    command = _command(path)
    options = {p.opts[0] if p.opts[0].startswith("--") else p.opts[-1] for p in command.params
               if isinstance(p, click.Option)} | {"--help"}
    placed = [name for _, names in PANELS[path] for name in names]
    assert len(placed) == len(set(placed)), f"{path}: an option in two panels"
    assert set(placed) - options == set(), f"{path}: panels name options the command does not have"
    assert options - set(placed) == set(), (f"{path}: add these options to a panel in dlsim/cli/help_panels.py: "
                                            f"{sorted(options - set(placed))}")


def test_simulate_help_shows_the_panels(cli):
    code, out, _ = cli("simulate", "--help")
    assert code == 0
    titles = [name for name, _ in PANELS["dlsim simulate"]]
    positions = [out.find(f"{title}:") for title in titles]
    assert all(p >= 0 for p in positions) and positions == sorted(positions)
    section = out[positions[1]:positions[2]]  # "Parallelism and batch"
    assert "--dp" in section and "--microbatch-size" in section and "--zero" not in section


def test_every_command_draws_its_help(cli):
    _register()
    paths = []
    for name, command in main.commands.items():
        paths.append([name])
        paths += [[name, sub] for sub in getattr(command, "commands", {})]
    for path in paths:
        code, out, err = cli(*path, "--help")
        assert code == 0 and "Usage: dlsim " + " ".join(path) in out, (path, err)


def test_every_command_is_a_dlsim_command():
    """So that each one groups its help and keeps a required argument's word from an optional-value option."""
    from dlsim.cli.command import DlsimCommand, DlsimGroup
    _register()
    commands = [*main.commands.values()]
    commands += [sub for c in main.commands.values() for sub in getattr(c, "commands", {}).values()]
    assert [c.name for c in commands if not isinstance(c, (DlsimCommand, DlsimGroup))] == []


def test_released_words():
    options = {"--json": "-"}
    assert list(released_words(["--json", "gpt2", "-c", "x"], options)) == [["gpt2", "--json=-", "-c", "x"]]
    assert list(released_words(["-c", "x", "--json"], options)) == []
    assert list(released_words(["--json", "--dp", "2"], options)) == []
    assert list(released_words(["a", "--", "--json", "b"], options)) == []
    assert list(released_words(["--json", "a", "--json", "b"], options)) == [["a", "--json=-", "--json", "b"],
                                                                              ["--json", "a", "b", "--json=-"]]
