"""The `dlsim` command line: a thin click layer over `dlsim.api`.

Every user error (a `DlsimError` or a bad option) prints one line on stderr and exits with 1.
Command groups live in their own modules and register themselves on `main`.
"""

from __future__ import annotations

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


def run(argv: list[str] | None = None) -> int:
    """Run the CLI; user errors become one line on stderr and exit code 1."""
    _register()
    try:
        main.main(args=argv, prog_name="dlsim", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("error: aborted", err=True)
        return 1
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        return 1
    except DlsimError as exc:
        click.echo(f"error: {exc}", err=True)
        return 1
    except KeyboardInterrupt:
        click.echo("error: interrupted", err=True)
        return 130
    return 0


def entry() -> None:
    """Console-script entry point."""
    sys.exit(run())
