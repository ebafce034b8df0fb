"""Reference executors: replay a `Schedule` message by message with no contention.

`replay_steps` implements the step semantics of `schedule.py` and reproduces every closed form in
this package exactly (the tests check it for every algorithm). `replay_dataflow` implements the
data-flow semantics an asynchronous simulator would use; it agrees with the closed forms for the
lock-step algorithms (ring, recursive doubling, Rabenseifner, binomial tree, pairwise exchange)
and can be faster where ranks are idle in some steps. Both are pure Python loops, no simpy.
"""

from __future__ import annotations

from collections import defaultdict

from dlsim.cost.collectives.costs import Costs
from dlsim.cost.collectives.schedule import Message, Schedule


def _message_times(m: Message, start: float, costs: Costs) -> tuple[float, float]:
    arrival = start + costs.t(m.nbytes, m.intra)
    return arrival, arrival + costs.r(m.reduce_bytes)


def replay_steps(schedule: Schedule, costs: Costs) -> float:
    """Completion time under the step semantics: steps in order, one-port FIFO ports inside a step."""
    now = 0.0
    for step in schedule.steps:
        send_free: dict[int, float] = defaultdict(lambda: now)
        recv_free: dict[int, float] = defaultdict(lambda: now)
        end = now
        for index in step:
            m = schedule.messages[index]
            start = max(now, send_free[m.src], recv_free[m.dst])
            _, done = _message_times(m, start, costs)
            spacing = costs.gap(m.nbytes, m.intra)
            send_free[m.src] = start + spacing
            recv_free[m.dst] = start + spacing + costs.r(m.reduce_bytes)
            end = max(end, done)
        now = end
    return float(now)


def replay_dataflow(schedule: Schedule, costs: Costs) -> float:
    """Completion time under the data-flow semantics: a message starts when its deps are done and
    its sender's send port and receiver's receive port are free (ports FIFO in list order)."""
    done: list[float] = []
    send_free: dict[int, float] = defaultdict(float)
    recv_free: dict[int, float] = defaultdict(float)
    end = 0.0
    for m in schedule.messages:
        ready = max((done[d] for d in m.deps), default=0.0)
        start = max(ready, send_free[m.src], recv_free[m.dst])
        _, finish = _message_times(m, start, costs)
        spacing = costs.gap(m.nbytes, m.intra)
        send_free[m.src] = start + spacing
        recv_free[m.dst] = start + spacing + costs.r(m.reduce_bytes)
        done.append(finish)
        end = max(end, finish)
    return float(end)
