"""The measurement loop shared by the MPI and gloo workers: ping-pong, PRTT, collectives, reductions.

Methods (`reference/algorithms.md` §2.2):

* ping-pong between ranks 0 and 1: one-way time = median over repetitions of RTT/2;
* PRTT(n, d, s) (Hoefler, Lichei, Rehm 2007; Netgauge `ptrn_loggp.c`): rank 0 sends n messages of
  s bytes, waiting d between sends, rank 1 answers once it has all n; PRTT(1,0,s), PRTT(n,0,s)
  and PRTT(n,d,s) with d = PRTT(1,0,s) are measured for every s;
* a collective: all ranks meet in a barrier, run the operation once, and the repetition's time
  is max(end) − max(start) over ranks when all ranks share one clock (one machine, emulated
  hosts included), else max over ranks of (end − start); the median over repetitions is kept.
  With `CommPlan.idle_gap_s` > 0 every rank first sleeps (or spins, `CommPlan.idle_wait`) that
  long (links idle, a token bucket refills), then the barrier; the gap is recorded in the table's ``idle_gap_s`` column (a table
  measured back to back keeps the original columns, `collective_columns`) and in every line of
  `REPS_FILE`; one table holds one gap per backend and host set (`check_idle_gap`);
* the reduction speed γ: `numpy.add(a, b, out=a)` on float32 vectors, as an MPI_SUM combines a
  received buffer into a local one.

Repetitions adapt to the cost of one warm-up call: as many as fit in `budget_s`, between
`min_reps` and `max_reps`. Every finished point is appended to a CSV table at once (rank 0), so an
interrupted run resumes where it stopped; points already in the table are skipped.
"""

from __future__ import annotations

import math
import socket
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from dlsim.calibrate.comm_plan import CommPlan
from dlsim.calibrate.compute_store import TableFile
from dlsim.errors import SpecError

P2P_COLUMNS = ("backend", "hosts", "kind", "ranks", "size_bytes", "messages", "delay_s", "reps", "median_s",
               "min_s", "max_s")
COLLECTIVE_COLUMNS = ("backend", "hosts", "collective", "algorithm", "setting", "ranks", "size_bytes", "reps",
                      "median_s", "min_s", "max_s", "busbw_bytes_per_s", "variant", "source")
GAP_COLUMN = "idle_gap_s"
COLLECTIVE_COLUMNS_GAP = COLLECTIVE_COLUMNS + (GAP_COLUMN,)
"""Columns of a collective table measured with an idle gap before each repetition."""
P2P_TABLE = "comm_p2p.csv"
COLLECTIVE_TABLE = "comm_collectives.csv"
REPS_FILE = "comm_collectives_reps.jsonl"
"""Every repetition of every collective point, one JSON line per point (quartiles, re-analysis)."""


def p2p_key(r: dict) -> tuple:
    return (r["backend"], r["hosts"], r["kind"], int(r["ranks"]), int(float(r["size_bytes"])), int(r["messages"]))


def collective_key(r: dict) -> tuple:
    return (r["backend"], r["hosts"], r["collective"], r["algorithm"], int(r["ranks"]), int(float(r["size_bytes"])),
            r.get("variant", ""))


def _header(path: Path) -> tuple[str, ...]:
    if not path.exists() or path.stat().st_size == 0:
        return ()
    with open(path) as handle:
        return tuple(h.strip() for h in handle.readline().strip().split(","))


def collective_columns(path: Path, idle_gap_s: float) -> tuple[str, ...]:
    """The columns to append to the collective table at `path`: its own header when it has one,
    else the original columns for back-to-back repetitions and `COLLECTIVE_COLUMNS_GAP` with a gap."""
    header = _header(path)
    if header == COLLECTIVE_COLUMNS and idle_gap_s > 0:
        raise SpecError(f"measured back to back (no {GAP_COLUMN} column); measure an idle gap into a new "
                        "profile directory", path=path)
    if header in (COLLECTIVE_COLUMNS, COLLECTIVE_COLUMNS_GAP):
        return header
    if header:
        raise SpecError(f"header {','.join(header)} is not a collective table's", path=path)
    return COLLECTIVE_COLUMNS_GAP if idle_gap_s > 0 else COLLECTIVE_COLUMNS


