"""The overlap slowdown in the event engine (`dlsim.sim.engine`): σ = `TaskGraph.overlap_slowdown` > 0
(`dlsim.cost.overlap`).

While one or more collectives of a device are in flight beside its compute stream (tasks of its
communication stream: gradient buckets, ZeRO gathers, tied-embedding reductions; collective groups
it belongs to), the compute and recompute kernels of its compute stream progress at rate 1/(1 + σ).
Point-to-point pipeline transfers do not slow compute: σ was measured for collectives (Lee et al.
2025), a send/receive pair drives one peer over few channels, and Megatron-LM's 1F1B waits for its
transfers between compute steps (schedules.py, `p2p_communication`) rather than running them beside
kernels; with them counted, a pipeline's timeline only tends to a periodic one (slopes 1/(1 + σ)),
so no deep pipeline could be extended exactly (`dlsim.sim.steady`). The engine tracks each running
compute task's progress exactly: at every start or end of a device's communication that changes
whether any is in flight, it books the progress made so far (segment by segment for a fused task,
whose communication parts and `rigid` parts run at full rate) and re-schedules the task's end. A
task that ran slowed has the actual end of each of its segments in `Timeline.stretched`. With σ = 0
none of this runs: the timeline is the one without the model, bit for bit.
"""

from __future__ import annotations

from dlsim.plan.taskgraph import COMPUTE, RECOMPUTE
from dlsim.sim.events import Fired, timeout


class Slowed:
    """A compute task running under the overlap model: its segments (nominal seconds, slowable),
    the segment it is in and the nominal seconds of it done by time `at`, whether it is slowed now,
    and the timeout its stream process waits on."""

    __slots__ = ("segs", "idx", "done_in", "at", "slow", "ends", "event", "stretched")

    def __init__(self, segs: tuple[tuple[float, bool], ...], now: float, slow: bool):
        self.segs, self.idx, self.done_in, self.at = segs, 0, 0.0, now
        self.slow = self.stretched = slow
        self.ends: list[float] = []
        self.event: Fired | None = None


class OverlapSlowdown:
    """The engine run's part that keeps the model (`dlsim.sim.engine._Run` is one): per task the
    devices its communication slows and a kernel's slowable segments, per device the communication
    in flight and the running kernel, re-timed at each change."""

    def _overlap_setup(self) -> None:
        """Per task: the devices whose compute its run slows (collectives on a communication stream)
        and, for compute-stream kernels, their (nominal seconds, slowable) segments."""
        g = self.g
        tasks = g.tasks
        self.comm_devices: list[tuple[int, ...] | None] = [None] * len(tasks)
        self.slow_segs: list[tuple[tuple[float, bool], ...] | None] = [None] * len(tasks)
        comm_devices, slow_segs = self.comm_devices, self.slow_segs
        slowable = (COMPUTE, RECOMPUTE)
        fused: dict[tuple[int, tuple[int, ...]], tuple | None] = {}  # parts are shared by a pass's tasks
        slowed: dict[tuple[int, tuple[int, ...]], tuple[int, ...]] = {}  # by (device, ports)
        for sid, st in enumerate(g.streams):  # (every task on a stream is in its order; transfers on none)
            if st.kind == "comm":
                for tid in g.orders[sid]:
                    t = tasks[tid]
                    if t.category not in slowable:
                        devices = slowed.get((t.device, t.ports))
                        if devices is None:
                            devs = {t.device} | {g.ports[p].device for p in t.ports}
                            devices = slowed[(t.device, t.ports)] = tuple(sorted(d for d in devs if d >= 0))
                        comm_devices[tid] = devices
                continue
            if st.kind != "compute":
                continue
            for tid in g.orders[sid]:
                t = tasks[tid]
                if t.group >= 0 or not t.duration > 0:
                    continue
                if not t.parts:
                    if t.category in slowable and not t.rigid:
                        slow_segs[tid] = ((t.duration, True),)
                    continue
                key = (id(t.parts), t.rigid)
                if key not in fused:
                    segs = tuple((seconds, category in slowable and n not in t.rigid)
                                 for n, (category, seconds, _) in enumerate(t.parts))
                    fused[key] = segs if any(slow and seconds > 0 for seconds, slow in segs) else None
                slow_segs[tid] = fused[key]
        self.group_devices = []
        for gr in g.groups:
            devs = {g.tasks[m].device for m in gr.members} | {g.ports[p].device for p in gr.ports}
            for msg in gr.messages:
                devs.update(g.ports[p].device for p in msg.ports)
            self.group_devices.append(tuple(sorted(d for d in devs if d >= 0)))
        self.in_flight = [0] * len(g.devices)
        # per device its running compute task under the model: a `Slowed`, or (segments, start, timeout)
        # while it has run at full rate from its start (`stream`: no state to keep until it is re-timed)
        self.running: list[Slowed | tuple | None] = [None] * len(g.devices)

    def _comm(self, devices: tuple[int, ...], delta: int) -> None:
        """Communication starts (+1) or ends (−1) on `devices`: re-time their running compute task
        when whether any communication is in flight changes."""
        for d in devices:
            before = self.in_flight[d]
            self.in_flight[d] = after = before + delta
            if (before > 0) != (after > 0):
                run = self.running[d]
                if run.__class__ is tuple:  # started at full rate (`stream`), its state made now
                    segs, at, event = run
                    run = Slowed(segs, at, False)
                    run.event = event
                    if event.callbacks:
                        self.running[d] = run
                if run is not None and run.event.callbacks:  # still running (its timeout not processed)
                    self._advance(run)
                    run.slow = after > 0
                    run.stretched = True
                    # the stream process waits on a new timeout: move its wake-up there
                    old, run.event = run.event, timeout(self.env, self._remaining(run))
                    run.event.callbacks, old.callbacks = old.callbacks, []

    def _advance(self, run: Slowed) -> None:
        """Book the progress made from `run.at` to now at the current rate."""
        now = self.env._now
        dt = now - run.at
        at = run.at
        factor = 1.0 + self.sigma
        segs = run.segs
        while run.idx < len(segs):
            seconds, slowable = segs[run.idx]
            f = factor if run.slow and slowable else 1.0
            need = (seconds - run.done_in) * f
            if need > dt:
                run.done_in += dt / f
                break
            dt -= need
            at += need
            run.ends.append(at)
            run.idx += 1
            run.done_in = 0.0
        run.at = now

    def _remaining(self, run: Slowed) -> float:
        """Seconds to the end of `run` if the current rate held to its end."""
        factor = 1.0 + self.sigma
        delay = 0.0
        for n in range(run.idx, len(run.segs)):
            seconds, slowable = run.segs[n]
            if n == run.idx:
                seconds -= run.done_in
            delay += seconds * factor if run.slow and slowable else seconds
        return max(0.0, delay)

    def _slowed(self, tid: int, device: int, duration: float) -> Slowed:
        """Start compute task `tid` under the overlap model (see the module docstring): unslowed, one
        timeout of its duration, as without the model; re-timed at each change of rate. Its stream
        waits on `event` (moved when re-timed), then calls `_slowed_end`."""
        run = Slowed(self.slow_segs[tid], self.env._now, self.in_flight[device] > 0)
        run.event = timeout(self.env, self._remaining(run) if run.slow else duration)
        self.running[device] = run
        return run

    def _slowed_end(self, tid: int, device: int, run: Slowed) -> None:
        self.running[device] = None
        if run.stretched:
            self._advance(run)
            now = self.env._now
            while len(run.ends) < len(run.segs):
                run.ends.append(now)
            run.ends[-1] = now
            self.stretched[tid] = tuple(run.ends)
