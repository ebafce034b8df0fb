"""Appending measured rows to a CSV table so that an interrupted calibration loses nothing.

Each row is one ``write`` of a whole line to a file opened with O_APPEND, followed by ``fsync``:
once `TableFile.append` returns, the row is on disk, and a process killed at any moment leaves at
most one partial last line (a line without its newline), which `TableFile` removes when it opens
the file again (that measurement was not finished, so nothing measured is lost). On a restart the
keys already present are skipped, so no row is measured twice.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Callable, Iterable


class TableFile:
    """One CSV table: its columns, the keys already measured, and atomic appends."""

    def __init__(self, path: Path | str, columns: Iterable[str], key: Callable[[dict[str, str]], tuple]):
        self.path, self.columns, self._key = Path(path), tuple(columns), key
        self.keys: set[tuple] = set()
        self.dropped_partial = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size > 0:
            self._load()
        else:
            self._write_line(",".join(self.columns))

    def _load(self) -> None:
        data = self.path.read_bytes()
        if not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            os.truncate(self.path, cut)  # an unfinished last line: that measurement never completed
            data = data[:cut]
            self.dropped_partial = True
            if not data:
                self._write_line(",".join(self.columns))
                return
        reader = csv.DictReader(io.StringIO(data.decode()))
        header = tuple(h.strip() for h in reader.fieldnames or ())
        if header != self.columns:
            raise ValueError(f"{self.path}: header {','.join(header)} is not the expected {','.join(self.columns)}")
        for rec in reader:
            self.keys.add(self._key(rec))

    def _write_line(self, line: str) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def has(self, rec: dict[str, str]) -> bool:
        return self._key(rec) in self.keys

    def append(self, rec: dict[str, str]) -> None:
        """Write one row (a mapping column -> text) durably and remember its key."""
        self.extend([rec])

    def extend(self, recs: Iterable[dict[str, str]]) -> None:
        """Write rows in one write and one fsync (rows copied, not measured: all or, after a crash, a prefix)."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        recs = list(recs)
        for rec in recs:
            writer.writerow([rec[c] for c in self.columns])
        if recs:
            self._write_line(buf.getvalue()[:-1])
        self.keys.update(self._key(rec) for rec in recs)
