"""Reference executors: replay a `Schedule` message by message with no contention between links.

`replay_steps` implements the step semantics of `schedule.py` and reproduces every closed form in
this package exactly (the tests check it for every algorithm). `replay_dataflow` implements the
data-flow semantics an asynchronous simulator would use; it agrees with the closed forms for the
lock-step algorithms (ring, recursive doubling, Rabenseifner, binomial tree, pairwise exchange)
and can be faster where ranks are idle in some steps. Both are pure Python loops, no simpy.

Shared messages (`Message.shared`): the c shared messages one sender posts in one step start
together and share its send port fairly (processor sharing). With their sizes sorted
s_1 ≤ … ≤ s_c, message i arrives at

    start + T(s_i) + Σ_{j<i} S(s_j) + (c − i)·S(s_i)

(every message progresses at 1/(number still in flight) of the port until it is done; with
Hockney S = T this is exactly processor sharing of the bytes, with the start-up charged per
message), and the port is free again at start + Σ_j S(s_j). For c equal messages all arrive at
(c − 1)·S(s) + T(s): the last one arrives when it would under FIFO service, the first ones later.

Ports are per link tier: a rank's intra-node messages (`Message.intra`) and its other messages use
different ports and may be in flight at once (the simulator's ports, `dlsim.plan.iteration`, are per
tier likewise); no algorithm before the node-aware all-to-all mixed the two in one step.

On token-bucket-shaped tiers (`LinkTier.burst` > 0) both executors carry every sender's tokens
from message to message (`bucket.PortBuckets`; the calls start with full ports), so a rank that
sent recently pays more of the line rate.
"""

from __future__ import annotations

from collections import defaultdict

from dlsim.cost.collectives.bucket import PortBuckets, shaped
from dlsim.cost.collectives.costs import Costs
from dlsim.cost.collectives.schedule import Message, Schedule


def shared_arrivals(messages: list[Message], start: float, costs: Costs,
                    buckets: PortBuckets | None = None) -> tuple[list[float], float]:
    """Arrival time of each of one sender's shared messages started at `start` (module doc), and the
    time its send port is free again. `buckets`: the token state on shaped tiers."""
    first = messages[0]
    if buckets is not None and shaped(costs, first.intra):
        model = buckets.model(first.intra)
        offsets, busy = buckets.send(first.src, first.intra, start, [float(model.payload(m.nbytes)) for m in messages])
        return [start + o for o in offsets], start + busy
    order = sorted(range(len(messages)), key=lambda i: messages[i].nbytes)
    c = len(messages)
    arrivals = [0.0] * c
    before = 0.0
    for rank, i in enumerate(order):
        m = messages[i]
        gap = float(costs.gap(m.nbytes, m.intra))
        arrivals[i] = start + float(costs.t(m.nbytes, m.intra)) + before + (c - 1 - rank) * gap
        before += gap
    return arrivals, start + before


def _groups(schedule: Schedule, indices) -> dict[int, list[int]]:
    """Shared message indices by (step, sender), keyed by the first index of each group."""
    by_key: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i in indices:
        m = schedule.messages[i]
        if m.shared:
            by_key[(m.step, m.src)].append(i)
    return {ids[0]: ids for ids in by_key.values()}


def _single(m: Message, start: float, costs: Costs, buckets: PortBuckets) -> tuple[float, float]:
    """(arrival, spacing) of one non-shared message started at `start`."""
    if shaped(costs, m.intra):
        arrivals, free = shared_arrivals([m], start, costs, buckets)
        return arrivals[0], free - start
    return start + costs.t(m.nbytes, m.intra), costs.gap(m.nbytes, m.intra)


def replay_steps(schedule: Schedule, costs: Costs) -> float:
    """Completion time under the step semantics: steps in order, one-port FIFO ports inside a step
    (shared messages share their sender's port, module doc)."""
    buckets = PortBuckets(costs)
    now = 0.0
    for step in schedule.steps:
        send_free: dict[tuple[int, bool], float] = defaultdict(lambda: now)
        recv_free: dict[tuple[int, bool], float] = defaultdict(lambda: now)
        groups = _groups(schedule, step)
        end = now
        for index in step:
            m = schedule.messages[index]
            if m.shared:
                if index not in groups:
                    continue
                members = [schedule.messages[i] for i in groups[index]]
                start = max([now, send_free[m.src, m.intra]] + [recv_free[x.dst, x.intra] for x in members])
                arrivals, send_free[m.src, m.intra] = shared_arrivals(members, start, costs, buckets)
                for x, arrival in zip(members, arrivals):
                    done = arrival + costs.r(x.reduce_bytes)
                    recv_free[x.dst, x.intra] = done
                    end = max(end, done)
                continue
            start = max(now, send_free[m.src, m.intra], recv_free[m.dst, m.intra])
            arrival, spacing = _single(m, start, costs, buckets)
            done = arrival + costs.r(m.reduce_bytes)
            send_free[m.src, m.intra] = start + spacing
            recv_free[m.dst, m.intra] = start + spacing + costs.r(m.reduce_bytes)
            end = max(end, done)
        now = end
    return float(now)


def replay_dataflow(schedule: Schedule, costs: Costs) -> float:
    """Completion time under the data-flow semantics: a message starts when its deps are done and
    its sender's send port and receiver's receive port are free (ports FIFO in list order; a group
    of shared messages starts when all its members could, then shares the port)."""
    buckets = PortBuckets(costs)
    done: dict[int, float] = {}
    send_free: dict[tuple[int, bool], float] = defaultdict(float)
    recv_free: dict[tuple[int, bool], float] = defaultdict(float)
    groups = _groups(schedule, range(len(schedule.messages)))
    end = 0.0
    for index, m in enumerate(schedule.messages):
        if m.shared:
            if index not in groups:
                continue
            ids = groups[index]
            members = [schedule.messages[i] for i in ids]
            ready = max((done[d] for x in members for d in x.deps), default=0.0)
            start = max([ready, send_free[m.src, m.intra]] + [recv_free[x.dst, x.intra] for x in members])
            arrivals, send_free[m.src, m.intra] = shared_arrivals(members, start, costs, buckets)
            for i, x, arrival in zip(ids, members, arrivals):
                done[i] = arrival + costs.r(x.reduce_bytes)
                recv_free[x.dst, x.intra] = done[i]
                end = max(end, done[i])
            continue
        ready = max((done[d] for d in m.deps), default=0.0)
        start = max(ready, send_free[m.src, m.intra], recv_free[m.dst, m.intra])
        arrival, spacing = _single(m, start, costs, buckets)
        finish = arrival + costs.r(m.reduce_bytes)
        send_free[m.src, m.intra] = start + spacing
        recv_free[m.dst, m.intra] = start + spacing + costs.r(m.reduce_bytes)
        done[index] = finish
        end = max(end, finish)
    return float(end)
