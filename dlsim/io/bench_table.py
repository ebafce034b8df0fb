"""Reading and writing convolution benchmark tables (CSV) for micro-batch planning.

Columns: ``layer,pass,microbatch_size,algorithm,time_s,workspace_bytes,source`` (``pass`` optional:
without it every row is a forward pass; ``source`` optional: where the row's time comes from,
measured, interpolated or model (also: modelled, roofline); a table without it, or an empty cell,
is taken as measured, and the plan's notes say so). ``layer`` is a layer name or a geometry signature
(``conv64x56x56-64-k3x3-s1x1-p1x1-d1x1-g1``); ``pass`` is forward, backward_data or backward_weight
(also: fwd, backward-data, dgrad, backward_filter, wgrad, ...). Every error names the file, the line
and the reason on one line.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import Iterable

from dlsim.errors import SpecError, excerpt
from dlsim.io.files import read_text, write_atomic
from dlsim.io.runfiles import RESUMED
from dlsim.plan.microbatch.configs import Kernel
from dlsim.plan.microbatch.table import SOURCES, BenchTable, canonical_pass, canonical_source

COLUMNS = ("layer", "pass", "microbatch_size", "algorithm", "time_s", "workspace_bytes", "source")
OLD_COLUMNS = COLUMNS[:-1]
"""The header of tables written before the ``source`` column (read and appended to as they are)."""
REQUIRED = ("layer", "microbatch_size", "algorithm", "time_s", "workspace_bytes")


def _number(text: str, path: Path, line: int, column: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise SpecError(f"{column} must be a number, got {excerpt(text)}", path=path, field=f"line {line}") from None
    if not math.isfinite(value) or abs(value) > 1e18:
        raise SpecError(f"{column} must be finite and at most 1e18, got {excerpt(text)}", path=path, field=f"line {line}")
    return value


def parse_rows(path: Path, lines: Iterable[str], known_layers: Iterable[str] | None = None,
               source: str = "measured") -> BenchTable:
    """Validate CSV text into a `BenchTable`; `known_layers` (names or signatures) rejects unknown layers."""
    try:
        return _parse_rows(path, lines, known_layers, source)
    except csv.Error as exc:
        raise SpecError(f"malformed CSV: {excerpt(str(exc), 120)}", path=path) from None


def _parse_rows(path: Path, lines: Iterable[str], known_layers: Iterable[str] | None, source: str) -> BenchTable:
    reader = csv.DictReader(lines)
    header = [h.strip() for h in (reader.fieldnames or [])]
    if not header:
        raise SpecError("empty file: expected a header line " + ",".join(COLUMNS), path=path)
    reader.fieldnames = header
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise SpecError(f"missing column {missing[0]!r} (columns: {excerpt(','.join(header), 100)}; expected {','.join(COLUMNS)})",
                        path=path)
    known = set(known_layers) if known_layers is not None else None
    seen: dict[tuple, int] = {}
    rows = []
    for rec in reader:
        line = reader.line_num
        if all((v or "").strip() == "" for v in rec.values() if isinstance(v, str)):
            continue
        if None in rec:
            raise SpecError("more fields than the header has columns", path=path, field=f"line {line}")
        layer = (rec.get("layer") or "").strip()
        if not layer:
            raise SpecError("empty layer", path=path, field=f"line {line}")
        if known is not None and layer not in known:
            raise SpecError(f"unknown layer {excerpt(layer)}", path=path, field=f"line {line}")
        pass_text = (rec.get("pass") or "forward").strip() or "forward"
        pass_name = canonical_pass(pass_text)
        if pass_name is None:
            raise SpecError(f"unknown pass {excerpt(pass_text)} (use forward, backward_data, backward_weight)",
                            path=path, field=f"line {line}")
        algorithm = (rec.get("algorithm") or "").strip()
        if not algorithm:
            raise SpecError("empty algorithm", path=path, field=f"line {line}")
        size = _number(rec.get("microbatch_size") or "", path, line, "microbatch_size")
        if size < 1 or size != int(size):
            raise SpecError(f"microbatch_size must be a positive integer, got {excerpt(rec['microbatch_size'])}",
                            path=path, field=f"line {line}")
        seconds = _number(rec.get("time_s") or "", path, line, "time_s")
        if seconds <= 0:
            raise SpecError(f"{'negative' if seconds < 0 else 'zero'} time_s {rec['time_s'].strip()[:40]} "
                            "(a kernel's time must be positive)", path=path, field=f"line {line}")
        ws = _number(rec.get("workspace_bytes") or "", path, line, "workspace_bytes")
        if ws < 0:
            raise SpecError(f"negative workspace_bytes {rec['workspace_bytes'].strip()[:40]}", path=path, field=f"line {line}")
        row_source = source
        if (rec.get("source") or "").strip():
            row_source = canonical_source(rec["source"]) or ""
            if not row_source:
                raise SpecError(f"unknown source {excerpt(rec['source'])} (use {', '.join(SOURCES)})", path=path,
                                field=f"line {line}")
        key = (layer, pass_name, int(size), algorithm)
        if key in seen:
            raise SpecError(f"duplicate row for layer {excerpt(layer)} {pass_name} size {int(size)} {algorithm} "
                            f"(first on line {seen[key]})", path=path, field=f"line {line}")
        seen[key] = line
        rows.append((layer, pass_name, Kernel(algorithm, int(size), seconds, ws), row_source))
    if not rows:
        raise SpecError("no rows", path=path)
    return BenchTable.from_rows(rows, source=source, origin=str(path))


def has_source_column(table: BenchTable | str | Path) -> bool:
    """Whether a benchmark CSV says where its times come from (a ``source`` column)."""
    origin = table.origin if isinstance(table, BenchTable) else str(table)
    try:
        with open(origin, newline="") as handle:
            header = next(csv.reader(handle), [])
    except OSError:
        return isinstance(table, BenchTable)  # a table built in memory carries its sources
    return "source" in [h.strip() for h in header]


def load_bench_table(path: str | Path, known_layers: Iterable[str] | None = None,
                     source: str = "measured") -> BenchTable:
    """Load and validate a benchmark CSV (see the module docstring)."""
    path = Path(path)
    text = read_text(path, "benchmark table")
    return parse_rows(path, text.splitlines(), known_layers, source)


def format_rows(rows: Iterable[tuple[str, str, Kernel, str]]) -> str:
    """CSV text (with header) for (layer, pass, Kernel, source) rows."""
    out = [",".join(COLUMNS)]
    for layer, pass_name, k, source in rows:
        out.append(format_row(layer, pass_name, k, source))
    return "\n".join(out) + "\n"


def format_row(layer: str, pass_name: str, k: Kernel, source: str | None = "measured") -> str:
    """One CSV line; `source` None leaves the column out (a table written before it existed)."""
    line = f"{layer},{pass_name},{k.size},{k.algorithm},{k.time_s:.9g},{k.workspace_bytes:.0f}"
    return line if source is None else f"{line},{source}"


def write_bench_table(path: str | Path, table: BenchTable) -> None:
    """Write a whole table atomically, each row with its kernel's source."""
    mixed = [f"{k.layer} {k.pass_name}" for k in table.kernels if k.source not in SOURCES]
    if mixed:
        raise SpecError(f"kernel {mixed[0]} has rows of several sources; write them row by row", field="source")
    write_atomic(Path(path), format_rows((k.layer, k.pass_name, r, k.source) for k in table.kernels for r in k.rows))


