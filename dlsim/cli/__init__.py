"""The `dlsim` command line: a thin click layer over `dlsim.api`.

Exit codes, the same for every command: 0 done; 1 bad input or an infeasible strategy (one line on
stderr, at most `MAX_ERROR_CHARS` characters, naming the file, the field and the reason); 2 a usage
error (an unknown option, a missing argument, a value of the wrong type: click's convention); 130
interrupted. An unexpected exception is a bug: one line saying so, exit 1, and the traceback with
``DLSIM_DEBUG=1``. Command groups live in their own modules and register themselves on `main`.
"""

from __future__ import annotations

import os
import sys

import click

from dlsim.errors import DlsimError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="dlsim")
def main() -> None:
    """Predict and optimise the runtime of parallel deep-learning training."""


def _register() -> None:
    from dlsim.cli import zoo, estimate  # noqa: F401  (modules add commands to `main`)
    for optional in ("comm", "plan", "simulate", "calibrate", "validate", "import_cmd"):
        try:
            __import__(f"dlsim.cli.{optional}")
        except ModuleNotFoundError as exc:
            if exc.name != f"dlsim.cli.{optional}":
                raise


MAX_ERROR_CHARS = 300
USAGE_EXIT = 2


def _fail(message: str) -> None:
    """One line on stderr, never longer than MAX_ERROR_CHARS characters."""
    line = " ".join(f"error: {message}".split())
    if len(line) > MAX_ERROR_CHARS:
        line = line[: MAX_ERROR_CHARS - 4] + " ..."
    click.echo(line, err=True)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI; return its exit code (0 done, 1 bad input or infeasible, 2 usage, 130 interrupted)."""
    _register()
    try:
        main.main(args=argv, prog_name="dlsim", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
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
        _fail("interrupted")
        return 130
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