def row_idle_gap(row: dict) -> float:
    """The idle gap a collective row (or `REPS_FILE` line) was measured with; 0 where not recorded."""
    value = row.get(GAP_COLUMN)
    return float(value) if value not in (None, "") else 0.0


def check_idle_gap(out_dir: str | Path, backend: str, hosts: str, idle_gap_s: float) -> None:
    """Refuse to add points measured with `idle_gap_s` to a table whose rows for the same backend and
    host set were measured with another gap (a resumed run would mix two protocols)."""
    import csv
    path = Path(out_dir) / COLLECTIVE_TABLE
    collective_columns(path, idle_gap_s)
    if not path.exists():
        return
    with open(path) as handle:
        gaps = {row_idle_gap(r) for r in csv.DictReader(handle) if r["backend"] == backend and r["hosts"] == hosts}
    other = sorted(g for g in gaps if not math.isclose(g, idle_gap_s, rel_tol=1e-9, abs_tol=1e-12))
    if other:
        raise SpecError(f"rows for {backend} on {hosts} were measured with an idle gap of {other[0]!r} s, not "
                        f"{idle_gap_s!r} s; use a new profile directory", path=path)


class Transport(Protocol):
    """What the loop needs from MPI or torch.distributed."""

    rank: int
    size: int

    def barrier(self) -> None: ...
    def quiet_barrier(self) -> None: ...
    def bcast(self, obj: object) -> object: ...
    def gather(self, value: float) -> list[float] | None: ...
    def buffer(self, nbytes: int) -> object: ...
    def send(self, buf: object, dst: int) -> None: ...
    def send_int(self, value: int, dst: int) -> None: ...
    def recv_int(self, src: int) -> int: ...
    def recv(self, buf: object, src: int) -> None: ...
    def isend(self, buf: object, dst: int) -> object: ...
    def irecv(self, buf: object, src: int) -> object: ...
    def waitall(self, requests: list) -> None: ...
    def collective(self, name: str, nbytes: int) -> Callable[[], None]: ...


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def _busy_wait(seconds: float) -> None:
    end = now() + seconds
    while now() < end:
        pass


def _stats(values: list[float]) -> dict[str, str]:
    return {"reps": str(len(values)), "median_s": repr(statistics.median(values)), "min_s": repr(min(values)),
            "max_s": repr(max(values))}


