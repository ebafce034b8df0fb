"""The discrete-event engine: executes a prepared `TaskGraph` with SimPy (the only simpy import).

Streams are SimPy processes that run their tasks in issue order; a task waits for its
dependencies, then for the link ports it needs (ports of capacity 1, requested in one global order
so that no two transfers can deadlock; `dlsim.sim.events.Port` behaves as a `simpy.Resource` of
capacity 1, event for event; a port only one task stream or one transfer ever uses needs none), then
runs for its
duration. Collective groups
start when all members are ready and run either their priced duration or their point-to-point
messages. Memory is tracked per device and kind as tasks start and end; the holders of ports are
logged as they end and their intervals derived after the run (`dlsim.sim.occupancy`). Ties break in SimPy's
(time, priority, insertion) order, and the graph is built deterministically, so the same graph
gives the same timeline, bit for bit.

Overlap slowdown (σ = `TaskGraph.overlap_slowdown` > 0): compute kernels beside a device's collectives
progress at rate 1/(1 + σ), re-timed as communication starts and ends (`dlsim.sim.slowdown`).

Shared networks: a transfer or expanded-collective message with links (`Task.links`,
`Message.links`; `dlsim.cost.fabric`) moves its bytes as a flow that shares those links max-min
fairly with the other flows in flight (`dlsim.sim.flows`); its port holds and its end move by as
much as its bytes were slowed. A graph without links runs none of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy

from simpy.events import URGENT

from dlsim.sim.events import Driver, Fired, Port, run_to_end, succeed, timeout, urgent

from dlsim.plan.taskgraph import COMM, MEMORY_KINDS, TaskGraph
from dlsim.sim.flows import Network
from dlsim.sim.occupancy import PortLog
from dlsim.sim.slowdown import OverlapSlowdown, Slowed


@dataclass
class Timeline:
    """What happened: start and end time of every task, busy intervals of every port, memory peaks.

    `port_busy[p]` lists the (start, end, task) intervals port p was held, in the order their
    holders ended, computed from `port_log` when first asked for (`dlsim.sim.occupancy`).

    `memory_peak[d]` is the largest dynamic (activations, gathered parameters, workspace, buffers)
    total of device d, `memory_peak_time[d]` when it was first reached and `memory_at_peak[d]` its
    split by kind; `events` counts the SimPy events processed (`dlsim.sim.events`). `stretched[tid]`
    holds the actual end time of each segment (`Task.segments()`) of a task slowed by overlapping
    communication; a task not in it ran its segments back to back at their nominal durations.
    """

    start: list[float]
    end: list[float]
    makespan: float
    port_log: PortLog
    memory_peak: list[float]
    memory_peak_time: list[float]
    memory_at_peak: list[dict[str, float]]
    message_times: dict[int, list[tuple[int, float, float]]] = field(default_factory=dict)
    events: int = 0
    stretched: dict[int, tuple[float, ...]] = field(default_factory=dict)
    _busy: list[list[tuple[float, float, int]]] | None = field(default=None, repr=False, compare=False)

    @property
    def port_busy(self) -> list[list[tuple[float, float, int]]]:
        if self._busy is None:
            self._busy = self.port_log.busy(self.start, self.end, self.stretched)
        return self._busy


class _Priced:
    """A priced collective run as `_Run._execute` runs it in a process of its own, event for event (the
    process's start event at URGENT priority, its port requests, its timeout, its releases and the
    end event that resumes the waiting stream, scheduled at the same points), as callbacks instead
    of a generator: the stream waits on `done`.

    As `dlsim.sim.events.Port` does for a request granted at once, its start and its end event are
    not pushed where the loop would process them next (the stream that made it, or the timeout that
    ends it, does nothing after; `env.last_callback`; nothing else queued at this instant before
    them): they run at once, their ids drawn and counted (`_Run.elided`)."""

    __slots__ = ("run", "tid", "t", "i", "held", "devices", "done")

    def __init__(self, run: _Run, tid: int, t):
        self.run, self.tid, self.t, self.i, self.held = run, tid, t, 0, []
        self.done = Fired()
        env = run.env
        queue = env._queue
        if env.last_callback and (not queue or queue[0][0] > env._now or queue[0][1] != URGENT):
            next(env._eid)  # its start, the next event processed: now
            run.elided += 1
            self._acquire(None)
        else:
            urgent(env, self._acquire)

    def _acquire(self, _event: Fired) -> None:
        run, ports = self.run, self.run.acquire[self.tid]
        while self.i < len(ports):
            res = run.resources[ports[self.i]]
            req = res.request()
            self.held.append((res, req))
            self.i += 1
            if req.callbacks is not None:  # (else granted and processed at once: `Port.request`)
                req.callbacks.append(self._acquire)
                return
        self.devices = run._begin(self.tid, self.t)
        if self.t.duration > 0:
            timeout(run.env, self.t.duration).callbacks.append(self._end)
        else:
            self._end(None)

    def _end(self, event: Fired | None) -> None:
        run = self.run
        run._complete(self.tid, self.t, self.held, self.devices)
        env, done = run.env, self.done
        queue = env._queue
        if event is not None and env.last_callback and (not queue or queue[0][0] > env._now) and \
                len(done.callbacks) == 1:  # its end, the next event processed: its stream resumes now
            next(env._eid)
            run.elided += 1
            callbacks, done.callbacks = done.callbacks, None
            callbacks[0](done)
        else:
            succeed(env, done)


class _Run(OverlapSlowdown):
    port_type = Port  # tests/test_sim_ports.py runs the same graphs with simpy.Resource
    all_ports = False  # tests: a resource for every port, contended or not
    loop = staticmethod(run_to_end)  # the run loop (`dlsim.sim.ties` tracks each event's id)

    def __init__(self, graph: TaskGraph):
        self.g = graph
        self.env = simpy.Environment()
        self.env.last_callback = False  # until the run loop runs (`dlsim.sim.events.Port`)
        n = len(graph.tasks)
        self.start = [0.0] * n
        self.end: list[float | None] = [None] * n
        self.waiters: dict[int, Fired] = {}
        self.elided = 0  # events processed at once, not pushed (`_Priced`)
        # `dlsim.sim.ties` (run with `run_tracked`): per task the origin of its end, per device its memory
        # changes (time, origin, (kind, bytes) pairs), per task waited for its waits (time, origin, task)
        self.end_origin: list[int] | None = None
        self.memory_log: list[list[tuple[float, int, tuple]]] | None = None
        self.waited: dict[int, list[tuple[float, int, int]]] | None = None
        self.events = 0
        self.port_log = PortLog(graph)
        self.port_key = [(port.direction == "in", i) for i, port in enumerate(graph.ports)].__getitem__
        self.resources = self._contended_ports()
        # per task: the ports it must actually acquire (contended ones), in the global order, worked out
        # once per distinct ports tuple (tasks share them)
        ordered = {ports: tuple(sorted((p for p in ports if p in self.resources), key=self.port_key))
                   for ports in {t.ports for t in graph.tasks}}
        self.acquire: list[tuple[int, ...]] = [ordered[t.ports] for t in graph.tasks]
        self.group_acquire = [tuple(sorted((p for p in gr.ports if p in self.resources), key=self.port_key))
                              for gr in graph.groups]
        self.group_left = [len(gr.members) for gr in graph.groups]
        self.group_done: list[Fired | None] = [None] * len(graph.groups)
        self.group_start = [0.0] * len(graph.groups)
        self.message_times: dict[int, list[tuple[int, float, float]]] = {}
        nd = len(graph.devices)
        self.kinds = {k: i for i, k in enumerate(MEMORY_KINDS)}
        self.mem = [[0.0] * len(MEMORY_KINDS) for _ in range(nd)]
        self.mem_total = [0.0] * nd
        self.peak = [0.0] * nd
        self.peak_time = [0.0] * nd
        self.at_peak = [dict.fromkeys(MEMORY_KINDS, 0.0) for _ in range(nd)]
        self.stretched: dict[int, tuple[float, ...]] = {}
        self.net = Network(self.env, [link.capacity for link in graph.links]) if graph.links else None
        self.flow_tasks = {t.tid for t in graph.tasks if t.links} if graph.links else set()
        self.sigma = graph.overlap_slowdown
        if self.sigma > 0:
            self._overlap_setup()
        else:
            self.comm_devices = self.slow_segs = None

    def loop(self, env: simpy.Environment) -> int:
        """Process every event (`run_to_end`; `dlsim.sim.ties` tracks each one's origin)."""
        return run_to_end(env)

    def _contended_ports(self) -> dict[int, Port]:
        """Ports that two or more independent users can want at once (others need no resource)."""
        users: dict[int, set] = {}
        seen: set[tuple[int, tuple[int, ...]]] = set()  # (stream, ports) already counted
        for t in [t for t in self.g.tasks if t.ports and t.group < 0]:
            if t.stream >= 0:
                if (t.stream, t.ports) in seen:
                    continue
                seen.add((t.stream, t.ports))
            key = ("s", t.stream) if t.stream >= 0 else ("t", t.tid)
            for p in t.ports:
                users.setdefault(p, set()).add(key)
        for gid, gr in enumerate(self.g.groups):
            for p in gr.ports:
                users.setdefault(p, set()).add(("g", gid))
            for i, msg in enumerate(gr.messages):
                for p in msg.ports:
                    users.setdefault(p, set()).add(("m", gid, i))
        return {p: self.port_type(self.env) for p in sorted(users) if len(users[p]) > 1 or self.all_ports}

    # -- helpers -----------------------------------------------------------------------------
    def _wait(self, tid: int, waiter: int = -1) -> Fired:
        """The event of task `tid`'s end, which task `waiter` waits for (`dlsim.sim.ties` records who)."""
        ev = self.waiters.get(tid)
        if ev is None:
            ev = self.waiters[tid] = Fired()
            if self.waited is not None:
                self.waited[tid] = [(self.env._now, self.env.origin, waiter)]
        elif self.waited is not None:
            self._waiting(tid, waiter)
        return ev

    def _waiting(self, key: int, waiter: int) -> None:
        """A second or later wait for one task (`dlsim.sim.ties`)."""

    def _finish(self, tid: int) -> None:
        self.end[tid] = self.env._now
        if self.end_origin is not None:
            self.end_origin[tid] = self.env.origin
        ev = self.waiters.pop(tid, None)
        if ev is not None:
            succeed(self.env, ev)

    def _memory(self, device: int, deltas: tuple[tuple[str, float], ...]) -> None:
        if not deltas or device < 0:
            return
        if self.memory_log is not None:
            self.memory_log[device].append((self.env._now, self.env.origin, deltas))
        row = self.mem[device]
        for kind, nbytes in deltas:
            row[self.kinds[kind]] += nbytes
            self.mem_total[device] += nbytes
        if self.mem_total[device] > self.peak[device] + 1e-9 * max(1.0, self.peak[device]):
            self.peak[device] = self.mem_total[device]
            self.peak_time[device] = self.env._now
            self.at_peak[device] = dict(zip(MEMORY_KINDS, row))

    def _acquire(self, ports: tuple[int, ...]):
        """Request contended ports in one global order (all out ports before all in ports, then by
        id: `acquire`, `group_acquire`), so that two transfers can never wait for each other."""
        held = []
        for p in ports:
            res = self.resources[p]
            req = res.request()
            held.append((res, req))
            yield req
        return held

    @staticmethod
    def _release(held) -> None:
        for res, req in held:
            res.release(req)

    # -- processes ---------------------------------------------------------------------------
    def stream(self, order: list[int]):
        """Run a stream's tasks in issue order (`_execute` inlined: the same yields, one generator
        per stream instead of one per task)."""
        tasks, end, start, env = self.g.tasks, self.end, self.start, self.env
        resources, acquire, waiters = self.resources, self.acquire, self.waiters
        slow_segs, comm_devices, flow_tasks = self.slow_segs, self.comm_devices, self.flow_tasks
        end_origin, port_log = self.end_origin, self.port_log.tasks
        in_flight, running = (self.in_flight, self.running) if slow_segs is not None else (None, None)
        for tid in order:
            t = tasks[tid]
            for d in t.deps:
                if end[d] is None:
                    yield self._wait(d, tid)
            if t.group >= 0:
                yield from self._join(t.group, tid)
                start[tid] = self.group_start[t.group]
                self._finish(tid)
                continue
            if t.category == COMM and t.ports and not t.cross_stage and not t.parts and \
                    not (flow_tasks and tid in flow_tasks) and (slow_segs is None or slow_segs[tid] is None):
                # a priced collective takes its ports from a process of its own, as a group's collective
                # does in the full run (`_run_group`), so that a tie with a transfer ready at the same
                # instant is arbitrated the same way in the reduced and the full simulation
                yield _Priced(self, tid, t).done
                continue
            ports = acquire[tid]
            held = []
            for p in ports:
                res = resources[p]
                req = res.request()
                held.append((res, req))
                yield req
            start[tid] = env._now
            if t.mem_start:
                self._memory(t.device, t.mem_start)
            if t.duration > 0:
                if flow_tasks and tid in flow_tasks:  # a transfer on a shared network
                    yield from self.net.transfer(t.links, t.rate, t.wire)
                    if t.duration > t.wire:
                        yield timeout(env, t.duration - t.wire)
                elif slow_segs is None:
                    yield timeout(env, t.duration)
                elif slow_segs[tid] is not None:
                    if in_flight[t.device]:  # slowed from its start
                        run = self._slowed(tid, t.device, t.duration)
                        yield run.event
                        self._slowed_end(tid, t.device, run)
                    else:  # at full rate, as without the model, until communication beside it re-times it
                        ev = timeout(env, t.duration)
                        running[t.device] = (slow_segs[tid], start[tid], ev)
                        yield ev
                        run = running[t.device]
                        if run.__class__ is Slowed:
                            self._slowed_end(tid, t.device, run)
                        else:
                            running[t.device] = None
                elif comm_devices[tid]:
                    self._comm(comm_devices[tid], 1)
                    yield timeout(env, t.duration)
                    self._comm(comm_devices[tid], -1)
                else:
                    yield timeout(env, t.duration)
            for res, req in held:
                res.release(req)
            if t.ports:
                port_log.append(tid)
            if t.mem_end:
                self._memory(t.device, t.mem_end)
            end[tid] = env._now
            if end_origin is not None:
                end_origin[tid] = env.origin
            ev = waiters.pop(tid, None)
            if ev is not None:
                succeed(env, ev)

    def _execute(self, tid: int, t):
        """Run one ready task: take its ports, hold the device for its duration, account memory."""
        held = (yield from self._acquire(self.acquire[tid])) if self.acquire[tid] else ()
        devices = self._begin(tid, t)
        if t.duration > 0:
            yield timeout(self.env, t.duration)
        self._complete(tid, t, held, devices)

    def _begin(self, tid: int, t) -> tuple[int, ...] | None:
        """A task holding its ports starts: its start time, memory, and the devices whose compute its
        communication slows (returned, for `_complete`)."""
        self.start[tid] = self.env._now
        if t.mem_start:
            self._memory(t.device, t.mem_start)
        devices = self.comm_devices[tid] if self.comm_devices is not None and t.duration > 0 else None
        if devices:
            self._comm(devices, 1)
        return devices

    def _complete(self, tid: int, t, held, devices: tuple[int, ...] | None) -> None:
        """A task started by `_begin` ends: its communication stops, its ports are released and
        logged (`dlsim.sim.occupancy`), its memory freed, and whoever waits on it resumes."""
        if devices:
            self._comm(devices, -1)
        if held:
            self._release(held)
        if t.ports:
            self.port_log.tasks.append(tid)
        if t.mem_end:
            self._memory(t.device, t.mem_end)
        self._finish(tid)

    def _join(self, gid: int, member: int = -1):
        """Task `member` joins collective `gid` and waits for its end (`dlsim.sim.ties` records who)."""
        done = self.group_done[gid]
        if done is None:
            done = self.group_done[gid] = Fired()
        self.group_left[gid] -= 1
        if self.group_left[gid] == 0:
            Driver(self.env, self._run_group(gid, done))
        yield done

    def _run_group(self, gid: int, done: Fired):
        gr = self.g.groups[gid]
        members = [self.g.tasks[m] for m in gr.members]
        devices = self.group_devices[gid] if self.comm_devices is not None else None
        if gr.messages:
            self.group_start[gid] = self.env.now
            for t in members:
                self._memory(t.device, t.mem_start)
            if devices:
                self._comm(devices, 1)
            yield from self._messages(gid, gr.messages)
            if devices:
                self._comm(devices, -1)
        else:
            held = (yield from self._acquire(self.group_acquire[gid])) if gr.ports else ()
            now = self.group_start[gid] = self.env.now
            for t in members:
                self._memory(t.device, t.mem_start)
            if gr.duration > 0:
                if devices:
                    self._comm(devices, 1)
                yield timeout(self.env, gr.duration)
                if devices:
                    self._comm(devices, -1)
            if held:
                self._release(held)
            span = (now, self.env.now, gr.members[0])
            for p in gr.ports:
                self.port_log.span(p, span)
        for t in members:
            self._memory(t.device, t.mem_end)
        succeed(self.env, done)

    def _messages(self, gid: int, messages):
        finished = [self.env.event() for _ in messages]
        times: list[tuple[int, float, float]] = []

        def one(i: int):
            msg = messages[i]
            for d in msg.deps:
                if not finished[d].triggered:
                    yield finished[d]
            out_port, in_port = msg.ports
            res_out, res_in = self.resources.get(out_port), self.resources.get(in_port)
            req_out = res_out.request() if res_out is not None else None
            if req_out is not None:
                yield req_out
            req_in = res_in.request() if res_in is not None else None
            if req_in is not None:
                yield req_in
            now = self.env.now
            out_free = in_free = None
            if msg.links and self.net is not None:  # its bytes as a flow on the shared links
                yield from self.net.transfer(msg.links, msg.rate, msg.wire)
                if msg.hold > msg.wire:
                    yield self.env.timeout(msg.hold - msg.wire)
                out_free = self.env.now
            elif msg.hold > 0:
                yield self.env.timeout(msg.hold)
            if req_out is not None:
                res_out.release(req_out)
            if msg.recv_hold > msg.hold:
                yield self.env.timeout(msg.recv_hold - msg.hold)
            if out_free is not None:
                in_free = self.env.now
            if req_in is not None:
                res_in.release(req_in)
            if msg.duration > msg.recv_hold:
                yield self.env.timeout(msg.duration - msg.recv_hold)
            member = self.g.groups[gid].members[0]
            self.port_log.span(out_port, (now, now + msg.hold if out_free is None else out_free, member))
            self.port_log.span(in_port, (now, now + msg.recv_hold if in_free is None else in_free, member))
            times.append((i, now, self.env.now))
            finished[i].succeed()

        procs = [self.env.process(one(i)) for i in range(len(messages))]
        yield simpy.AllOf(self.env, procs)
        self.message_times[gid] = sorted(times)

    def standalone(self, tid: int):
        t = self.g.tasks[tid]
        for d in t.deps:
            if self.end[d] is None:
                yield self._wait(d, tid)
        yield from self._execute(tid, t)


def execute(graph: TaskGraph, run: _Run | None = None) -> Timeline:
    """Run `graph` to completion (on `run`, a `_Run` of it, where given). Raises RuntimeError if some
    task can never start (a cycle)."""
    run = _Run(graph) if run is None else run
    env = run.env
    for order in graph.orders:
        if order:
            Driver(env, run.stream(order))
    for t in graph.tasks:
        if t.stream < 0:
            Driver(env, run.standalone(t.tid))
    steps = run.loop(env) + run.elided + sum(getattr(port, "elided", 0) for port in run.resources.values())
    if None in run.end:
        missing = [t.name for t, e in zip(graph.tasks, run.end) if e is None]
        raise RuntimeError(f"{len(missing)} tasks never ran (dependency cycle?), first: {missing[:3]}")
    end = list(map(float, run.end))  # type: ignore[arg-type]
    return Timeline(run.start, end, max(end, default=0.0), run.port_log, run.peak, run.peak_time,
                    run.at_peak, run.message_times, steps, run.stretched)
