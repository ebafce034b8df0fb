"""JSON-lines files that a killed process leaves whole: append records durably, read back whole lines.

Writing (`JsonLinesWriter`): each batch of records is one ``os.write`` of whole lines to a file opened
with O_APPEND, followed by ``fsync``, so a process killed at any moment (SIGKILL included) leaves whole
lines and at most one truncated last line. Reading (`read_records`): every whole line that is a JSON
object, in order (a truncated last line is left out). A results file that a run resumes is read by
`dlsim.io.results_log`, which validates every line and cuts a killed writer's last line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dlsim.io.files import OutputError


def read_records(path: Path | str) -> list[dict[str, Any]]:
    """The JSON objects of the whole lines of `path` (none when it does not exist); see the module docstring."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise OutputError(f"cannot read {path} ({exc.strerror or exc})") from None
    cut = data.rfind(b"\n") + 1
    out = []
    for line in data[:cut].splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


_LINE = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
"""One record per line, compact, strict (json.dumps with these options, its encoder made once)."""


def append_lines(fd: int, records: list[dict[str, Any]], sync: bool = True) -> None:
    """Append `records` to the O_APPEND descriptor `fd` as whole lines: one write, then fsync (strict
    JSON: a non-finite number is a ValueError, never written)."""
    if not records:
        return
    encode = _LINE.encode
    data = "".join(encode(r) + "\n" for r in records).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    if sync:
        os.fsync(fd)


class JsonLinesWriter:
    """Appends whole lines: one write and one fsync per batch."""

    def __init__(self, path: Path | str, sync: bool = True):
        self.path, self.sync = Path(path), sync
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            raise OutputError(f"cannot write {path} ({exc.strerror or exc})") from None

    def append(self, records: list[dict[str, Any]]) -> None:
        append_lines(self.fd, records, self.sync)

    def close(self) -> None:
        os.close(self.fd)
