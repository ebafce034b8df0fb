"""A results file that a run appends to and a later run resumes: one writer, whole lines, validated.

The file holds one JSON record per line, each keyed by a stable ``id``. `ResultsLog` is how a run
uses it (issue 29):

- **One writer.** `ResultsLog.open` takes ``<file>.lock`` (`filelock.MarkerSoftFileLock`: created with
  ``O_EXCL``, which is atomic on local file systems and on NFS v3 and later, and holding the holder's
  pid, host and process start time). A second run on the same file is refused in one line naming
  that process. A lock left by a process that is gone from this host (killed, crashed) is taken
  over; one left by a process on another host, which this host cannot probe, is reported with its
  host and pid so the user can remove it.
- **Validated like any input.** Every line is parsed strictly (``NaN`` and ``Infinity`` are not JSON
  numbers here) and checked by the caller's `check`; a damaged line is one `SpecError` naming the
  file and the line number, never trusted and never silently skipped. The one exception is a last
  line without its newline that begins like a record, the tail of a run killed while writing: it
  is cut off (`repair`), and only after every whole line has been checked, so that a file that is
  not a results file is refused untouched.
- **Whole lines.** `append` writes each batch of records with one ``os.write`` on an ``O_APPEND``
  descriptor, then ``fsync``: a kill at any moment leaves whole lines and at most one truncated last
  line, which the next run cuts.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlsim.errors import SpecError, excerpt
from dlsim.io.files import OutputError
from dlsim.io.jsonl import append_lines
from dlsim.io.runfiles import RESUMED, note_input, shown

LOCK_SUFFIX = ".lock"
RECORD_START = b'{"id":'   # how every line `ResultsLog.append` writes begins (its records put the id first)


def _not_a_number(name: str) -> float:
    raise ValueError(f"{name} is not a number")


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {excerpt(key, 40)} appears twice")
        out[key] = value
    return out


def parse_line(line: bytes) -> Any:
    """One JSON value, strictly: no NaN or Infinity, no key given twice. Raises ValueError."""
    return json.loads(line, parse_constant=_not_a_number, object_pairs_hook=_reject_duplicate_keys)


@dataclass
class Resumed:
    """The records of a results file by key (the id, or the caller's `key`; the first of each key),
    the line each came from, and how many later lines repeated a key already there."""

    records: dict[Hashable, dict[str, Any]] = field(default_factory=dict)
    lines: dict[Hashable, int] = field(default_factory=dict)
    repeated: int = 0
    cut_bytes: int = 0


def read_log(path: Path | str, kind: str, check: Callable[[dict[str, Any]], str | None] | None = None,
             repair: bool = False, key: Callable[[dict[str, Any]], Hashable] | None = None) -> Resumed:
    """The validated records of `kind` in the results file `path` (empty when it does not exist), by
    `key(record)` (default: the id; a sweep keys by id and engine, so that one file holds a point
    priced by each engine).

    A line that is not a JSON object with a string ``id`` and ``"kind": kind``, or that `check`
    finds wrong (it returns the reason), is a `SpecError` naming the line. With `repair`, a last line
    without its newline (a killed writer's) is cut off the file first."""
    path = Path(path)
    out = Resumed()
    if not path.exists():
        return out
    note_input(path, RESUMED)
    if not path.is_file():
        raise OutputError(f"{shown(path)} is not a regular file; a results file must be one")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise OutputError(f"cannot read {shown(path)} ({exc.strerror or exc})") from None
    cut = data.rfind(b"\n") + 1
    for number, line in enumerate(data[:cut].split(b"\n")[:-1], 1):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            rec = parse_line(line)
        except (ValueError, RecursionError) as exc:
            raise SpecError(f"not a whole JSON record ({excerpt(str(exc), 80)}); fix or delete that line and run "
                            "again", path=path, field=where) from None
        if not isinstance(rec, dict) or not isinstance(rec.get("id"), str) or rec.get("kind") != kind:
            raise SpecError(f"not a {kind} record (a JSON object with a string id and kind {kind!r}); fix or "
                            "delete that line and run again", path=path, field=where)
        problem = check(rec) if check is not None else None
        if problem:
            raise SpecError(f"{problem}; fix or delete that line and run again", path=path, field=where)
        name = rec["id"] if key is None else key(rec)
        if name in out.records:
            out.repeated += 1
            continue
        out.records[name] = rec
        out.lines[name] = number
    if cut < len(data):
        tail = data[cut:]
        if not tail.startswith(RECORD_START):  # not a record cut short: someone else's file, or damage
            last = data.count(b"\n") + 1
            raise SpecError("the last line is incomplete and not the start of a record; fix or delete it and run "
                            "again", path=path, field=f"line {last}")
        out.cut_bytes = len(tail)
        if repair:
            try:
                with open(path, "r+b") as handle:
                    handle.truncate(cut)
                    handle.flush()
                    os.fsync(handle.fileno())
            except OSError as exc:
                raise OutputError(f"cannot repair {shown(path)} ({exc.strerror or exc})") from None
    return out


def lock_path(path: Path | str) -> Path:
    """``<file>.lock`` beside the file a results path names through links."""
    return Path(os.path.realpath(path) + LOCK_SUFFIX)


def take_writer_lock(path: Path | str) -> Any:
    """The lock that makes this process the one writer of the results file `path` (a held
    `filelock.MarkerSoftFileLock`; `release()` it when done); one `OutputError` line naming the
    process that holds it."""
    from filelock import MarkerSoftFileLock, Timeout

    lock_file = lock_path(path)
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        lock = MarkerSoftFileLock(str(lock_file), timeout=0)
        for attempt in range(3):
            try:
                lock.acquire(timeout=0)
                return lock
            except Timeout:
                owner = lock.owner
                if owner is None and attempt < 2:  # being written or just released: look again
                    time.sleep(0.05)
                    continue
                who = f"process {owner.pid} on host {owner.hostname}" if owner is not None else "another process"
                raise OutputError(f"{shown(path)} is being written by {who} (lock {shown(lock_file)}); wait for it "
                                  "to finish or write elsewhere (if that process is gone, delete the lock file)") \
                    from None
    except OSError as exc:
        raise OutputError(f"cannot lock {shown(path)} ({exc.strerror or exc})") from None
    raise AssertionError("unreachable")


@contextlib.contextmanager
def one_writer(path: Path | str) -> Iterator[None]:
    """Hold `path`'s writer lock (`take_writer_lock`) for the block."""
    lock = take_writer_lock(path)
    try:
        yield
    finally:
        lock.release()


class ResultsLog:
    """The results file of one run: locked, resumed (`read_log`), appended to (`append`); a context manager."""

    def __init__(self, path: Path | str, sync: bool = True):
        self.path, self.sync = Path(path), sync
        self.fd: int | None = None
        self._lock: Any = None

    lock_path = staticmethod(lock_path)

    def open(self) -> ResultsLog:
        """Take the lock and open the file for appending; one `OutputError` line if another run holds it."""
        self._lock = take_writer_lock(self.path)
        try:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            self.close()
            raise OutputError(f"cannot write {shown(self.path)} ({exc.strerror or exc})") from None
        return self

    def append(self, records: list[dict[str, Any]]) -> None:
        """Append whole lines: one write and one fsync per batch."""
        if not records or self.fd is None:
            return
        try:
            append_lines(self.fd, records, self.sync)
        except OSError as exc:
            raise OutputError(f"cannot write {shown(self.path)} ({exc.strerror or exc})") from None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self._lock is not None and self._lock.is_locked:
            self._lock.release()
        self._lock = None

    def __enter__(self) -> ResultsLog:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
