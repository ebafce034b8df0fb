"""Reading and writing files safely.

Reading: a size limit before anything is read, and UTF-8 decoding whose failure is one line naming
the byte. Writing: atomic (a temporary file with an unpredictable name beside the target, fsync,
rename), durable (the directory is fsynced too), readable as the umask says (not mkstemp's 0600), a
symlink target is replaced through the link (the link stays), and an existing file is replaced only
when the caller says so.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from dlsim.errors import DlsimError, SpecError

MAX_INPUT_BYTES = 64 * 2**20


class OutputError(DlsimError):
    """An output that cannot be written, or that would overwrite an input or an existing file."""


def read_text(path: Path | str, what: str = "file", limit: int = MAX_INPUT_BYTES) -> str:
    """The text of a UTF-8 file, or one SpecError naming the file and the reason."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise SpecError(f"cannot read {what} ({exc.strerror or exc})", path=path) from None
    if len(data) > limit:
        raise SpecError(f"{what} is larger than {limit // 2**20} MiB", path=path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SpecError(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})", path=path,
                        field=f"line {line}") from None
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise SpecError("not a text file (contains a NUL byte)", path=path, field=f"line {line}")
    return text.removeprefix("\ufeff")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def same_file(a: Path | str, b: Path | str) -> bool:
    """Whether two paths name the same file (through links); False when either does not exist."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def check_output(path: Path | str, *, inputs: tuple[Path | str, ...] = (), force: bool = False,
                 option: str = "output") -> Path:
    """Refuse an output path that is an input of the same run, a directory, or (without force) an existing file."""
    path = Path(path)
    for source in inputs:
        if source is not None and same_file(path, source):
            raise OutputError(f"{option} {path} is an input of this run; refusing to overwrite it")
    if path.is_dir():
        raise OutputError(f"{option} {path} is a directory")
    if path.exists() and not force:
        raise OutputError(f"{option} {path} exists; pass --force to replace it")
    return path


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path | str, text: str | bytes) -> None:
    """Write to `path` through an fsynced temporary file and a rename: a reader never sees half a file.

    A symlink is followed (its target is replaced, the link kept). Errors are one `OutputError` line.
    """
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    data = text.encode() if isinstance(text, str) else text
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir():
            raise OutputError(f"{path} is a directory")
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise OutputError(f"cannot write {path} ({exc.strerror or exc})") from None
    try:
        try:
            os.fchmod(fd, 0o666 & ~_umask())
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        except OSError as exc:
            raise OutputError(f"cannot write {path} ({exc.strerror or exc})") from None
        _fsync_dir(target.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
