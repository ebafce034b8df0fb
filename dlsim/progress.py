"""A progress bar with the time left, for long jobs (calibration, validation); quiet off a terminal.

One line on stderr, redrawn in place at most every `min_interval` seconds::

    [##########..........]  12/40  30%  0:12 elapsed  ~0:28 left  gemm 512x512x512

The time left is the mean time per finished item so far times the items left (items resumed from
an earlier run are not counted as work done now, nor time spent in a `phase`: work before the items
that is none of them, such as the calibration's loop probe). Off a terminal (CI logs, pipes) nothing is drawn;
`line()` messages (failures, warnings) are printed in both cases. ``DLSIM_PROGRESS=0`` turns the bar
off, ``DLSIM_PROGRESS=1`` on. A module of its own at the bottom layer (no dlsim imports) because
the communication calibration workers draw it from a process of their own.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from typing import Callable, TextIO

_COUNT = re.compile(r"(\d+)\s*/\s*(\d+)")
PHASE_RUNNING, PHASE_DONE = "running", "done"
"""Statuses a per-item progress callback passes for work that is not an item: it started, it ended."""


def on_terminal(stream: TextIO) -> bool:
    """Whether a bar belongs on `stream`: a terminal that can redraw, unless DLSIM_PROGRESS says."""
    forced = os.environ.get("DLSIM_PROGRESS", "").strip().lower()
    if forced in ("0", "no", "off", "false"):
        return False
    if forced in ("1", "yes", "on", "true"):
        return True
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError, OSError):
        return False


def format_clock(seconds: float) -> str:
    """``42s``, ``3:07``, ``1:02:03``."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def time_left(done: int, total: int, elapsed: float, base: int = 0) -> float | None:
    """Seconds left at the mean pace so far, `base` items having been done before this run started
    (None before the first item of this run finishes)."""
    if done - base <= 0 or total <= 0:
        return None
    return elapsed / (done - base) * max(0, total - done)


def render(done: int, total: int, elapsed: float, status: str = "", width: int = 80, base: int = 0,
           paced: float | None = None) -> str:
    """The bar line for `done` of `total` items after `elapsed` seconds, cut to `width` characters; the time
    left from the `paced` seconds spent on the items (default: all of `elapsed`)."""
    frac = min(1.0, done / total) if total > 0 else 0.0
    cells = 20
    full = int(frac * cells)
    bar = "#" * full + "." * (cells - full)
    left = time_left(done, total, elapsed if paced is None else paced, base)
    text = (f"[{bar}] {done:>{len(str(total))}}/{total} {100 * frac:3.0f}%  {format_clock(elapsed)} elapsed"
            f"  {'~' + format_clock(left) + ' left' if left is not None else '--:-- left'}")
    if status:
        text += "  " + status
    return text[:max(10, width - 1)]


class Progress:
    """A bar on `stream` (stderr): `update(done, total, status)`, `line(text)`, `close()`."""

    def __init__(self, total: int = 0, stream: TextIO | None = None, enabled: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, min_interval: float = 0.1):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = on_terminal(self.stream) if enabled is None else enabled
        self.clock, self.min_interval = clock, min_interval
        self.total, self.done, self.status = total, 0, ""
        self.started = self._last = clock()
        self._drawn_at: float | None = None
        self._base: int | None = None  # items done before this run (a resumed calibration)
        self._phase_at: float | None = None  # when the open phase began
        self._excluded = 0.0  # seconds spent in phases, left out of the pace
        self._shown = False

    def update(self, done: int, total: int | None = None, status: str = "") -> None:
        """`done` items of `total` finished; `status` says what the last one was."""
        now = self.clock()
        if total is not None:
            self.total = total
        self.end_phase()
        if self._base is None:  # the first item finished in this run: those before it were resumed
            self._base = max(0, done - 1)
        elif done < self.done:  # a new pass counting from 1 again: its pace from the last update on
            self._base, self.started, self._excluded = max(0, done - 1), self._last, 0.0
        self.done, self.status, self._last = done, status, now
        if self._drawn_at is None or now - self._drawn_at >= self.min_interval or done >= self.total:
            self._draw(now)

    def phase(self, status: str, total: int | None = None) -> None:
        """Work that is none of the counted items (a probe before the first kernel) begins: shown as the
        status, its time left out of the pace until `end_phase` (or the next finished item)."""
        now = self.clock()
        if total is not None:
            self.total = total
        if self._phase_at is None:
            self._phase_at = now
        self.status = status
        self._draw(now)

    def end_phase(self) -> None:
        """The open phase, if any, is over."""
        if self._phase_at is not None:
            now = self.clock()
            self._excluded += now - self._phase_at
            self._phase_at, self._last = None, now

    def message(self, text: str, keep_uncounted: bool = False) -> None:
        """A free-form progress message; a leading ``[i/n]``, ``i/n`` or ``round i/n`` sets the count.
        One without a count is the bar's status, or with `keep_uncounted` a `line()` of its own."""
        m = _COUNT.search(text[:40])
        if m and int(m.group(2)) > 0:
            self.update(int(m.group(1)), int(m.group(2)), text[m.end():].lstrip("] :") or text)
        elif keep_uncounted:
            self.line(text)
        else:
            self.update(self.done, None, text)

    def line(self, text: str) -> None:
        """A message that stays (a failure, a warning): printed on its own line, on a terminal or not."""
        self._clear()
        print(text, file=self.stream, flush=True)
        if self.enabled and self._drawn_at is not None:
            self._draw(self.clock())

    def close(self) -> None:
        """Leave the last bar on its line (a terminal) and move on."""
        if self.enabled and self._shown:
            self._draw(self.clock())
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _width(self) -> int:
        return shutil.get_terminal_size((100, 20)).columns

    def _draw(self, now: float) -> None:
        self._drawn_at = now
        if not self.enabled:
            return
        elapsed = now - self.started
        text = render(self.done, self.total, elapsed, self.status, self._width(), self._base or 0,
                      paced=elapsed - self._excluded - (now - self._phase_at if self._phase_at is not None else 0.0))
        self.stream.write("\r\x1b[2K" + text)
        self.stream.flush()
        self._shown = True

    def _clear(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self._shown = False