class Measurer:
    """Runs a `CommPlan` on a transport; rank 0 writes the tables and prints progress."""

    def __init__(self, t: Transport, plan: CommPlan, backend_label: str, quiet: bool = False,
                 sleep: Callable[[float], None] = time.sleep):
        self.t, self.plan, self.backend, self.quiet, self.sleep = t, plan, backend_label, quiet, sleep
        names = t.bcast(socket.gethostname()) if t.rank == 0 else t.bcast(None)
        same = t.gather(1.0 if socket.gethostname() == names else 0.0)
        self.global_clock = bool(t.bcast(all(x == 1.0 for x in same) if t.rank == 0 else None))
        out = Path(plan.out_dir)
        self.p2p = TableFile(out / P2P_TABLE, P2P_COLUMNS, p2p_key) if t.rank == 0 else None
        self.coll = TableFile(out / COLLECTIVE_TABLE, collective_columns(out / COLLECTIVE_TABLE, plan.idle_gap_s),
                              collective_key) if t.rank == 0 else None
        self.done = 0
        self.started = now()
        self.bar: Any = None  # dlsim.progress.Progress on rank 0, drawn only on a terminal
        self.prtt1: dict[int, float] = self._earlier_prtt1(out / P2P_TABLE) if t.rank == 0 else {}

    def _earlier_prtt1(self, path: Path) -> dict[int, float]:
        """PRTT(1,0,s) of an interrupted run: the delay d of PRTT(n,d,s) still to measure."""
        import csv
        if not path.exists():
            return {}
        with open(path) as handle:
            return {int(r["size_bytes"]): float(r["median_s"]) for r in csv.DictReader(handle)
                    if r["kind"] == "prtt1" and r["backend"] == self.backend and r["hosts"] == self.plan.hosts
                    and r.get("median_s")}

    # ------------------------------------------------------------------------------------------
    def run(self) -> None:
        plan = self.plan
        tasks: list[tuple] = []
        if plan.point_to_point and self.t.size >= 2:
            tasks += [("pingpong", s, 1) for s in plan.pingpong_sizes]
            tasks += [(kind, s, 1 if kind == "prtt1" else plan.prtt_messages) for s in plan.prtt_sizes
                      for kind in ("prtt1", "prttn", "prttd")]
        if plan.point_to_point:
            tasks += [("reduce", s, 1) for s in plan.reduce_sizes]
        tasks += [("collective", c, s) for c in plan.collectives for s in plan.collective_sizes]
        todo = self.t.bcast([task for task in tasks if not self._has(task)] if self.t.rank == 0 else None)
        self.total = len(todo)
        for task in todo:
            self._run_task(task)
        if self.bar is not None:
            self.bar.close()

    def _row(self, kind: str, size: int, messages: int, delay: float, values: list[float]) -> dict[str, str]:
        return {"backend": self.backend, "hosts": self.plan.hosts, "kind": kind, "ranks": str(self.t.size),
                "size_bytes": str(size), "messages": str(messages), "delay_s": repr(delay), **_stats(values)}

    def _has(self, task: tuple) -> bool:
        if task[0] == "collective":
            return self.coll.has({"backend": self.backend, "hosts": self.plan.hosts, "collective": task[1],
                                  "algorithm": self.plan.algorithm, "ranks": str(self.t.size),
                                  "size_bytes": str(self._collective_bytes(task[1], task[2])), "variant": ""})
        return self.p2p.has(self._row(task[0], task[1], task[2], 0.0, [0.0]))

    def _progress(self, label: str, values: list[float]) -> None:
        self.done += 1
        if self.t.rank == 0 and not self.quiet:
            if self.bar is None:
                from dlsim.progress import Progress
                self.bar = Progress(self.total)
            self.bar.update(self.done, self.total, f"{self.backend} {label}: median "
                            f"{statistics.median(values) * 1e6:.1f} us over {len(values)}")

    def _reps(self, one: float) -> int:
        p = self.plan
        reps = p.max_reps if one <= 0 else int(min(p.max_reps, max(p.min_reps, math.ceil(p.budget_s / one))))
        return int(self.t.bcast(reps if self.t.rank == 0 else None))

    # tasks ------------------------------------------------------------------------------------
    def _run_task(self, task: tuple) -> None:
        kind = task[0]
        if kind == "collective":
            self._collective(task[1], task[2])
        elif kind == "reduce":
            self._reduce(task[1])
        elif kind == "pingpong":
            self._pingpong(task[1])
        else:
            self._prtt(kind, task[1], task[2])

    def _collective_bytes(self, name: str, size: int) -> int:
        unit = 4 * self.t.size if name in ("reduce-scatter", "allgather", "all-to-all") else 4
        return max(unit, (size // unit) * unit)

    def _timed_collective(self, op: Callable[[], None]) -> float:
        t = self.t
        if self.plan.idle_gap_s > 0:
            (_busy_wait if self.plan.idle_wait == "spin" else self.sleep)(self.plan.idle_gap_s)
            if self.plan.idle_wait == "sleep-barrier":
                t.barrier()
        t.barrier()
        start = now()
        op()
        end = now()
        starts, ends = t.gather(start), t.gather(end)
        if t.rank != 0:
            return 0.0
        if self.global_clock:
            return max(ends) - max(starts)
        return max(e - s for s, e in zip(starts, ends))

    def _collective(self, name: str, size: int) -> None:
        nbytes = self._collective_bytes(name, size)
        op = self.t.collective(name, nbytes)
        first = 0.0
        for _ in range(max(1, self.plan.warmup)):
            first = self._timed_collective(op)
        values = [self._timed_collective(op) for _ in range(self._reps(first))]
        if self.t.rank == 0:
            median = statistics.median(values)
            factor = {"allreduce": 2.0 * (self.t.size - 1) / self.t.size}.get(
                name, (self.t.size - 1) / self.t.size if name in ("reduce-scatter", "allgather", "all-to-all") else 1.0)
            self.coll.append({"backend": self.backend, "hosts": self.plan.hosts, "collective": name,
                              "algorithm": self.plan.algorithm, "setting": self.plan.setting,
                              "ranks": str(self.t.size), "size_bytes": str(nbytes), **_stats(values),
                              "busbw_bytes_per_s": repr(nbytes / median * factor if median > 0 else 0.0),
                              "variant": "", "source": "measured", GAP_COLUMN: repr(self.plan.idle_gap_s)})
            self._append_reps(name, nbytes, values)
        self._progress(f"{name} {self.plan.algorithm} {nbytes} B", values or [0.0])

    def _append_reps(self, name: str, nbytes: int, values: list[float]) -> None:
        """One line per point in `REPS_FILE` (the CSV keeps median, min and max only)."""
        import json
        line = json.dumps({"backend": self.backend, "hosts": self.plan.hosts, "collective": name,
                           "algorithm": self.plan.algorithm, "ranks": self.t.size, "size_bytes": nbytes,
                           GAP_COLUMN: self.plan.idle_gap_s, "idle_wait": self.plan.idle_wait, "values_s": values})
        with open(Path(self.plan.out_dir) / REPS_FILE, "a") as handle:
            handle.write(line + "\n")

    def _reduce(self, size: int) -> None:
        values = [0.0]
        if self.t.rank == 0:
            import numpy as np
            a = np.ones(max(1, size // 4), dtype=np.float32)
            b = np.ones_like(a)
            np.add(a, b, out=a)
            start = now()
            np.add(a, b, out=a)
            one = now() - start
            reps = int(min(self.plan.max_reps * 5, max(self.plan.min_reps, math.ceil(self.plan.budget_s / max(one, 1e-7)))))
            values = []
            for _ in range(reps):
                start = now()
                np.add(a, b, out=a)
                values.append(now() - start)
            self.p2p.append(self._row("reduce", a.nbytes, 1, 0.0, values))
        self._progress(f"reduce-compute {size} B", values)

    def _pair_reps(self, first: float) -> int:
        """Repetitions for a rank-0/rank-1 measurement, agreed between the two only."""
        t, p = self.t, self.plan
        if t.rank == 0:
            reps = p.max_reps if first <= 0 else int(min(p.max_reps, max(p.min_reps, math.ceil(p.budget_s / first))))
            t.send_int(reps, 1)
            return reps
        return t.recv_int(0)

    def _pair(self, once: Callable[[], float]) -> list[float]:
        """Run `once` on ranks 0 and 1 while the other ranks sleep (they must not spin on shared cores)."""
        t = self.t
        t.quiet_barrier()
        values = [0.0]
        if t.rank < 2:
            first = once()
            values = [once() for _ in range(self._pair_reps(first))]
        t.quiet_barrier()
        return values

    def _pingpong(self, size: int) -> None:
        buf = self.t.buffer(size)
        values = self._pair(lambda: self._pingpong_once(buf))
        if self.t.rank == 0:
            self.p2p.append(self._row("pingpong", size, 1, 0.0, values))
        self._progress(f"ping-pong {size} B", values)

    def _pingpong_once(self, buf: object) -> float:
        t = self.t
        if t.rank == 0:
            start = now()
            t.send(buf, 1)
            t.recv(buf, 1)
            return (now() - start) / 2
        if t.rank == 1:
            t.recv(buf, 0)
            t.send(buf, 0)
        return 0.0

    def _prtt(self, kind: str, size: int, count: int) -> None:
        t = self.t
        delay = self.prtt1.get(size, 0.0) if kind == "prttd" else 0.0
        delay = float(t.bcast(delay if t.rank == 0 else None))
        bufs = [t.buffer(size) for _ in range(count)]
        values = self._pair(lambda: self._prtt_once(bufs, delay))
        if t.rank == 0:
            if kind == "prtt1":
                self.prtt1[size] = statistics.median(values)
            self.p2p.append(self._row(kind, size, count, delay, values))
        self._progress(f"{kind} {size} B x{count}", values)

    def _prtt_once(self, bufs: list, delay: float) -> float:
        t = self.t
        if t.rank == 0:
            start = now()
            requests = []
            for i, b in enumerate(bufs):
                requests.append(t.isend(b, 1))
                if delay and i < len(bufs) - 1:
                    _busy_wait(delay)
            t.waitall(requests)
            t.recv(bufs[0], 1)
            return now() - start
        if t.rank == 1:
            t.waitall([t.irecv(b, 0) for b in bufs])
            t.send(bufs[0], 0)
        return 0.0