def resume_rows(path: str | Path) -> dict[tuple[str, str, int, str], Kernel]:
    """Rows already in a benchmark CSV that a calibration appends to, by (layer, pass, size, algorithm).

    Creates the file with its header when it is missing or empty. A partial last line (a run killed
    while writing it) is cut off: it is an unfinished measurement, never a complete row.
    The whole lines are checked before anything is cut or appended: a file that is not a benchmark
    table (its first line is not the header) is refused untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.stat().st_size == 0:
        append_lines(path, [",".join(COLUMNS)])
        return {}
    text = read_text(path, RESUMED)
    keep = text[:text.rfind("\n") + 1]
    headers = (",".join(COLUMNS), ",".join(OLD_COLUMNS))
    if keep.split("\n", 1)[0].strip() not in headers:
        raise SpecError(f"not a benchmark table (its first line is not {headers[0]}); refusing to append to it",
                        path=path, field="line 1")
    rows = {} if keep.strip() in headers else {
        (k.layer, k.pass_name, r.size, r.algorithm): r for k in parse_rows(path, keep.splitlines()).kernels
        for r in k.rows}
    if keep != text:
        with open(path, "r+b") as handle:
            handle.truncate(handle.read().rfind(b"\n") + 1)
    return rows


def append_lines(path: Path, lines: list[str]) -> None:
    """Append whole lines with one write, then fsync: a crash leaves complete rows and at most one partial line."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, ("\n".join(lines) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def append_rows(path: str | Path, rows: Iterable[tuple[str, str, Kernel]]) -> None:
    """Append measured rows to a benchmark CSV (see `resume_rows`), in the columns its header names."""
    source = "measured" if has_source_column(path) else None
    lines = [format_row(layer, p, k, source) for layer, p, k in rows]
    if lines:
        append_lines(Path(path), lines)
