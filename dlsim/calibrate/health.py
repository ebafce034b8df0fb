"""Is a calibration's timing to be trusted? Two checks, each a warning the command prints and records.

Quantised timings: on a busy or badly configured machine a timer can step in coarse ticks (a
calibration on a loaded host recorded every kernel as a multiple of 4 ms, and the roofline fit to
it was 99.5% off). Flagged when at least `share` of the timings are whole multiples of one tick of
100 µs or more and they take few distinct values: a real kernel table spreads over many values
with nanosecond resolution.

A busy machine: CPU time used by other processes while the calibration ran (whole machine from
``/proc/stat`` minus this process and its children, ``os.times``), in cores on average, and the
1-minute load average beside the CPUs. Readers are injectable for tests.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

MIN_TICK_S = 100e-6         # a coarser step than any real kernel timer has
BUSY_CORES = 0.5            # other processes' mean CPU use that makes a machine "busy"


def quantisation_warning(times: Sequence[float], *, min_count: int = 10, share: float = 0.5) -> str | None:
    """A warning when the timings sit on a coarse clock grid (see the module docstring), else None."""
    ts = [t for t in times if isinstance(t, (int, float)) and math.isfinite(t) and t > 0]
    if len(ts) < min_count:
        return None
    distinct = sorted(set(round(t, 9) for t in ts))
    if len(distinct) > max(3, len(ts) // 3):
        return None
    steps = [b - a for a, b in zip(distinct, distinct[1:]) if b - a > 0] + [distinct[0]]
    tick = min(steps)
    if tick < MIN_TICK_S:
        return None
    on_grid = sum(1 for t in ts if abs(t / tick - round(t / tick)) < 0.01)
    if on_grid < share * len(ts):
        return None
    return (f"{on_grid} of {len(ts)} timings are whole multiples of {tick * 1e3:.3g} ms ({len(distinct)} distinct "
            "values): the clock or the machine is quantising them; fits to these tables will be wrong "
            "(rerun on an idle machine, or check the timer)")


def _proc_stat_busy() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (Linux /proc/stat), None elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    busy = sum(ticks[:8]) - idle                             # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    """CPU seconds of this process and the children it reaped (the calibration's probe processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


@dataclass
class LoadWatch:
    """Measures what other processes did to the machine between `start()` and `warning()`."""

    machine_busy: Callable[[], float | None] = _proc_stat_busy
    own_cpu: Callable[[], float] = _own_cpu
    loadavg: Callable[[], float | None] = _loadavg
    clock: Callable[[], float] = time.monotonic
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    threads: int = 1           # threads the calibration itself keeps busy
    _start: tuple | None = None

    def start(self) -> "LoadWatch":
        self._start = (self.clock(), self.machine_busy(), self.own_cpu())
        return self

    def others_cores(self) -> float | None:
        """Mean CPU cores other processes used since `start()` (None where unknown)."""
        if self._start is None:
            return None
        t0, busy0, own0 = self._start
        wall, busy1 = self.clock() - t0, self.machine_busy()
        if busy0 is None or busy1 is None or wall <= 0:
            return None
        return max(0.0, (busy1 - busy0) - (self.own_cpu() - own0)) / wall

    def warning(self, threshold_cores: float = BUSY_CORES) -> str | None:
        """A warning when other processes used more than `threshold_cores` on average, or the load
        average exceeds the CPUs left to them, else None."""
        cores, load = self.others_cores(), self.loadavg()
        busy = cores is not None and cores > threshold_cores
        crowded = load is not None and load - self.threads > max(threshold_cores, self.cpus - self.threads)
        if not (busy or crowded):
            return None
        parts = []
        if cores is not None:
            parts.append(f"other processes used {cores:.1f} CPU cores on average")
        if load is not None:
            parts.append(f"load average {load:.1f} on {self.cpus} CPUs")
        return ("the machine was busy during calibration (" + ", ".join(parts) + "): timings are slower and "
                "noisier than on an idle machine; rerun when it is idle (a rerun into the same directory "
                "keeps the rows; delete them to re-measure)")
