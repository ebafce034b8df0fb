"""``dlsim plot``: redraw saved records (JSON) as figures, from the records alone.

Kinds: a ``simulation`` record (time split per simulated device, memory against capacity);
several simulation records (compared side by side, named after their files); a ``comparison``
record of ``dlsim compare`` (its scaling study when it has one); a ``comm-sweep`` or
``comm-validation`` record of ``dlsim comm``; a ``strategy-study`` record; a ``series`` record (line
panels of a study, e.g. the seeds' reproductions in reports/seeds); a Chrome trace of
``dlsim simulate --trace`` (.json or .json.gz: the Gantt chart of the iteration).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
from pathlib import Path
from typing import Any, Iterator

import click

from dlsim.cli import main
from dlsim.cli.compare import check_figure_path, draw_comparison, emit_figure
from dlsim.cli.output import OutputFile, emit_plot, force_option
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


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def check_trace(rec: dict[str, Any], path: str) -> None:
    """The fields of a Chrome trace the Gantt chart reads have the types `dlsim simulate --trace`
    writes; one `SpecError` naming the first event that does not (a number where a name is, a
    missing time), never an error while drawing."""
    events = rec.get("traceEvents")
    if not isinstance(events, list):
        raise SpecError("traceEvents is not a list", path=path)
    for i, e in enumerate(events):
        where = f"traceEvents[{i}]"
        if not isinstance(e, dict) or not isinstance(e.get("ph", ""), str):
            raise SpecError("not an event (a mapping with a string ph)", path=path, field=where)
        if e.get("ph") not in ("M", "X"):
            continue
        if not isinstance(e.get("name"), str):
            raise SpecError(f"name is {excerpt(e.get('name'), 30)}, not a string", path=path, field=where)
        for key in ("pid", "tid"):
            if key in e and (isinstance(e[key], bool) or not isinstance(e[key], int)):
                raise SpecError(f"{key} is {excerpt(e[key], 30)}, not an integer", path=path, field=where)
        if e["ph"] == "X":
            if not _number(e.get("ts")) or not _number(e.get("dur")) or "pid" not in e or "tid" not in e:
                raise SpecError("a span needs pid, tid and finite non-negative ts and dur", path=path, field=where)
            if not isinstance(e.get("cat", ""), str):
                raise SpecError("cat is not a string", path=path, field=where)
        elif e["name"] in ("process_name", "thread_name", "process_sort_index"):
            args = e.get("args")
            wanted = "sort_index" if e["name"] == "process_sort_index" else "name"
            ok = isinstance(args, dict) and (_number(args.get(wanted)) if wanted == "sort_index"
                                              else isinstance(args.get(wanted), str))
            if not ok or "pid" not in e or (e["name"] == "thread_name" and "tid" not in e):
                raise SpecError(f"{e['name']} needs pid{', tid' if e['name'] == 'thread_name' else ''} and "
                                f"args.{wanted} ({'a number' if wanted == 'sort_index' else 'a string'})",
                                path=path, field=where)
    other = rec.get("otherData", {})
    if not isinstance(other, dict) or ("makespan_s" in other and other["makespan_s"] is not None
                                       and not _number(other["makespan_s"])):
        raise SpecError("otherData.makespan_s is not a finite non-negative number", path=path, field="otherData")


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
        with malformed("simulation", ", ".join(p for p, _ in records)[:120]):
            return draw_comparison(comparison_from_records([(Path(p).stem, r) for p, r in records]))
    path, rec = records[0]
    kind = _kind(rec)
    if kind == "trace":
        check_trace(rec, path)
    with malformed(kind, path):
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
            return _legacy(kind, rec, path)
    raise SpecError(f"cannot draw a record of kind {excerpt(rec.get('kind'), 40)} (use one of {', '.join(KINDS)})",
                    path=path)


@contextlib.contextmanager
def malformed(kind: str, path: str) -> Iterator[None]:
    """A record whose fields are not what its kind's drawing reads: one `SpecError` line naming it."""
    try:
        yield
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError, AttributeError) as exc:
        raise SpecError(f"{kind} record is missing or has a malformed field ({type(exc).__name__}: "
                        f"{excerpt(str(exc), 60)})", path=path) from None


class _Drawn:
    """A figure an older plotting function (comm, strategy study) writes itself: `draw(tmp)`, run
    under the same malformed-record rule as the others."""

    def __init__(self, draw: Any, kind: str, path: str) -> None:
        self._draw, self.kind, self.path = draw, kind, path

    def draw(self, tmp: str) -> None:
        with malformed(self.kind, self.path):
            self._draw(tmp)


def _legacy(kind: str, rec: dict[str, Any], path: str) -> Any:
    if kind == "comm-sweep":
        from dlsim.report.comm_plots import plot_sweep
        return _Drawn(lambda tmp: plot_sweep(rec, tmp), kind, path)
    if kind == "comm-validation":
        from dlsim.report.comm_plots import plot_validation
        return _Drawn(lambda tmp: plot_validation(rec, tmp), kind, path)
    from dlsim.report.sim_plots import plot_strategy_study
    return _Drawn(lambda tmp: plot_strategy_study(rec, tmp), kind, path)


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
        emit_plot(out, fig.draw, "--out")
        return
    emit_figure(out, "--out", lambda: fig)
