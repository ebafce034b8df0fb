"""Near-ties of a timeline: the places where the last bits of two event times may decide what happens.

The engine's timeline is a continuous function of its task durations except where the order of two
events that no causal chain orders decides something: which of two requests for a contended port
(`dlsim.sim.events.Port`) is granted first, whether memory freed and memory allocated on a device at
one instant make a new peak, which of two predecessors ending together the critical path steps to
(`dlsim.sim.analysis.critical_path`). Two chains of tasks that are equal in exact arithmetic (a
stage's forward and its transfer against its neighbour's backward and its transfer) end at times
that differ in the last bits, and which way they differ depends on the bits of the absolute time:
GPT-3 175B on tp 8, pp 8, v 3, dp 16 with Megatron-LM 2022's stack (asynchronous tensor-parallel
backward, scatter-gather pipeline transfers) requests stage 4's NVLink port for the fused forward of
chunk 12 and for the all-gather of chunk 11's next input at the same instant in every period of its
interleaved schedule; in 2 of 48 periods of a 384-micro-batch run the transfer that triggers the
all-gather ends one ulp (3.6e-15 s) before the one that triggers the forward, the all-gather takes the
port first and the forward waits 0.27 ms for it (the all-gather waits 24 ms in the other periods), and
the device's communication in that period differs by up to 3.7e-4 s. The steady-state extension
(`dlsim.sim.steady`) repeats a period of a reduced run; where such a tie lies in or after it, the full
run may break it the other way in any of the periods it repeats, so the extension is exact only where
none does.

`execute_tracked` runs a graph as `dlsim.sim.engine.execute` does (the same events, the same
timeline) on `dlsim.sim.events.run_tracked`, which gives every event an origin: the event that a
positive delay scheduled, from which a cascade of events at one instant descends (a task's end, the
stream that resumes, its port requests and its start). Two times of one origin are one float in any
run; two of different origins within TOLERANCE of the time of each other (at least 1 s's: far above
the rounding of any run, far below anything a schedule sets apart) are a near-tie. The run records
them as they happen: two requests of one contended port (`port_races`); two waits for one task's end
or collective's start (`wait_races`: the waiters resume in the order they began to wait, which
matters where they run on one device, share a port, or one takes no time). After it: a device
whose memory could pass its peak if its changes of different origins within the tolerance of one
another ran in another order (`memory_races`: the total before them plus, per origin, the largest
running sum of its changes, made in order); a step of the critical path to a predecessor that ended
within the tolerance of another candidate's end of another origin (`critical_path_ties`; of ends of
one origin the smaller id is chosen in any run).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from dlsim.plan.taskgraph import TaskGraph
from dlsim.sim.analysis import path_candidates
from dlsim.sim.engine import Timeline, _Run, execute
from dlsim.sim.events import Port, run_tracked

TOLERANCE = 1e-9  # a near-tie: two times within this fraction of the time (at least 1 s's)
ABORT_PORT_RACES = 8  # a tracked run stops at this many near-ties of port requests (`TooManyTies`)


class TooManyTies(Exception):
    """A tracked run stopped at its ABORT_PORT_RACES-th near-tie of a port's requests."""


def near(earlier: float, later: float) -> bool:
    """Whether two times are a near-tie (within TOLERANCE of the later one, at least 1 s's)."""
    return later - earlier <= TOLERANCE * max(1.0, later)


class _TrackedPort(Port):
    """A `Port` that records the near-ties of its requests (`port_races`) and stops the run at the
    ABORT_PORT_RACES-th of all its ports': a pipeline whose steady part breaks such a tie every
    period (GPT-3 175B's above) gives up early, at a small part of its reduced run's cost."""

    __slots__ = ("races", "pid", "at", "origin")

    def __init__(self, env, races: list[tuple[int, float]], pid: int) -> None:
        super().__init__(env)
        self.races, self.pid = races, pid  # (the run's list: no reference back to the run, no cycle)
        self.at, self.origin = float("-inf"), -1  # the last request's time and origin

    def request(self):
        env = self.env
        now = env._now
        if near(self.at, now) and env.origin != self.origin:
            races = self.races
            races.append((self.pid, now))
            if len(races) >= ABORT_PORT_RACES:
                raise TooManyTies(f"{len(races)} near-ties of port requests by {now:.6g} s")
        self.at, self.origin = now, env.origin
        return _request(self)


_request = Port.request


class _TrackedRun(_Run):
    """The engine's run recording near-ties (the same events in the same order:
    `dlsim.sim.events.run_tracked`)."""

    def __init__(self, graph: TaskGraph):
        self.port_ties: list[tuple[int, float]] = []
        self.wait_ties: list[tuple[int, float, int, int]] = []
        super().__init__(graph)
        self.waited = {}
        self.env.origin = -1
        self.end_origin = [-1] * len(graph.tasks)
        self.memory_log = [[] for _ in graph.devices]

    def _contended_ports(self):
        ports = super()._contended_ports()
        for pid, port in ports.items():
            port.pid = pid
        return ports

    def port_type(self, env) -> _TrackedPort:  # type: ignore[override]
        return _TrackedPort(env, self.port_ties, -1)

    def loop(self, env) -> int:  # type: ignore[override]
        return run_tracked(env)

    def _join(self, gid: int, member: int = -1):
        self._waiting(-1 - gid, member)
        return (yield from super()._join(gid, member))

    def _waiting(self, key: int, waiter: int) -> None:
        """A wait for task `key` (or collective −1 − `key`) begun: a near-tie with an earlier one of
        another origin is recorded (the engine records a task's first wait itself)."""
        now, origin = self.env._now, self.env.origin
        before = self.waited.get(key)
        if before is None:
            self.waited[key] = [(now, origin, waiter)]
            return
        for t, o, w in reversed(before):
            if not near(t, now):
                break
            if o != origin:
                self.wait_ties.append((key, now, w, waiter))
        before.append((now, origin, waiter))


