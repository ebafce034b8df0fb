"""`dlsim --help` imports nothing heavy (issue 16: it starts in under 0.2 s); the lazy command table
lists exactly the commands the modules register, and each command still loads on use."""

from __future__ import annotations

import json
import subprocess
import sys

import click

from dlsim.cli import COMMANDS, _register, main

HEAVY = ("numpy", "scipy", "simpy", "yaml", "pulp", "matplotlib", "torch", "pandas", "dlsim.api", "dlsim.sim",
         "dlsim.cost", "dlsim.plan")


def test_help_imports_nothing_heavy():
    code = ("import sys, contextlib, io\nfrom dlsim.cli import run\n"
            "with contextlib.redirect_stdout(io.StringIO()): run(['--help'])\n"
            f"import json; print(json.dumps(sorted(m for m in sys.modules if m.startswith({HEAVY!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def test_lazy_table_matches_the_registered_commands():
    _register()
    assert set(main.commands) == set(COMMANDS)
    for name, (module, _help) in COMMANDS.items():
        assert main.commands[name].callback.__module__ == f"dlsim.cli.{module}" or isinstance(
            main.commands[name], click.Group)


def test_commands_load_on_use(cli):
    code, out, _ = cli("models")
    assert code == 0 and "gpt2" in out
    code, out, _ = cli("--help")
    assert code == 0 and all(name in out for name in COMMANDS)
