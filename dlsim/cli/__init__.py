"""The `dlsim` command line: a thin click layer over `dlsim.api`.

Exit codes, the same for every command: 0 done; 1 bad input or an infeasible strategy (one line on
stderr, at most `MAX_ERROR_CHARS` characters, naming the file, the field and the reason), a usage error
(an unknown option, a missing argument, a value of the wrong type) included: it is bad input too, and a
script checks one code; 130 interrupted. An unexpected exception is a bug: one line saying so, exit 1, and the traceback with
``DLSIM_DEBUG=1``. Command groups live in their own modules and register themselves on `main`.
"""

from __future__ import annotations

import os
import sys

import click

from dlsim.cli.command import DlsimCommand, DlsimGroup
from dlsim.errors import DlsimError


# Top-level commands: (module that registers it, one-line help). A command's module (and what it
# imports: numpy, scipy, the simulator) is imported only when that command runs or shows its own
# help, so that `dlsim --help` starts in a few tens of milliseconds. tests/test_cli_startup.py holds
# this table to the commands the modules register.
COMMANDS: dict[str, tuple[str, str]] = {
    "calibrate": ("calibrate", "Measure real kernels (compute), collectives (comm) or convolution micro-batches."),
    "comm": ("comm", "Price a collective: time, algorithm, bus bandwidth, lower bound; sweeps and crossovers."),
    "compare": ("compare", "Compare strategies side by side (time split, memory, throughput); scaling studies."),
    "estimate": ("estimate", "Predict one training iteration of MODEL on one device of a profile."),
    "import": ("import_cmd", "Import a network from another framework (PyTorch)."),
    "model": ("zoo", "Inspect a network description (model show)."),
    "models": ("zoo", "List the built-in model zoo."),
    "optimize": ("optimize", "Search strategies for MODEL on N GPUs: ranked, simulated, explained, Pareto front."),
    "plan": ("plan", "Plan how to run a network (micro-batches for convolutions, μ-cuDNN)."),
    "plot": ("plot", "Redraw saved records (simulation, comparison, comm sweep, trace) as a figure."),
    "profiles": ("zoo", "List the built-in hardware profiles."),
    "run": ("run_cmd", "A whole training run: time to train with failures and checkpoints, GPU-hours, energy, cost."),
    "simulate": ("simulate", "Simulate one training iteration of MODEL on a cluster under a strategy."),
    "stacks": ("stacks", "List the software stacks (framework, version) a prediction can assume; show one's keys."),
    "sweep": ("sweep", "Simulate a grid of models x clusters x strategies x sizes; resumable; Dask or a process pool."),
    "validate": ("validate", "Compare predictions with real runs (model, kernels, ddp)."),
}


class _LazyGroup(click.Group):
    """A group whose commands are imported when used (see `COMMANDS`); its own help stays plain click (it
    lists the table above without importing a command), its commands and groups draw theirs with rich-click
    in panels (`dlsim.cli.command`)."""

    command_class = DlsimCommand
    group_class = DlsimGroup

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            __import__(f"dlsim.cli.{COMMANDS[cmd_name][0]}")
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1] if name in COMMANDS else self.commands[name].get_short_help_str())
                for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="dlsim")
def main() -> None:
    """Predict and optimise the runtime of parallel deep-learning training.

    Run `dlsim COMMAND --help` for a command's options. Exit codes: 0 done, 1 bad input or an
    infeasible strategy (one line on stderr; a usage error too).
    """


def _register() -> None:
    """Import every command module (each adds its commands to `main`)."""
    for module in sorted({m for m, _ in COMMANDS.values()}):
        __import__(f"dlsim.cli.{module}")


MAX_ERROR_CHARS = 300
USAGE_EXIT = 1  # click's convention is 2; bad input of every kind exits 1 here
INTERRUPTED_EXIT = 130
_RESUME: list[str] = []


def resumable(what: str) -> None:
    """Say that the running command resumes where it stopped (`what` keeps: "every measured row"): an
    interrupt (Ctrl-C) then prints the exact command to rerun."""
    _RESUME[:] = [what]


def _interrupted(argv: list[str] | None) -> int:
    if _RESUME:
        import shlex
        command = shlex.join(["dlsim", *(sys.argv[1:] if argv is None else argv)])
        click.echo(f"interrupted: {_RESUME[0]} is kept; to resume, rerun: {command}", err=True)
    else:
        _fail("interrupted")
    return INTERRUPTED_EXIT


def _fail(message: str) -> None:
    """One line on stderr, never longer than MAX_ERROR_CHARS characters."""
    line = " ".join(f"error: {message}".split())
    if len(line) > MAX_ERROR_CHARS:
        line = line[: MAX_ERROR_CHARS - 4] + " ..."
    click.echo(line, err=True)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI; return its exit code (0 done, 1 bad input, usage errors included, or infeasible, 130 interrupted).
    Every file the command reads is an input no output of it may be (`dlsim.io.runfiles.run_scope`)."""
    from dlsim.io.runfiles import run_scope
    _RESUME.clear()
    try:
        with run_scope():
            main.main(args=argv, prog_name="dlsim", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):  # click turns Ctrl-C into Abort
            return _interrupted(argv)
        _fail("aborted")
        return 1
    except click.UsageError as exc:
        _fail(exc.format_message() + (f" (see {exc.ctx.command_path} --help)" if exc.ctx else ""))
        return USAGE_EXIT
    except click.ClickException as exc:
        _fail(exc.format_message())
        return 1
    except DlsimError as exc:
        _fail(str(exc))
        return 1
    except KeyboardInterrupt:
        return _interrupted(argv)
    except BrokenPipeError:
        return 1
    except (MemoryError, RecursionError) as exc:
        if os.environ.get("DLSIM_DEBUG"):
            raise
        _fail(f"input too large to process ({type(exc).__name__}); please report it if the input was reasonable")
        return 1
    except Exception as exc:  # noqa: BLE001  (a bug: one line, not a traceback; DLSIM_DEBUG=1 shows it)
        if os.environ.get("DLSIM_DEBUG"):
            raise
        _fail(f"internal error ({type(exc).__name__}: {str(exc)[:120]}); please report it "
              "(DLSIM_DEBUG=1 shows the traceback)")
        return 1
    return 0


def entry() -> None:
    """Console-script entry point."""
    sys.exit(run())
