"""Reading the measured kernel tables a hardware profile names (``tables:`` in profile.yaml).

profile.yaml maps a table kind to a CSV file beside it::

    tables: {gemm: gemm.csv, conv: conv.csv, memory: memory.csv}

Columns are `dlsim.cost.lookup.GEMM_COLUMNS`, `CONV_COLUMNS` and `MEMORY_COLUMNS` (times in seconds,
sizes in bytes). Kinds other than these three (communication tables, for instance) belong to other
readers and are skipped here. The profile's ``meta.yaml`` (written by `dlsim calibrate compute`) may
name the convolution algorithm the framework runs by default (``defaults: {conv_algorithm: mkldnn}``);
without it the fastest measured algorithm is used, and a note says so.

Warm tables (kernels timed back to back, caches not flushed) are the kinds ``gemm_warm``,
``conv_warm`` and ``memory_warm`` with the same columns; with them and the last-level cache size
that meta.yaml records (``device.last_level_cache_bytes``) the estimate picks cold or warm per model
(`dlsim.cost.lookup.CacheAwareKernelTimes`). Profiles without them read as before (cold only).

Every problem (a missing file, a missing column, a bad number, a duplicate row) is one `SpecError`
naming the file, the line and the reason.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Callable

from dlsim.cost.lookup import (CONV_COLUMNS, CONV_PASSES, CONV_SHAPE_FIELDS, GEMM_COLUMNS, MEMORY_COLUMNS, SETS,
                               conv_shape, CacheAwareKernelTimes,
                               ConvRow, GemmRow, MeasuredKernelTimes, MemoryRow)
from dlsim.cost.pricing import PASSES
from dlsim.errors import SpecError, excerpt
from dlsim.io.files import read_text
from dlsim.io.runfiles import note_input
from dlsim.io.yamlfile import read_yaml
from dlsim.spec.cluster import Cluster
from dlsim.units import DTYPE_BYTES

KINDS = ("gemm", "conv", "memory")
MAX_VALUE = 1e18   # bytes, FLOP or seconds in one row: anything larger is a typo
MAX_COUNT = 2**31
WARM_SUFFIX = "_warm"


class _Line:
    """Typed access to one CSV record, with errors that name the file and line."""

    def __init__(self, path: Path, line: int, rec: dict[str, str]):
        self.path, self.line, self.rec = path, line, rec

    def fail(self, reason: str) -> SpecError:
        return SpecError(reason, path=self.path, field=f"line {self.line}")

    def text(self, column: str, allowed: tuple[str, ...] | None = None) -> str:
        value = (self.rec.get(column) or "").strip()
        if not value:
            raise self.fail(f"empty {column}")
        if allowed is not None and value not in allowed:
            raise self.fail(f"{column} {excerpt(value)} is not one of {', '.join(allowed)}")
        return value

    def number(self, column: str, *, positive: bool = False) -> float:
        raw = self.text(column)
        try:
            value = float(raw)
        except ValueError:
            raise self.fail(f"{column} must be a number, got {excerpt(raw)}") from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0) or value > MAX_VALUE:
            raise self.fail(f"{column} must be a {'positive' if positive else 'non-negative'} finite number "
                            f"up to {MAX_VALUE:g}, got {excerpt(raw)}")
        return value

    def count(self, column: str, *, minimum: int = 1) -> int:
        value = self.number(column)
        if value != int(value) or value < minimum or value > MAX_COUNT:
            raise self.fail(f"{column} must be an integer in [{minimum}, {MAX_COUNT}], got {excerpt(self.rec[column].strip())}")
        return int(value)

    def dtype(self) -> str:
        return self.text("dtype", tuple(d for d in DTYPE_BYTES if not d.startswith("int")))


def _gemm(r: _Line) -> GemmRow:
    return GemmRow(r.dtype(), r.count("m"), r.count("n"), r.count("k"), r.count("count"), r.number("time_s", positive=True),
                   r.number("iqr_s"), r.count("repeats"), r.text("set", SETS))


def _conv(r: _Line) -> ConvRow:
    shape = {f: r.count(f, minimum=0 if f.startswith("pad") else 1) for f in CONV_SHAPE_FIELDS}
    return ConvRow(r.dtype(), r.text("pass", CONV_PASSES), r.text("algorithm"), r.count("n"), conv_shape(**shape),
                   r.number("time_s", positive=True), r.number("iqr_s"), r.number("workspace_bytes"), r.count("repeats"),
                   r.text("set", SETS))


def _memory(r: _Line) -> MemoryRow:
    return MemoryRow(r.dtype(), r.text("op"), r.text("pass", (*PASSES, "step")), r.text("signature"), r.number("bytes"),
                     r.number("flops"), r.number("time_s", positive=True), r.number("iqr_s"), r.count("repeats"),
                     r.text("set", SETS))


_PARSERS: dict[str, tuple[tuple[str, ...], Callable]] = {
    "gemm": (GEMM_COLUMNS, _gemm), "conv": (CONV_COLUMNS, _conv), "memory": (MEMORY_COLUMNS, _memory)}


def read_table(kind: str, path: str | Path) -> list:
    """Validated rows of one table (`kind` gemm, conv or memory, or their ``_warm`` variants)."""
    path = Path(path)
    columns, parse = _PARSERS[kind.removesuffix(WARM_SUFFIX)]
    text = read_text(path, f"{kind} table")
    try:
        return _read_rows(kind, path, columns, parse, text)
    except csv.Error as exc:
        raise SpecError(f"malformed CSV: {excerpt(str(exc), 120)}", path=path) from None


def _read_rows(kind: str, path: Path, columns: tuple[str, ...], parse: Callable, text: str) -> list:
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in reader.fieldnames or []]
    if not header:
        raise SpecError(f"empty file: expected a header line {','.join(columns)}", path=path)
    reader.fieldnames = header
    missing = [c for c in columns if c not in header]
    if missing:
        raise SpecError(f"missing column {missing[0]!r} (a {kind} table has {','.join(columns)})", path=path)
    rows, seen = [], {}
    for rec in reader:
        line = reader.line_num
        if None in rec:
            raise SpecError("more fields than the header has columns", path=path, field=f"line {line}")
        if all(not (v or "").strip() for v in rec.values()):
            continue
        row = parse(_Line(path, line, rec))
        if row.key in seen:
            raise SpecError(f"duplicate row (first on line {seen[row.key]})", path=path, field=f"line {line}")
        seen[row.key] = line
        rows.append(row)
    return rows


def read_meta_defaults(profile_dir: Path) -> dict:
    """The ``defaults`` mapping of a profile's meta.yaml ({} when there is none)."""
    meta = profile_dir / "meta.yaml"
    if not meta.is_file():
        return {}
    data = read_yaml(meta) or {}
    defaults = data.get("defaults", {}) if isinstance(data, dict) else {}
    if not isinstance(defaults, dict):
        raise SpecError("must be a mapping", path=meta, field="defaults")
    return defaults


