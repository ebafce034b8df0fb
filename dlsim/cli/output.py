"""Output helpers shared by commands: JSON to stdout or to a file, plots and traces, all written safely.

Rules (issues 16, 29): an output never replaces an input of the same run (the files named on the
command line, and every file the run reads: a model's ``extends:``, a profile's tables; see
`dlsim.io.runfiles`) nor another output of the same run; an existing regular file is replaced only
with ``--force``, a character device or FIFO is written into, anything else refused; files are
written atomically (temporary file with an unpredictable name, fsync, rename), readable as the umask
says, through symlinks. Options that write a file have the type `OutputFile`: every such path of a
command is checked before the command does any work (`check_outputs`, run by
`dlsim.cli.command.DlsimCommand`). Every number in a record is
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

from dlsim.errors import DlsimError, excerpt
from dlsim.io.files import OutputError, check_output, write_atomic
from dlsim.io.runfiles import shown

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


def forced() -> bool:
    """Whether the running command was given ``--force``."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get("dlsim.force", False))


class OutputFile(click.ParamType):
    """The type of an option that writes a file: checked before the command runs (`check_outputs`).
    `resume`: the file is appended to and read back (a results file), not replaced; `figure`: a
    figure, whose format the file name's suffix says (`check_plot_path`)."""

    name = "file"

    def __init__(self, resume: bool = False, figure: bool = False) -> None:
        self.resume, self.figure = resume, figure

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return os.fsdecode(value) if isinstance(value, bytes) else value


def _is_output(param: click.Parameter) -> bool:
    return isinstance(param.type, OutputFile)


def _option_label(param: click.Parameter) -> str:
    longs = [o for o in param.opts if o.startswith("--")]
    return max(longs, key=len) if longs else (param.opts[0] if param.opts else str(param.name))


def _inputs(ctx: click.Context | None) -> list[Path]:
    """Files named on the command line (a profile directory's profile.yaml and tables too)."""
    found: list[Path] = []
    while ctx is not None:
        outputs = {p.name for p in ctx.command.params if _is_output(p)}
        for name, value in ctx.params.items():
            values = value if isinstance(value, (list, tuple)) else [value]
            for v in values:
                if not isinstance(v, (str, Path)) or name in outputs or not v or "\x00" in str(v):
                    continue
                p = Path(v)
                try:
                    if p.is_file():
                        found.append(p)
                    elif p.is_dir():
                        found.extend(q for q in p.iterdir() if q.is_file())
                except (OSError, ValueError):
                    continue
        ctx = ctx.parent
    return found


def prepare_output(path: str | Path, option: str, resume: bool = False) -> Path:
    """Check an output path against this run's inputs, its other outputs, its type and --force
    (`dlsim.io.files.check_output`); remember it. A second call for the same output is a no-op."""
    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    written = meta.setdefault("dlsim.outputs", {})
    key = (os.fspath(path), option)
    if key in written:
        return written[key]
    checked = check_output(path, inputs=tuple(_inputs(ctx)), force=meta.get("dlsim.force", False), option=option,
                           resume=resume)
    written[key] = checked
    return checked


def check_outputs(ctx: click.Context) -> None:
    """Check every output file of the command about to run (its `OutputFile` options) before it does
    any work; a figure's format too."""
    for param in ctx.command.params:
        value = ctx.params.get(param.name) if param.name else None
        if not _is_output(param) or value in (None, "-") or isinstance(value, bool):
            continue
        kind: OutputFile = param.type  # type: ignore[assignment]
        label = _option_label(param)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if kind.figure:
                check_plot_path(v, label)
            prepare_output(v, label, resume=kind.resume)


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


def check_plot_path(path: str | Path, option: str = "--plot") -> Path:
    """Refuse an unknown plot format before any work is done."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise OutputError(f"{option} {shown(path)}: unknown figure format {excerpt(suffix, 20) if suffix else '(none)'} "
                          f"(use a file name ending in .{', .'.join(PLOT_FORMATS[:4])})")
    return Path(path)


def emit_plot(path: str | Path, draw: Callable[[str], Any], option: str = "--plot") -> None:
    """Draw a figure through `draw(temporary_path)` (a private temporary directory) and write it to
    `path` under the output rules."""
    path = prepare_output(check_plot_path(path, option), option)
    with tempfile.TemporaryDirectory(prefix="dlsim-figure.") as folder:
        tmp = os.path.join(folder, "figure" + (Path(path).suffix or ".png"))
        draw(tmp)
        write_atomic(path, Path(tmp).read_bytes())
    click.echo(f"wrote {path}", err=True)
