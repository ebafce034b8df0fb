"""The files one run reads and the outputs it claims, so that no input is ever an output (issue 29).

An input is every file a run reads, not only those named on its command line: a model reached
through ``extends:``, a profile's tables, an imported module's source, a resumed results file.
Readers call `note_input` (`dlsim.io.files.read_text` does for every text input); writers claim
their path first (`dlsim.io.files.check_output` calls `claim_output`). Whichever comes second
refuses: a claim on a file already read, or a read of a file already claimed, is one `OutputError`
line before anything is written. A *resumed* output (a results file appended to) is read and
written by the same run on purpose: it may be read, but no other output may claim it.

Files are told apart by identity (device and inode, through symlinks and hard links) when they
exist, else by their resolved path. The registry lives in a context variable: the CLI opens one
scope per command (`run_scope`), and so do API functions that write; outside a scope, reads are
not recorded (a library caller's reads concern nobody).
"""

from __future__ import annotations

import contextlib
import os
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from dlsim.errors import DlsimError


RESUMED = "resumed results"
"""What `note_input` is told for a results file a run resumes: the one input its own output may be."""


class OutputError(DlsimError):
    """An output that cannot be written, or that would overwrite an input or an existing file."""


def shown(path: Path | str, limit: int = 80) -> str:
    """A path as an error line shows it: whole when short, else its start and end."""
    text = str(path)
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}...{text[-(limit // 2 - 3):]} ({len(text)} characters)"


def identity(path: Path | str) -> tuple[int, int] | None:
    """(device, inode) of the file `path` names through links; None when it does not exist."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _resolved(path: Path | str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return os.path.abspath(path)


@dataclass(frozen=True)
class Claim:
    """An output of the run: the option that writes it, its resolved path and identity at claim time."""

    path: str
    option: str
    resolved: str
    ident: tuple[int, int] | None
    resume: bool = False


@dataclass
class RunFiles:
    """What one run has read (`inputs`: identity or resolved path -> (path, what)) and claimed."""

    inputs: dict[object, tuple[str, str]] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)

    def input_for(self, path: Path | str) -> tuple[str, str] | None:
        """The recorded input (path as read, what it was) that `path` names, or None."""
        ident = identity(path)
        if ident is not None and ident in self.inputs:
            return self.inputs[ident]
        return self.inputs.get(_resolved(path))

    def claim_for(self, path: Path | str) -> Claim | None:
        """The claim that `path` names (same file, or same resolved path), or None."""
        ident, resolved = identity(path), _resolved(path)
        for c in self.claims:
            if (ident is not None and c.ident == ident) or c.resolved == resolved:
                return c
        return None


_CURRENT: ContextVar[RunFiles | None] = ContextVar("dlsim_run_files", default=None)


def current() -> RunFiles | None:
    """The registry of the run in progress, or None outside any `run_scope`."""
    return _CURRENT.get()


@contextlib.contextmanager
def run_scope() -> Iterator[RunFiles]:
    """Record this run's inputs and outputs; a scope inside another one joins it."""
    existing = _CURRENT.get()
    if existing is not None:
        yield existing
        return
    files = RunFiles()
    token = _CURRENT.set(files)
    try:
        yield files
    finally:
        _CURRENT.reset(token)


def note_input(path: Path | str, what: str = "input") -> None:
    """Record that this run reads `path` (`what` says how it was reached, for the message); raise
    `OutputError` when an output of the run is that file, unless it is a resumed output read as such
    (`RESUMED`, or read again after it was: a calibration reads its finished table back)."""
    files = _CURRENT.get()
    if files is None:
        return
    claim = files.claim_for(path)
    ident = identity(path)
    key: object = ident if ident is not None else _resolved(path)
    prior = files.input_for(path)
    resumed = what == RESUMED or (prior is not None and prior[1] == RESUMED)
    if claim is not None and not (claim.resume and resumed):
        raise OutputError(f"{claim.option} {shown(claim.path)} is an input of this run ({what} {shown(path)}); "
                          "refusing to overwrite it")
    files.inputs.setdefault(key, (str(path), what))


def claim_output(path: Path | str, option: str, *, resume: bool = False) -> None:
    """Record `path` as the output `option` writes; raise `OutputError` when this run read it (unless
    it is `resume`d and was read as such) or another option of the run writes it."""
    files = _CURRENT.get()
    if files is None:
        return
    other = files.claim_for(path)
    if other is not None:
        if other.option != option and not (other.resume and resume):
            raise OutputError(f"{option} {shown(path)} is already the {other.option} output of this run")
        return
    read = files.input_for(path)
    if read is not None and not (resume and read[1] == RESUMED):
        raise OutputError(f"{option} {shown(path)} is an input of this run ({read[1]} {shown(read[0])}); "
                          "refusing to overwrite it")
    files.claims.append(Claim(str(path), option, _resolved(path), identity(path), resume))

