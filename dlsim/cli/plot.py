"""``dlsim plot``: redraw saved records (JSON) as figures, from the records alone.

Kinds: a ``simulation`` record (time split per simulated device, memory against capacity);
several simulation records (compared side by side, named after their files); a ``comparison``
record of ``dlsim compare`` (its scaling study when it has one); a ``comm-sweep`` or
``comm-validation`` record of ``dlsim comm``; a ``strategy-study`` record; a ``series`` record (line
panels of a study, e.g. the seeds' reproductions in reports/seeds); a Chrome trace of
``dlsim simulate --trace`` (.json or .json.gz: the Gantt chart of the iteration).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import click

from dlsim.cli import main
from dlsim.cli.compare import check_figure_path, draw_comparison, emit_figure
from dlsim.cli.output import OutputFile, force_option
from dlsim.errors import SpecError, excerpt

MAX_RECORD_BYTES = 512 * 2 ** 20


def read_record(path: str) -> dict[str, Any]:
    """A JSON record (gzip-compressed when it ends in .gz); one clear line when it is not one."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        if p.suffix == ".gz" or raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as exc:
        raise SpecError(f"cannot read it ({type(exc).__name__}: {excerpt(str(exc), 80)})", path=path) from None
    if len(raw) > MAX_RECORD_BYTES:
        raise SpecError(f"record is {len(raw)} bytes, more than {MAX_RECORD_BYTES}", path=path)
    try:
        rec = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise SpecError(f"not a JSON record ({excerpt(str(exc), 80)})", path=path) from None
    if not isinstance(rec, dict):
        raise SpecError("not a dlsim record (a JSON object with a 'kind')", path=path)
    return rec


def _kind(rec: dict[str, Any]) -> str:
    if "traceEvents" in rec:
        return "trace"
    return str(rec.get("kind"))


KINDS = ("simulation", "comparison", "comm-sweep", "comm-validation", "strategy-study", "series", "trace")


def _draw(records: list[tuple[str, dict[str, Any]]], devices: int) -> Any:
    from dlsim.report import compare_plots
    kinds = {_kind(r) for _, r in records}
    if len(records) > 1:
        if not kinds <= {"simulation", "async_simulation"}:
            raise SpecError(f"several records are drawn together only when all are simulation records "
                            f"(simulation or async_simulation; got {', '.join(sorted(kinds))})")
        from dlsim.api.compare import comparison_from_records
        return draw_comparison(comparison_from_records([(Path(p).stem, r) for p, r in records]))
    path, rec = records[0]
    kind = _kind(rec)
    try:
        if kind == "simulation":
            return compare_plots.simulation_figure(rec, max_devices=devices)
        if kind == "comparison":
            return draw_comparison(rec)
        if kind == "trace":
            from dlsim.report.gantt import gantt_figure
            return gantt_figure(rec, devices)
        if kind == "series":
            from dlsim.report.series_plots import series_figure
            return series_figure(rec)
        if kind in ("comm-sweep", "comm-validation", "strategy-study"):
            return _legacy(kind, rec)
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
        raise SpecError(f"{kind} record is missing or has a malformed field ({type(exc).__name__}: "
                        f"{excerpt(str(exc), 60)})", path=path) from None
    raise SpecError(f"cannot draw a record of kind {excerpt(rec.get('kind'), 40)} (use one of {', '.join(KINDS)})",
                    path=path)


class _Drawn:
    """A figure already written by an older plotting function (comm, strategy study): its bytes."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw


def _legacy(kind: str, rec: dict[str, Any]) -> Any:
    if kind == "comm-sweep":
        from dlsim.report.comm_plots import plot_sweep
        return _Drawn(lambda tmp: plot_sweep(rec, tmp))
    if kind == "comm-validation":
        from dlsim.report.comm_plots import plot_validation
        return _Drawn(lambda tmp: plot_validation(rec, tmp))
    from dlsim.report.sim_plots import plot_strategy_study
    return _Drawn(lambda tmp: plot_strategy_study(rec, tmp))


@main.command("plot")
@click.argument("records", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "-o", "out", required=True, type=OutputFile(figure=True),
              help="Figure file to write (.png, .pdf, .svg, ...).")
@click.option("--devices", "devices", type=click.IntRange(1, 4096), default=16, show_default=True,
              help="Devices drawn at most (simulation records, Gantt charts of traces).")
@force_option
def plot_cmd(records: tuple[str, ...], out: str, devices: int) -> None:
    """Redraw saved records (JSON) as a figure, from the records alone.

    RECORDS: a simulation record (dlsim simulate --json F), several of them (compared side by
    side), a comparison (dlsim compare --json F), a comm sweep or validation record, or a Chrome
    trace (dlsim simulate --trace F.json[.gz]: its Gantt chart).
    """
    check_figure_path(out, "--out")
    loaded = [(p, read_record(p)) for p in records]
    fig = _draw(loaded, devices)
    if isinstance(fig, _Drawn):
        import os
        import tempfile
        from dlsim.cli.output import emit_text
        fd, tmp = tempfile.mkstemp(prefix=".dlsim-figure.", suffix=Path(out).suffix or ".png")
        os.close(fd)
        try:
            fig.draw(tmp)
            emit_text(out, Path(tmp).read_bytes(), "--out")
        finally:
            Path(tmp).unlink(missing_ok=True)
        return
    emit_figure(out, "--out", lambda: fig)
