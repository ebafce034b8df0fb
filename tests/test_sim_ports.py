"""Link ports in the engine (dlsim.sim.engine, dlsim.sim.events): `Port` behaves as a `simpy.Resource` of capacity 1
event for event, and a port that only one task stream or transfer uses needs no resource at all.
The same graphs run with SimPy's resources on the contended ports, with resources on every port
(SimPy's and `Port`) and as the engine runs them give the same timeline, bit for bit (start and
end of every task, port occupancy, memory peaks, slowed tasks' segment ends), with and without the
overlap slowdown; `Port` alone also processes exactly SimPy's events."""

from __future__ import annotations

import heapq

import pytest
import simpy
import simpy.core

from dlsim.sim import engine, events, slowdown
from dlsim.sim.engine import execute
from dlsim.sim.events import Port
from simkit import captured_graph

KW = dict(overrides={"layers": 8}, nodes=4, microbatch_size=1)
CASES = {
    # stage-to-stage sends in both directions and gradient buckets share each device's ports: contended
    "pipeline-dp": dict(pp=4, tp=2, dp=2, num_microbatches=8, schedule="1f1b"),
    "interleaved": dict(pp=2, tp=2, dp=2, num_microbatches=4, schedule="interleaved", virtual_stages=2),
    # every rank simulated, collectives as point-to-point messages: messages of one group contend
    "expanded": dict(pp=2, tp=2, dp=2, num_microbatches=4, schedule="1f1b", symmetry=False, expand_collectives=True),
    # one stage, tensor parallel only: the compute stream alone uses its ports (nothing contended)
    "tp-only": dict(tp=4, num_microbatches=2),
}


def _graph(monkeypatch, case):
    """The task graph `simulate` would execute for `case` (the full run, no steady-state extension)."""
    return captured_graph(monkeypatch, "megatron-gpt-1.7b", "dgx-a100", **KW, **case)


def _run(monkeypatch, graph, port_type=None, all_ports=False):
    with monkeypatch.context() as m:
        if port_type is not None:
            m.setattr(engine._Run, "port_type", staticmethod(port_type))
        m.setattr(engine._Run, "all_ports", all_ports)
        return execute(graph)


def _same(a, b, events=True):
    assert a.start == b.start
    assert a.end == b.end
    assert a.makespan == b.makespan
    assert [sorted(x) for x in a.port_busy] == [sorted(x) for x in b.port_busy]
    assert a.memory_peak == b.memory_peak and a.memory_peak_time == b.memory_peak_time
    assert a.memory_at_peak == b.memory_at_peak
    assert a.message_times == b.message_times
    assert a.stretched == b.stretched
    if events:
        assert a.port_busy == b.port_busy
        assert a.events == b.events


def _simpy_port(env):
    return simpy.Resource(env, capacity=1)


@pytest.mark.parametrize("sigma", [None, 0.0], ids=["profile-sigma", "sigma0"])
@pytest.mark.parametrize("name", list(CASES))
def test_ports_give_the_same_timeline(monkeypatch, name, sigma):
    graph = _graph(monkeypatch, CASES[name])
    if sigma is not None:
        graph.overlap_slowdown = sigma
    contended = engine._Run(graph).resources
    used = {p for t in graph.tasks for p in t.ports} | {p for g in graph.groups for p in g.ports}
    if name == "tp-only":
        assert used and not contended  # every port skipped
    else:
        assert contended
    if name == "pipeline-dp":
        assert used - set(contended)  # and some skipped
    tl = _run(monkeypatch, graph)
    _same(tl, _run(monkeypatch, graph, port_type=_simpy_port))
    every = _run(monkeypatch, graph, port_type=_simpy_port, all_ports=True)
    _same(tl, every, events=False)  # resources on uncontended ports only add events
    _same(every, _run(monkeypatch, graph, all_ports=True))


