"""The engine's event primitives (`dlsim.sim.engine`): SimPy's events, processes and run loop as the
engine uses them, event for event, without their generality.

SimPy orders its events by (time, priority, insertion): an event goes on the environment's queue
when it is triggered (`Environment.schedule`: time now + delay, a priority, the next id of the
environment's counter) and its callbacks run when the loop pops it. Here the same events are pushed
on the same queue at the same moments with the same keys, so the order of everything, the ties
included, is SimPy's and a timeline is the one `simpy.Process`, `Timeout` and `Event.succeed` give,
bit for bit (tests/test_sim_ports.py runs graphs on SimPy's own primitives and compares the events
popped, key for key):

* `Fired`: an event with its callbacks, ok and value only (what the loop, a process and the engine
  read of a `Timeout`, a succeeded `Event` or a granted request); `timeout`, `succeed` and `urgent`
  push one as `Timeout(env, delay)`, `Event.succeed()` and an `Initialize` push theirs;
* `Driver`: `simpy.Process` for a generator that yields such events (its start at URGENT priority,
  its callback on each event it waits for, its own event pushed when the generator returns), with
  one bound callback instead of one per wait;
* `Port`: a `simpy.Resource(env, capacity=1)`'s request and release (a release nobody waits for,
  a no-op event, counted and its id drawn but not pushed; so is a request granted at once that
  the loop would process next: see `Port`);
* `run_to_end`: `env.step()` until the queue is empty.
Processes that wait for several events (`simpy.AllOf`) stay SimPy's own.
"""

from __future__ import annotations

from collections import deque
from bisect import bisect_right
from heapq import heappop, heappush

import simpy
from simpy.events import NORMAL, URGENT


class Fired:
    """An event as the run loop and the processes see it: callbacks (None once processed), ok, value."""

    __slots__ = ("callbacks", "_ok", "_value")

    def __init__(self) -> None:
        self.callbacks: list | None = []
        self._ok = True
        self._value = None


GRANTED = Fired()  # a port request granted and processed at once (`Port.request`): nothing to wait for
GRANTED.callbacks = None


def timeout(env: simpy.Environment, delay: float) -> Fired:
    """`env.timeout(delay)`: an event pushed at now + delay."""
    ev = Fired()
    heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), ev))
    return ev


def succeed(env: simpy.Environment, ev) -> None:
    """`ev.succeed()` of a pending event (a `Fired` not pushed yet): pushed now."""
    heappush(env._queue, (env._now, NORMAL, next(env._eid), ev))


def urgent(env: simpy.Environment, callback) -> None:
    """An event pushed now at URGENT priority whose one callback is `callback` (a process's start)."""
    ev = Fired()
    ev.callbacks.append(callback)
    heappush(env._queue, (env._now, URGENT, next(env._eid), ev))


class Driver:
    """`env.process(generator)` for a generator yielding events: started by an URGENT event, resumed
    by each event it waits for, and itself an event pushed when the generator returns."""

    __slots__ = ("env", "send", "throw", "resume", "callbacks", "_ok", "_value")

    def __init__(self, env: simpy.Environment, generator) -> None:
        self.env, self.send, self.throw = env, generator.send, generator.throw
        self.callbacks: list | None = []
        self._ok, self._value = True, None
        self.resume = self._resume
        urgent(env, self.resume)

    def _resume(self, event) -> None:
        send = self.send
        while True:
            try:
                event = send(event._value) if event._ok else self.throw(event._value)
            except StopIteration:
                env = self.env
                heappush(env._queue, (env._now, NORMAL, next(env._eid), self))
                return
            callbacks = event.callbacks
            if callbacks is not None:  # not processed yet: resume when it is
                callbacks.append(self.resume)
                return


