"""Progress of long work (calibration, validation, sweeps) on stderr, drawn with rich; quiet off a terminal.

On a terminal, a live display (`rich.progress`), redrawn at every update and, while this process waits on
others (a probe in a fresh process) or does nothing it times (`tick`), every half second too, so its
clock ticks even while one long item or phase runs::

    ⠧ loop probe (heap) 3/16: cnn in a fresh process ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━    0:42
    ⠧ kernels                         ━━━━━━━━╸━━━━━━━━━━━━━━━━━━━━━━━━━   812/6028  2:10 elapsed  ~5:48 left  gemm 512x512x512

A *phase* (`phase`) is work that is none of the counted items (a probe before the first kernel, a
model's measured iterations), shown on a line of its own with its own count when it has one; its
time is left out of the items' pace. The time left is the mean time per finished item so far times
the items left; items resumed from an earlier run are not counted as work done now. Off a terminal
(CI logs, pipes, ``TERM=dumb``) nothing is drawn; `line()` messages (failures, warnings) are printed
in both cases. No drawing thread runs while this process times work (a kernel, a training step): it
would take the interpreter's lock and the CPU from what is timed. ``DLSIM_PROGRESS=0`` turns the display off, ``DLSIM_PROGRESS=1`` on. A module of its own
at the bottom layer (no dlsim imports) because the communication calibration workers draw it from a
process of their own.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any, Callable, TextIO

_COUNT = re.compile(r"(\d+)\s*/\s*(\d+)")
PHASE_RUNNING, PHASE_WAITING, PHASE_DONE = "running", "waiting", "done"
"""Statuses a per-item progress callback passes for work that is not an item: it started (or advanced: the
callback's counts are then the phase's own) in this process, or in other processes this one waits on (the
display's clock may tick on its own), it ended."""
TICK_S = 0.5


def on_terminal(stream: TextIO) -> bool:
    """Whether a display belongs on `stream`: a terminal that can redraw, unless DLSIM_PROGRESS says."""
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


class Progress:
    """A live display on `stream` (stderr): `update(done, total, status)` for counted items, `phase(name,
    done, total)` / `end_phase()` for work around them, `message(text)`, `line(text)`, `close()`."""

    def __init__(self, total: int = 0, stream: TextIO | None = None, enabled: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, min_interval: float = 0.1, label: str = "",
                 width: int | None = None, tick: bool = False):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = on_terminal(self.stream) if enabled is None else enabled
        self.clock, self.min_interval, self.label = clock, min_interval, label
        self.total, self.done, self.status = total, 0, ""
        self.started = self._last = clock()
        self._drawn_at: float | None = None
        self._base: int | None = None  # items done before this run (a resumed calibration)
        self._phase_at: float | None = None  # when the open phase began
        self._phase: tuple[str, int | None, int | None] = ("", None, None)
        self._excluded = 0.0  # seconds spent in phases, left out of the pace
        self._live: Any = None
        self._tasks: dict[str, Any] = {}
        self._width = width
        self._tick_always, self._ticking = tick, False
        self._ticker: Any = None

    # -- state -------------------------------------------------------------------------------
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

    def phase(self, name: str, total: int | None = None, done: int | None = None, waiting: bool = False) -> None:
        """Work that is none of the counted items begins or advances (a probe before the first kernel): its
        own line, with `done` of `total` steps when it counts them; its time is left out of the items' pace
        until `end_phase` (or the next finished item). `waiting`: the work runs in other processes, so the
        clock ticks on its own meanwhile."""
        now = self.clock()
        if self._phase_at is None:
            self._phase_at = now
        self._phase = (name, done, total)
        self._ticking = waiting
        self._draw(now)

    def end_phase(self) -> None:
        """The open phase, if any, is over."""
        if self._phase_at is not None:
            now = self.clock()
            self._excluded += now - self._phase_at
            self._phase_at, self._last, self._ticking = None, now, False
            if self._live is not None and "phase" in self._tasks:
                self._live.update(self._tasks["phase"], visible=False)

    def callback(self) -> Callable[[int, int, str, str], None]:
        """The callback long work reports to, ``(done, total, label, status)``: status `PHASE_RUNNING` or
        `PHASE_WAITING` is a phase advancing (its own `done` of `total`), `PHASE_DONE` ends it, anything else
        is an item finished (a status starting with "failed" is also printed as a line of its own)."""
        def report(done: int, total: int, label: str, status: str) -> None:
            if status in (PHASE_RUNNING, PHASE_WAITING):
                self.phase(label, total or None, done, waiting=status == PHASE_WAITING)
            elif status == PHASE_DONE:
                self.end_phase()
            else:
                if status.startswith("failed"):
                    self.line(f"[{done}/{total}] {label}: {status}")
                self.update(done, total, f"{label}: {status}")
        return report

    def message(self, text: str, keep_uncounted: bool = False) -> None:
        """A free-form progress message; a leading ``[i/n]``, ``i/n`` or ``round i/n`` sets the count.
        One without a count is the status, or with `keep_uncounted` a `line()` of its own."""
        m = _COUNT.search(text[:40])
        if m and int(m.group(2)) > 0:
            self.update(int(m.group(1)), int(m.group(2)), text[m.end():].lstrip("] :") or text)
        elif keep_uncounted:
            self.line(text)
        else:
            self.update(self.done, None, text)

    def line(self, text: str) -> None:
        """A message that stays (a failure, a warning): printed on its own line, on a terminal or not."""
        if self._live is not None:
            self._live.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """Leave the last display on the terminal and move on."""
        if self._live is not None:
            self._draw(self.clock())
            if self._ticker is not None:
                self._ticker[1].set()
                self._ticker[0].join()
                self._ticker = None
            self._live.stop()
            self._live = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- drawing -----------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.clock() - self.started

    def left(self) -> float | None:
        """Seconds left at the pace of this run's items (phases left out)."""
        now = self.clock()
        paced = now - self.started - self._excluded - (now - self._phase_at if self._phase_at is not None else 0.0)
        return time_left(self.done, self.total, paced, self._base or 0)

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Live, SpinnerColumn, TextColumn
        console = Console(file=self.stream, force_terminal=True, width=self._width, highlight=False)
        self._live = Live(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=30),
                          MofNCompleteColumn(), _clock_column(self), TextColumn("{task.fields[status]}"),
                          console=console, auto_refresh=False, transient=False, get_time=self.clock)
        self._tasks["items"] = self._live.add_task(self.label, total=self.total or None, status="", main=True,
                                                   visible=False)
        self._live.start()
        import threading
        stop = threading.Event()

        def tick() -> None:  # redraws only while nothing in this process is timed (see the module docstring)
            while not stop.wait(TICK_S):
                if self._tick_always or self._ticking:
                    live = self._live
                    if live is not None:
                        live.refresh()
        self._ticker = (threading.Thread(target=tick, name="dlsim-progress", daemon=True), stop)
        self._ticker[0].start()

    def _draw(self, now: float) -> None:
        self._drawn_at = now
        if not self.enabled:
            return
        if self._live is None:
            self._start()
        live = self._live
        live.update(self._tasks["items"], total=self.total or None, completed=self.done, status=self.status,
                    description=self.label, visible=self.total > 0 or self.done > 0)
        if self._phase_at is not None:
            name, done, total = self._phase
            counted = total is not None and total > 0
            if "phase" not in self._tasks:
                self._tasks["phase"] = live.add_task(name, total=None, status="", main=False)
            live.update(self._tasks["phase"], description=name, total=total if counted else None,
                        completed=done or 0, visible=True)
        live.refresh()


def _clock_column(progress: Progress) -> Any:
    """The display's time column: on the items' line the run's elapsed time and the time left, on a phase's
    line the phase's own elapsed time; recomputed at every refresh, so it ticks."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Clock(ProgressColumn):
        def render(self, task: Any) -> Text:
            if not task.fields.get("main"):
                since = progress._phase_at
                return Text(format_clock(progress.clock() - since) if since is not None else "")
            left = progress.left()
            return Text(f"{format_clock(progress.elapsed())} elapsed  "
                        f"{'~' + format_clock(left) + ' left' if left is not None else '--:-- left'}")
    return Clock()
