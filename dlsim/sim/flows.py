"""Flows on a shared network inside the event engine: concurrent transfers divide a link's bandwidth.

A transfer with shared links (`Task.links`, `Message.links`: fat-tree uplinks, torus or dragonfly
links, `dlsim.cost.fabric`) moves its bytes as a flow: `wire` seconds of progress at its rate alone
c (its port's bandwidth). While flows are in flight each gets its max-min fair rate r ≤ c
(`dlsim.cost.fairshare`, progressive filling) and progresses at speed r / c, so a flow that shares
nothing ends after exactly `wire` seconds and one that shares a full link stretches. Rates change
only when a flow starts or ends: then every flow's progress so far is booked at its old speed and
its end is re-timed at the new one (the process waiting on it is moved to the new timeout, as the
overlap model moves a slowed kernel, `dlsim.sim.engine`). While no link is oversubscribed (the
sum of the caps of its flows at most its capacity) every speed is 1 and nothing is recomputed.
Flows are visited in the order they started, so the same graph gives the same timeline, bit for bit.
"""

from __future__ import annotations

import simpy

from dlsim.cost.fairshare import fair_rates


class _Flow:
    __slots__ = ("links", "cap", "left", "speed", "at", "event")

    def __init__(self, links: tuple[int, ...], cap: float, wire: float, now: float):
        self.links, self.cap, self.left, self.speed, self.at = links, cap, wire, 1.0, now
        self.event: simpy.Event | None = None


class Network:
    """The flows in flight on a graph's shared links (module doc)."""

    def __init__(self, env: simpy.Environment, capacity: list[float]):
        self.env, self.capacity = env, capacity
        self.flows: list[_Flow] = []
        self.load = [0.0] * len(capacity)     # Σ caps of the flows on each link
        self.over = 0                         # links whose load exceeds their capacity
        self.shared = False                   # whether the last sharing left some flow below speed 1

    def transfer(self, links: tuple[int, ...], cap: float, wire: float):
        """Move `wire` seconds of bytes (at `cap` bytes/s alone) over `links` (a process generator)."""
        flow = _Flow(links, cap, wire, self.env.now)
        self.flows.append(flow)
        self._load(flow, +1)
        if self.over or self.shared:
            self._reshare(flow)
        else:
            flow.event = self.env.timeout(wire)
        yield flow.event
        self.flows.remove(flow)
        self._load(flow, -1)
        if self.shared:
            self._reshare(None)

    def _load(self, flow: _Flow, sign: int) -> None:
        for link in flow.links:
            before = self.load[link] > self.capacity[link]
            self.load[link] += sign * flow.cap
            after = self.load[link] > self.capacity[link]
            self.over += after - before

    def _reshare(self, new: _Flow | None) -> None:
        """Book every flow's progress at its old speed, give all their fair rates, re-time their ends."""
        now = self.env.now
        for f in self.flows:
            if f is not new:
                f.left = max(0.0, f.left - (now - f.at) * f.speed)
                f.at = now
        rates = fair_rates([f.links for f in self.flows], [f.cap for f in self.flows], self.capacity)
        shared = False
        for f, r in zip(self.flows, rates):
            speed = min(1.0, r / f.cap)
            shared |= speed < 1.0
            if f is new:
                f.speed = speed
                f.event = self.env.timeout(f.left / speed)
            elif speed != f.speed:
                f.speed = speed
                old, f.event = f.event, self.env.timeout(f.left / speed)
                f.event.callbacks, old.callbacks = old.callbacks, []
        self.shared = shared