def read_cache_bytes(profile_dir: Path) -> float | None:
    """The last-level cache size meta.yaml records (``device.last_level_cache_bytes``), or None."""
    meta = profile_dir / "meta.yaml"
    data = (read_yaml(meta) or {}) if meta.is_file() else {}
    value = (data.get("device") or {}).get("last_level_cache_bytes") if isinstance(data, dict) else None
    if value is None:
        return None
    if not isinstance(value, (int, float)) or value <= 0:
        raise SpecError(f"must be a positive number of bytes, got {value!r}", path=meta,
                        field="device.last_level_cache_bytes")
    return float(value)


def load_kernel_times(cluster: Cluster, *, conv_algorithm: str | None = None,
                      gemm_method: str = "local") -> tuple[CacheAwareKernelTimes | None, list[str]]:
    """Measured kernel times from the tables `cluster` names, and notes for the result record.

    Returns (None, []) when the profile names none of the gemm / conv / memory tables.
    `conv_algorithm` overrides the profile's default convolution algorithm ("fastest": the
    fastest measured one).
    """
    kinds = [k for k in KINDS if k in cluster.tables]
    if not kinds:
        return None, []
    rows = {k: read_table(k, cluster.tables[k]) if k in kinds else [] for k in KINDS}
    profile_dir = Path(cluster.source).parent if cluster.source else Path(cluster.tables[kinds[0]]).parent
    notes = []
    if conv_algorithm is None:
        conv_algorithm = read_meta_defaults(profile_dir).get("conv_algorithm")
        if conv_algorithm is None and rows["conv"]:
            notes.append("convolutions: no default algorithm in meta.yaml, using the fastest measured")
    elif conv_algorithm == "fastest":
        conv_algorithm = None
    cold = MeasuredKernelTimes(rows["gemm"], rows["conv"], rows["memory"], conv_algorithm=conv_algorithm,
                               gemm_method=gemm_method, origin=f"{cluster.name} tables")
    warm_kinds = [k for k in KINDS if k + WARM_SUFFIX in cluster.tables]
    warm = None
    if warm_kinds:
        w = {k: read_table(k + WARM_SUFFIX, cluster.tables[k + WARM_SUFFIX]) if k in warm_kinds else [] for k in KINDS}
        warm = MeasuredKernelTimes(w["gemm"], w["conv"], w["memory"], conv_algorithm=conv_algorithm,
                                   gemm_method=gemm_method, origin=f"{cluster.name} warm tables")
    times = CacheAwareKernelTimes(cold, warm, read_cache_bytes(profile_dir))
    notes.insert(0, times.summary())
    return times, notes


def load_comm_table(cluster: Cluster):
    """The measured collective table the profile names (``tables: {comm_collectives: ...}``) as a
    `dlsim.cost.collectives.measured.MeasuredCollectives`, or None when it names none.

    Columns are those `dlsim calibrate comm` writes (`dlsim.calibrate.comm_measure.COLLECTIVE_COLUMNS`);
    a row that cannot be read is a `SpecError` naming the file and the line."""
    from dlsim.cost.collectives.measured import CollectiveRow, MeasuredCollectives
    if "comm_collectives" not in cluster.tables:
        return None
    path = Path(cluster.tables["comm_collectives"])
    note_input(path, "collective table")
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise SpecError(f"cannot read collective table ({exc.strerror or exc})", path=path) from None
    rows = []
    try:
        for line, rec in enumerate(csv.DictReader(text.splitlines()), 2):
            r = _Line(path, line, {k.strip(): v for k, v in rec.items() if k is not None})
            rows.append(CollectiveRow(r.text("collective"), r.text("algorithm"), r.count("ranks"),
                                      r.number("size_bytes", positive=True), r.number("median_s", positive=True),
                                      (rec.get("backend") or "").strip(), (rec.get("hosts") or "").strip(),
                                      (rec.get("variant") or "").strip(), (rec.get("source") or "").strip()))
    except csv.Error as exc:
        raise SpecError(f"malformed CSV: {excerpt(str(exc), 120)}", path=path) from None
    return MeasuredCollectives(rows, path.name)