def test_port_grants_in_simpy_order():
    """Requests and releases at the same instant, with waiters queued: `Port` grants in SimPy's order."""
    def trace(make):
        env = simpy.Environment()
        port = make(env)
        log = []

        def user(name, delay, hold, holds=1):
            yield env.timeout(delay)
            for _ in range(holds):
                req = port.request()
                yield req
                log.append((env.now, name, "got"))
                if hold:
                    yield env.timeout(hold)
                port.release(req)
                log.append((env.now, name, "freed"))

        for n, (delay, hold, holds) in enumerate([(0, 1, 2), (0, 0, 2), (0, 1, 1), (1, 0, 3), (1, 2, 1), (2, 0, 1)]):
            env.process(user(f"u{n}", delay, hold, holds))
        steps = 0
        while env.peek() < float("inf"):
            env.step()
            steps += 1
        return log, steps + getattr(port, "elided", 0)  # releases nobody waited for: counted, not pushed

    assert trace(Port) == trace(_simpy_port)


def _simpy_primitives(m):
    """The engine's event primitives (dlsim.sim.events) replaced by SimPy's own: `env.process`,
    `env.timeout`, `Event.succeed`, an URGENT `Event`, `env.step()` until the queue is empty."""
    envs = []

    class Env(simpy.Environment):
        def __init__(self):
            super().__init__()
            envs.append(self)

    def urgent(env, callback):
        ev = simpy.Event(env)
        ev._ok, ev._value = True, None
        ev.callbacks.append(callback)
        env.schedule(ev, simpy.events.URGENT)

    def run_to_end(env):
        steps = 0
        while env.peek() < float("inf"):
            env.step()
            steps += 1
        return steps

    m.setattr(engine.simpy, "Environment", Env)
    m.setattr(engine, "Fired", lambda: simpy.Event(envs[-1]))
    m.setattr(engine, "Driver", lambda env, generator: env.process(generator))
    m.setattr(engine, "timeout", lambda env, delay: env.timeout(delay))
    m.setattr(slowdown, "timeout", lambda env, delay: env.timeout(delay))  # kernels re-timed beside communication
    m.setattr(engine, "succeed", lambda env, ev: ev.succeed())
    m.setattr(engine, "urgent", urgent)
    m.setattr(engine, "run_to_end", run_to_end)
    m.setattr(engine._Run, "port_type", staticmethod(_simpy_port))


PRIMITIVES = {
    "pipeline-dp": CASES["pipeline-dp"], "interleaved": CASES["interleaved"], "expanded": CASES["expanded"],
    # scatter-gather transfers, their all-gathers priced collectives on their own streams, asynchronous
    # tensor-parallel backward communication beside the kernels (the overlap slowdown re-timing them)
    "megatron-2022": dict(pp=4, tp=2, dp=2, num_microbatches=8, schedule="1f1b", stack="megatron-lm-2022"),
}


@pytest.mark.parametrize("name", list(PRIMITIVES))
def test_event_primitives_are_simpys(monkeypatch, name):
    """The engine on its own event primitives and on SimPy's processes, timeouts, events, resources
    and run loop: the same events processed in the same order (time, priority and insertion id of
    each), but for those the engine counts without pushing: releases of ports nobody waited for
    (no-ops), and requests granted at once and priced collectives' starts (URGENT) and ends that the
    loop would process next (`Port`, `engine._Priced`); and the same timeline, bit for bit."""
    graph = _graph(monkeypatch, PRIMITIVES[name])
    popped: dict[str, list] = {"own": [], "simpy": []}

    def recording(log):
        def pop(queue):
            item = heapq.heappop(queue)
            log.append(item[:3])
            return item
        return pop

    with monkeypatch.context() as m:
        m.setattr(events, "heappop", recording(popped["own"]))
        tl = execute(graph)
    with monkeypatch.context() as m:
        _simpy_primitives(m)
        m.setattr(simpy.core, "heappop", recording(popped["simpy"]))
        reference = execute(graph)
    own, ref = popped["own"], popped["simpy"]
    assert len(ref) == reference.events == tl.events > len(own) > 0
    kept = set(own)
    assert [key for key in ref if key in kept] == own
    # a start run at once was the very next event SimPy processed, at the instant of the one before
    starts = [n for n, key in enumerate(ref) if key not in kept and key[1] == simpy.events.URGENT]
    assert all(n > 0 and ref[n - 1][0] == ref[n][0] for n in starts)
    if name == "megatron-2022":  # priced all-gathers of its scatter-gather transfers
        assert starts
    _same(tl, reference)
