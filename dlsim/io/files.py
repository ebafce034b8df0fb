"""Reading and writing files safely.

Reading: a size limit before anything is read, and UTF-8 decoding whose failure is one line naming
the byte; every file read is an input of the run (`dlsim.io.runfiles`). Writing goes through
`check_output` first, the one gate of every writer: a name the file system can hold, never an
input of the run, never another output of it, never a directory, socket or block device, and an
existing regular file only when the caller says so. `write_atomic` then writes a regular file
atomically (a temporary file with an unpredictable name beside the target, fsync, rename; the
directory fsynced too; readable as the umask says, not mkstemp's 0600; a symlink's target replaced
through the link, the link kept) and writes *into* a character device or a FIFO (``/dev/null``, a
terminal, a pipe), never renaming over it.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from dlsim.errors import SpecError
from dlsim.io.runfiles import OutputError, claim_output, note_input, shown

MAX_INPUT_BYTES = 64 * 2**20
NAME_MAX = 255      # bytes of one path component where the file system does not say (POSIX NAME_MAX on Linux)
PATH_MAX = 4096     # bytes of a whole path (Linux PATH_MAX)
TEMP_EXTRA = 16     # bytes a temporary name adds to the target's: "." + "." + 8 random + ".tmp" + slack

__all__ = ["OutputError", "read_text", "same_file", "check_output", "check_name", "write_atomic", "MAX_INPUT_BYTES"]


def read_text(path: Path | str, what: str = "file", limit: int = MAX_INPUT_BYTES) -> str:
    """The text of a UTF-8 file, or one SpecError naming the file and the reason; the file is an input of
    the run in progress (`dlsim.io.runfiles.note_input`: no output of the run may be it)."""
    path = Path(path)
    note_input(path, what)
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
    except (OSError, ValueError):
        return os.path.abspath(a) == os.path.abspath(b)


def _name_max(folder: Path) -> int:
    """Longest file name (bytes) in `folder`, or in its nearest existing ancestor."""
    for d in (folder, *folder.parents):
        try:
            return int(os.pathconf(d, "PC_NAME_MAX"))
        except (OSError, ValueError):
            continue
    return NAME_MAX


def check_name(path: Path | str, option: str = "output") -> Path:
    """`path` when the file system can hold a file of that name; else one `OutputError` line (empty, a
    NUL byte, a directory's name, a component or a whole path too long)."""
    text = os.fspath(path)
    if not text:
        raise OutputError(f"{option} needs a file name, got an empty one")
    if "\x00" in text:
        raise OutputError(f"{option} {shown(repr(text))}: a file name cannot hold a NUL byte")
    try:
        encoded = os.fsencode(text)
    except UnicodeError:
        raise OutputError(f"{option} {shown(repr(text))}: not a valid file name (undecodable characters)") from None
    if text.endswith(os.sep) or Path(text).name in ("", ".", ".."):
        raise OutputError(f"{option} {shown(text)} names a directory, not a file")
    if len(encoded) >= PATH_MAX:
        raise OutputError(f"{option} {shown(text)}: path too long ({len(encoded)} bytes; at most {PATH_MAX - 1})")
    p = Path(text)
    limit = _name_max(p.parent)
    for part in p.parts:
        size = len(os.fsencode(part))
        if size > limit:
            raise OutputError(f"{option} {shown(text)}: file name too long ({size} bytes; the file system allows "
                              f"{limit})")
    return p


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a regular file" if stat.S_ISREG(mode) else "a special file")


def _stat(path: Path, option: str) -> os.stat_result | None:
    """`path`'s status through links, None when it does not exist; one line for what cannot be looked at."""
    try:
        return os.stat(path)
    except FileNotFoundError:  # also a dangling link: written through, at its target
        return None
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            raise OutputError(f"{option} {shown(path)}: a part of the path is not a directory") from None
        raise OutputError(f"{option} {shown(path)}: cannot look at it ({exc.strerror or exc})") from None


def _check_folder(path: Path, option: str) -> None:
    """The folder `path` goes into exists, or can be created, and takes new files (checked before any
    work, not found out when writing)."""
    folder = path.parent if str(path.parent) else Path(".")
    for d in (folder, *folder.parents):
        try:
            st = os.stat(d)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise OutputError(f"{option} {shown(path)}: cannot look at {shown(d)} ({exc.strerror or exc})") from None
        if not stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{option} {shown(path)}: {shown(d)} is not a directory")
        if not os.access(d, os.W_OK | os.X_OK):
            raise OutputError(f"{option} {shown(path)}: cannot create files in {shown(d)} (not writable)")
        return


def check_output(path: Path | str, *, inputs: tuple[Path | str | None, ...] = (), force: bool = False,
                 option: str = "output", resume: bool = False) -> Path:
    """The one gate every writer passes before it writes `path` (see the module docstring).

    Refuses, in one `OutputError` line: a name the file system cannot hold; a file that is one of
    `inputs` or any input this run has read or will read (`dlsim.io.runfiles`), or another output
    of it; a directory, socket or block device; a character device or FIFO for a `resume`d output
    (a results file is read back and locked: it must be a regular file); an existing regular file
    without `force` (a `resume`d one is appended to, never replaced). A character device or FIFO is
    written into (`write_atomic`), so it needs no `force`."""
    path = check_name(path, option)
    for source in inputs:
        if source is not None and same_file(path, source):
            raise OutputError(f"{option} {shown(path)} is an input of this run; refusing to overwrite it")
    st = _stat(path, option)
    if st is None or stat.S_ISREG(st.st_mode):
        _check_folder(Path(os.path.realpath(path)) if os.path.islink(path) else path, option)
    if st is not None:
        mode = st.st_mode
        if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
            if resume:
                raise OutputError(f"{option} {shown(path)} is {_kind(mode)}; a results file must be a regular file")
            if not os.access(path, os.W_OK):
                raise OutputError(f"{option} {shown(path)} is {_kind(mode)} this process cannot write")
        elif not stat.S_ISREG(mode):
            raise OutputError(f"{option} {shown(path)} is {_kind(mode)}; refusing to write it")
        elif not force and not resume:
            raise OutputError(f"{option} {shown(path)} exists; pass --force to replace it")
    claim_output(path, option, resume=resume)
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


def _write_into(path: Path, target: Path, data: bytes) -> None:
    """Write `data` into a character device or FIFO (never create, truncate or rename it)."""
    try:
        fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OutputError(f"cannot write {shown(path)} (a FIFO that no process reads)") from None
        raise OutputError(f"cannot write {shown(path)} ({exc.strerror or exc})") from None
    try:
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        raise OutputError(f"cannot write {shown(path)} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def write_atomic(path: Path | str, text: str | bytes) -> None:
    """Write `text` to `path`: a regular file through an fsynced temporary file and a rename (a reader
    never sees half a file); a character device or FIFO by writing into it. A symlink is followed
    (its target is replaced, the link kept). Errors are one `OutputError` line. Callers check the
    path first (`check_output`)."""
    path = check_name(path)
    target = Path(os.path.realpath(path)) if os.path.islink(path) else path
    data = text.encode() if isinstance(text, str) else text
    st = _stat(target, "output")
    if st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        _write_into(path, target, data)
        return
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{shown(path)} is {_kind(st.st_mode)}; refusing to write it")
    room = max(1, _name_max(target.parent) - TEMP_EXTRA)
    stem = os.fsencode(target.name)[:room].decode("utf-8", "ignore") or "out"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{stem}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise OutputError(f"cannot write {shown(path)} ({exc.strerror or exc})") from None
    try:
        try:
            os.fchmod(fd, 0o666 & ~_umask())
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        except OSError as exc:
            raise OutputError(f"cannot write {shown(path)} ({exc.strerror or exc})") from None
        _fsync_dir(target.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