@dataclass
class Ties:
    """What `execute_tracked` recorded: the near-ties of port requests (port, time) and of waits
    (task id | −1 − group id, time, one waiting task, the other), per device its memory changes
    (time, origin, (kind, bytes) pairs) in the order they were made and its peak, and the origin of
    each task's end."""

    ports: list[tuple[int, float]]
    waits: list[tuple[int, float, int, int]]
    memory: list[list[tuple[float, int, tuple[tuple[str, float], ...]]]]
    peak: list[float]
    end_origin: list[int]


def execute_tracked(graph: TaskGraph) -> tuple[Timeline, Ties]:
    """`execute(graph)` and what it recorded of its near-ties; TooManyTies where it stopped."""
    run = _TrackedRun(graph)
    tl = execute(graph, run)
    return tl, Ties(run.port_ties, run.wait_ties, run.memory_log, list(tl.memory_peak), run.end_origin)


def port_races(ties: Ties, since: float) -> list[tuple[int, float]]:
    """(port, time) of each request made within the tolerance after another request of the same port
    of another origin, at or after `since`."""
    return [(p, t) for p, t in ties.ports if t >= since]


def wait_races(graph: TaskGraph, ties: Ties, since: float) -> list[tuple[int, float]]:
    """(task id | −1 − group id, time) of each wait for a task's end or a collective's start begun
    within the tolerance of another wait for the same one of another origin, at or after `since`,
    where the order the two waiting tasks resume in could matter: they run on one device, share a
    port, or one of them takes no time (the next task of its stream then starts at that instant)."""
    tasks = graph.tasks

    def apart(a: int, b: int) -> bool:
        ta, tb = tasks[a], tasks[b]
        return (ta.device != tb.device and ta.duration > 0 and tb.duration > 0
                and not set(ta.ports) & set(tb.ports))

    return [(key, t) for key, t, a, b in ties.waits if t >= since and (a < 0 or b < 0 or not apart(a, b))]


def memory_races(ties: Ties, since: float) -> list[tuple[int, float]]:
    """(device, time) of each group of memory changes of different origins within the tolerance of
    one another, at or after `since`, that could pass the device's peak run in another order."""
    out = []
    for dev, log in enumerate(ties.memory):
        if len(log) < 2:
            continue
        times = np.array([t for t, _, _ in log])
        # where a change is a near-tie of the one before it (most are not: skip them at C speed)
        t0, t1 = times[:-1], times[1:]
        tied = (np.flatnonzero((t1 - t0 <= TOLERANCE * np.maximum(1.0, t1)) & (t1 >= since)) + 1).tolist()
        if not tied:
            continue
        totals = list(accumulate(sum(b for _, b in deltas) for _, _, deltas in log))  # after each change
        peak = ties.peak[dev]
        limit = peak + 1e-9 * max(1.0, peak)  # what the engine counts as a new peak (`_Run._memory`)
        n, k = len(log), 0
        while k < len(tied):
            i = tied[k] - 1  # the group: the change before the first tie and every one tied on
            j = tied[k] + 1
            k += 1
            while k < len(tied) and tied[k] == j:
                j += 1
                k += 1
            group = log[i:j]
            if len({e for _, e, _ in group}) > 1:
                rise: dict[int, float] = {}
                run: dict[int, float] = {}
                for _, e, deltas in group:
                    for _, b in deltas:
                        run[e] = run.get(e, 0.0) + b
                        rise[e] = max(rise.get(e, 0.0), run[e])
                if (totals[i - 1] if i else 0.0) + sum(rise.values()) > limit:
                    out.append((dev, log[i][0]))
    return out


def critical_path_ties(graph: TaskGraph, tl: Timeline, ties: Ties, path: list[int], first: int) -> list[int]:
    """Positions n > `first` of `path` whose step to path[n − 1] had another candidate predecessor
    (`dlsim.sim.analysis.path_candidates`) ending within the tolerance of it, at an end of another
    origin (two ends of one origin are one instant in any run, and the smaller id is chosen)."""
    end, origin = tl.end, ties.end_origin
    prev_on_stream = [-1] * len(graph.tasks)
    for order in graph.orders:
        for a, b in zip(order, order[1:]):
            prev_on_stream[b] = a
    out = []
    for n in range(max(1, first + 1), len(path)):
        chosen = path[n - 1]
        e = end[chosen]
        o = origin[chosen]
        if any(c != chosen and near(min(e, end[c]), max(e, end[c])) and origin[c] != o
               for c in path_candidates(graph, prev_on_stream, path[n])):
            out.append(n)
    return out
