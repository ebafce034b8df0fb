"""Output helpers shared by commands: JSON to stdout or to a file, plots and traces, all written safely.

Rules (issue 16): an output never replaces an input of the same run (the model, profile, strategy
or table files named on the command line) nor another output of the same run; an existing file is
replaced only with ``--force``; files are written atomically (temporary file with an unpredictable
name, fsync, rename), readable as the umask says, through symlinks. Every number in a record is
checked finite before it is printed or written (no bare ``Infinity``/``NaN``, which are not JSON);
an unbounded limit (a link without a burst peak) is written as ``null``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import click

from dlsim.errors import DlsimError
from dlsim.io.files import OutputError, check_output, write_atomic

# Fields where +inf means "no limit": written as null.
UNBOUNDED_KEYS = ("peak_bandwidth_bytes_per_s", "peak_bandwidth")
PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp")


class NonFiniteError(DlsimError):
    """A result that is not a finite number: an input out of range, never a number to report."""


def _force_callback(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    ctx.meta["dlsim.force"] = bool(value) or ctx.meta.get("dlsim.force", False)
    return value


force_option: Callable = click.option(
    "--force", is_flag=True, expose_value=False, is_eager=True, callback=_force_callback,
    help="Replace output files (--json FILE, --trace, --plot) that already exist.")


def _inputs(ctx: click.Context | None) -> list[Path]:
    """Files named on the command line (a profile directory's profile.yaml and tables too)."""
    found: list[Path] = []
    while ctx is not None:
        for name, value in ctx.params.items():
            values = value if isinstance(value, (list, tuple)) else [value]
            for v in values:
                if not isinstance(v, (str, Path)) or name in ("json_out", "trace_out", "plot_path", "plot", "out",
                                                                 "gantt_out", "csv_out", "save_best"):
                    continue
                p = Path(v)
                try:
                    if p.is_file():
                        found.append(p)
                    elif p.is_dir():
                        found.extend(q for q in p.iterdir() if q.is_file())
                except OSError:
                    continue
        ctx = ctx.parent
    return found


def prepare_output(path: str | Path, option: str) -> Path:
    """Check an output path against this run's inputs, its other outputs, and --force; remember it."""
    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    written = meta.setdefault("dlsim.outputs", {})
    path = Path(path)
    key = os.path.abspath(path)
    if key in written:
        if written[key] != option:
            raise OutputError(f"{option} {path} is already the {written[key]} output of this run")
        return path
    check_output(path, inputs=tuple(_inputs(ctx)), force=meta.get("dlsim.force", False), option=option)
    written[key] = option
    return path


def json_safe(record: Any, where: str = "") -> Any:
    """`record` with every float checked finite (unbounded limits become None); raises NonFiniteError."""
    if isinstance(record, float):
        if math.isfinite(record):
            return record
        if record == math.inf and where.rsplit(".", 1)[-1] in UNBOUNDED_KEYS:
            return None
        raise NonFiniteError(f"result {where.lstrip('.') or 'value'} is {record} (an input out of range?); "
                             "nothing reported")
    if isinstance(record, dict):
        return {k: json_safe(v, f"{where}.{k}") for k, v in record.items()}
    if isinstance(record, (list, tuple)):
        return [json_safe(v, f"{where}[{i}]") for i, v in enumerate(record)]
    return record


def wants_summary(destination: str | None) -> bool:
    """The human summary is printed unless the JSON record goes to stdout."""
    return destination != "-"


# Options that only shape the output, not what was run: never listed as assumed.
_OUTPUT_OPTIONS = {"json_out", "force", "overrides", "plot_path", "trace_out", "show_all", "pareto", "out",
                   "gantt_out", "gantt_devices", "csv_out", "jobs"}


def add_assumed(record: Any) -> Any:
    """Name in ``record["assumed"]`` every option of the running command left at its default.

    The command's own assumptions (the API's: a dtype taken from the model, strategy fields not
    given) are already in ``record["assumed"]`` and win; the options click filled in are added
    beside them. A record without a ``dtype`` says ``"any"`` only where the caller put it; a
    ``"dtype": null`` is never written (it is the model's dtype, resolved by the API).
    """
    if not isinstance(record, dict):
        return record
    ctx = click.get_current_context(silent=True)
    filled: dict[str, Any] = {}
    if ctx is not None:
        for name, value in ctx.params.items():
            if name in _OUTPUT_OPTIONS or value is None or value == ():
                continue
            source = ctx.get_parameter_source(name)
            if source in (click.core.ParameterSource.DEFAULT, click.core.ParameterSource.DEFAULT_MAP):
                filled[name] = list(value) if isinstance(value, tuple) else value
    record["assumed"] = {**filled, **(record.get("assumed") or {})}
    return record


def state_dtype(record: dict, given: Any, resolved: Any) -> dict:
    """Set ``record["dtype"]`` to what ran; list it under ``assumed`` when the user did not give it."""
    record["dtype"] = resolved
    if given is None or given == ():
        record.setdefault("assumed", {})["dtype"] = resolved
    return record


def emit_record(record: Any, destination: str | None, render: Any) -> None:
    """The JSON record (`emit_json`) where `destination` asks for it, and the summary `render(record)`
    unless the record goes to stdout."""
    if destination is not None:
        emit_json(record, destination)
    if wants_summary(destination):
        json_safe(record)
        click.echo(render(record))


def emit_json(record: Any, destination: str | None) -> None:
    """Print `record` as JSON (destination ``-`` or None) or write it to a file (see the module rules).
    Dict records get their ``assumed`` block (`add_assumed`)."""
    text = json.dumps(json_safe(add_assumed(record)), indent=2, allow_nan=False) + "\n"
    if destination in (None, "-"):
        click.echo(text, nl=False)
    else:
        write_atomic(prepare_output(destination, "--json"), text)
        click.echo(f"wrote {destination}", err=True)


def emit_text(path: str | Path, text: str | bytes, option: str) -> None:
    """Write a trace or any other text output (see the module rules)."""
    write_atomic(prepare_output(path, option), text)
    click.echo(f"wrote {path}", err=True)


def check_plot_path(path: str | Path) -> Path:
    """Refuse an unknown plot format before any work is done."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise OutputError(f"--plot {path}: unknown figure format {suffix or '(none)'!r} "
                          f"(use a file name ending in .{', .'.join(PLOT_FORMATS[:4])})")
    return Path(path)


def emit_plot(path: str | Path, draw: Callable[[str], Any]) -> None:
    """Draw a figure through `draw(temporary_path)` and move it into place atomically."""
    path = prepare_output(check_plot_path(path), "--plot")
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix, dir=target.parent)
    os.close(fd)
    try:
        draw(tmp)
        write_atomic(target, Path(tmp).read_bytes())
    finally:
        Path(tmp).unlink(missing_ok=True)
    click.echo(f"wrote {path}", err=True)