class Port:
    """A link port one task holds at a time: `simpy.Resource(env, capacity=1)`'s request and release,
    event for event (a request is an event, pushed at once when the port is free and nobody waits; a
    release is an event pushed at once, whose processing grants the port to the oldest waiter),
    without the generic put/get queue machinery.

    A release while nobody waits is not pushed: by the time SimPy would process it the port is either
    still free with nobody waiting (a request meanwhile is granted at once) or taken by such a request,
    and it does nothing. Its id is drawn all the same, so that every other event keeps SimPy's key, and
    it is counted (`elided`) among the events processed.

    A request granted at once is not pushed either where the loop would process it next: the run
    loop (`run_to_end`, `run_tracked`) is in the last callback of the event it processes
    (`env.last_callback`) and nothing else is queued for this instant. The loop would pop it as the
    very next event and resume its one waiter, which does nothing in between; the request returns
    an event already processed (`GRANTED`) and the waiter goes on at once (`Driver`, SimPy's
    `Process`: the same), its id drawn and the event counted as above. Under any other loop
    (SimPy's `env.step()`) `last_callback` is False and every request is pushed."""

    __slots__ = ("env", "busy", "queue", "released", "elided")

    def __init__(self, env: simpy.Environment):
        self.env, self.busy, self.queue = env, False, deque()
        self.released = self._released
        self.elided = 0
        if not hasattr(env, "last_callback"):
            env.last_callback = False  # until `run_to_end` or `run_tracked` runs it

    def request(self) -> Fired:
        if self.busy:
            ev = Fired()
            self.queue.append(ev)
        elif self.queue:  # freed, its release not processed yet: the oldest waiter takes it
            ev = Fired()
            self.queue.append(ev)
            self._grant()
        else:
            self.busy = True
            env = self.env
            queue = env._queue
            if env.last_callback and (not queue or queue[0][0] > env._now):  # processed next: done now
                next(env._eid)
                self.elided += 1
                return GRANTED
            ev = Fired()
            heappush(queue, (env._now, NORMAL, next(env._eid), ev))
        return ev

    def _grant(self) -> None:
        self.busy = True
        env = self.env
        heappush(env._queue, (env._now, NORMAL, next(env._eid), self.queue.popleft()))

    def release(self, request: Fired) -> None:
        self.busy = False
        env = self.env
        if not self.queue:  # a no-op when processed (see the class docstring)
            next(env._eid)
            self.elided += 1
            return
        ev = Fired()
        ev.callbacks.append(self.released)
        heappush(env._queue, (env._now, NORMAL, next(env._eid), ev))

    def _released(self, _event: Fired) -> None:
        if not self.busy and self.queue:
            self._grant()


def run_to_end(env: simpy.Environment) -> int:
    """Process every scheduled event in (time, priority, insertion) order, as `env.step()` repeated
    until the schedule is empty does (its body inlined: the loop is the engine's innermost); returns
    the number of events processed."""
    queue = env._queue
    steps = 0
    env.last_callback = True  # (`Port.request`) but while an event's other callbacks run
    while queue:
        env._now, _, _, event = heappop(queue)
        callbacks, event.callbacks = event.callbacks, None
        if len(callbacks) == 1:
            callbacks[0](event)
        elif callbacks:
            _several(env, event, callbacks)
        if not event._ok and not hasattr(event, "_defused"):
            raise event._value  # a failed event nobody handled, as `env.step()` raises it
        steps += 1
    env.last_callback = False
    return steps


def _several(env: simpy.Environment, event, callbacks: list) -> None:
    """Run an event's callbacks in order, `env.last_callback` False but for the last (`Port.request`)."""
    env.last_callback = False
    for callback in callbacks[:-1]:
        callback(event)
    env.last_callback = True
    callbacks[-1](event)


def run_tracked(env: simpy.Environment) -> int:
    """`run_to_end` that keeps in `env.origin` the origin of the event being processed
    (`dlsim.sim.ties`): an event pushed for a later time than the event whose processing pushed it is
    its own origin (its id), one pushed for the same instant inherits that event's origin, so that
    everything one task's end sets off at that instant shares it.

    At each new instant the loop draws an id of its own from `env._eid` as a marker: an event of this
    instant with a smaller id was pushed before it, its own origin. While only one such event has been
    processed at this instant, everything pushed since descends from it; from the second one on, the
    loop draws a marker before processing each event, so that the last marker below an event's id
    names the event whose processing pushed it. Drawn ids only ever grow, so the extra ones change no
    event's place in the (time, priority, id) order: the timeline is `run_to_end`'s."""
    queue = env._queue
    counter = env._eid
    env.last_callback = True  # as in `run_to_end`
    markers: list[int] = []  # from the second own-origin event of an instant: per event processed, in
    origins: list[int] = []  # order, its marker and its origin
    now = None
    first = root = -1
    steps = 0
    while queue:
        at, _, eid, event = heappop(queue)
        if at != now:
            now = env._now = at
            first = next(counter)
            root = origin = eid
            if markers:
                markers.clear()
                origins.clear()
        elif eid < first:  # pushed before this instant: its own origin
            origin = eid
            if not markers:  # the instant's second: what was pushed so far descends from the first
                markers.append(first)
                origins.append(root)
            markers.append(next(counter))
            origins.append(origin)
        elif markers:
            origin = origins[bisect_right(markers, eid) - 1]
            markers.append(next(counter))
            origins.append(origin)
        else:
            origin = root
        env.origin = origin
        callbacks, event.callbacks = event.callbacks, None
        if len(callbacks) == 1:
            callbacks[0](event)
        elif callbacks:
            _several(env, event, callbacks)
        if not event._ok and not hasattr(event, "_defused"):
            raise event._value
        steps += 1
    env.last_callback = False
    return steps
