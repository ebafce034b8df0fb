"""Near-ties (dlsim.sim.ties): the tracked run is the engine's run, bit for bit; two chains equal in exact
arithmetic reach a contended port or a device's memory in an order their times' last bits decide, and the
order flips with the time they start at (the reason the steady-state extension refuses such a tie past its
cut); one task's end setting off two requests is no near-tie."""

from __future__ import annotations

import pytest

from dlsim.plan.taskgraph import SimDevice, TaskGraph
from dlsim.sim.engine import execute
from dlsim.sim.ties import TooManyTies, execute_tracked, memory_races, port_races, wait_races
from simkit import captured_graph

# (T0 + 0.1) + 0.2 against T0 + 0.3: equal in exact arithmetic; in floats the second is smaller after
# T0 = 0.0137 and the first after T0 = 7.9597
EARLY, LATE = 0.0137, 7.9597


def _race_graph(t0: float, memory: bool = False) -> tuple[TaskGraph, int, int]:
    """After a task of t0 seconds, stream a runs 0.1 s then 0.2 s, stream b 0.3 s; then each runs a
    1 s task on one port (x_a, x_b). With `memory` instead of the port, a's first task holds 100 bytes
    until a's second ends and x_b holds 100 bytes: a peak of 200 where x_b starts first."""
    g = TaskGraph()
    g.devices.append(SimDevice("d0", 0, 0, 1, 1e12, ()))
    a, b, c = (g.add_stream(n, 0, "compute") for n in "abc")
    port = g.add_port("p", 0, "nvlink", "out")
    s0 = g.add("s0", 0, c, t0, "compute", [])
    held = (("activations", 100.0),) if memory else ()
    freed = (("activations", -100.0),) if memory else ()
    a1 = g.add("a1", 0, a, 0.1, "compute", [s0], mem_start=held)
    g.add("a2", 0, a, 0.2, "compute", [a1], mem_end=freed)
    g.add("b1", 0, b, 0.3, "compute", [s0])
    ports = () if memory else (port,)
    x_a = g.add("x_a", 0, a, 1.0, "comm", [], ports=ports)
    x_b = g.add("x_b", 0, b, 1.0, "comm", [], ports=ports, mem_start=held, mem_end=freed)
    return g, x_a, x_b


def test_float_bits_decide_a_port_tie_and_the_tracked_run_names_it():
    """The same exact-arithmetic tie goes to b after T0 = EARLY and to a after T0 = LATE; both runs
    record it as a near-tie of the port's requests."""
    winners = []
    for t0 in (EARLY, LATE):
        g, x_a, x_b = _race_graph(t0)
        tl, ties = execute_tracked(g)
        winners.append("a" if tl.start[x_a] < tl.start[x_b] else "b")
        assert len(port_races(ties, 0.0)) == 1
        assert port_races(ties, t0 + 1.0) == []  # none from then on
    assert winners == ["b", "a"]


def test_memory_order_decided_by_float_bits_is_a_race_where_it_could_make_a_new_peak():
    """x_b's 100 bytes arrive before a's are freed after EARLY (a peak of 200), after them after LATE
    (100): the second run could have reached 200, its tie is a memory race; the first's peak already is."""
    peaks, races = [], []
    for t0 in (EARLY, LATE):
        g, _, _ = _race_graph(t0, memory=True)
        tl, ties = execute_tracked(g)
        peaks.append(tl.memory_peak[0])
        races.append(len(memory_races(ties, 0.0)))
    assert peaks == [200.0, 100.0]
    assert races == [0, 1]


def test_one_end_setting_off_two_requests_is_no_tie():
    """Two tasks waiting for one task's end request one port at that instant with one origin: the
    order they resume in is the order they began to wait (apart in time here), in any run."""
    g = TaskGraph()
    g.devices.append(SimDevice("d0", 0, 0, 1, 1e12, ()))
    a, b, c = (g.add_stream(n, 0, "compute") for n in "abc")
    port = g.add_port("p", 0, "nvlink", "out")
    s = g.add("s", 0, c, 0.5, "compute", [])
    g.add("a0", 0, a, 0.1, "compute", [])
    y1 = g.add("y1", 0, a, 1.0, "comm", [s], ports=(port,))
    y2 = g.add("y2", 0, b, 1.0, "comm", [s], ports=(port,))
    tl, ties = execute_tracked(g)
    assert tl.start[y2] == 0.5 and tl.start[y1] == 1.5  # b began to wait at 0, a at 0.1: b resumes first
    assert port_races(ties, 0.0) == [] and wait_races(g, ties, 0.0) == []


@pytest.mark.parametrize("case", [dict(pp=4, tp=2, dp=2, num_microbatches=8, schedule="1f1b"),
                                  dict(pp=2, tp=2, dp=2, num_microbatches=4, schedule="interleaved", virtual_stages=2),
                                  dict(pp=2, tp=2, dp=1, num_microbatches=8, schedule="1f1b", zero=3)],
                         ids=["1f1b-dp", "interleaved", "zero3"])
def test_tracked_run_is_the_engines_run(monkeypatch, case):
    """The tracked run processes the same events in the same order: the same timeline, bit for bit."""
    graph = captured_graph(monkeypatch, "megatron-gpt-1.7b", "dgx-a100", overrides={"layers": 8}, nodes=4,
                           microbatch_size=1, **case)
    a = execute(graph)
    b, _ = execute_tracked(graph)
    assert (a.start, a.end, a.makespan, a.events) == (b.start, b.end, b.makespan, b.events)
    assert a.port_busy == b.port_busy and a.stretched == b.stretched
    assert (a.memory_peak, a.memory_peak_time, a.memory_at_peak) == (b.memory_peak, b.memory_peak_time,
                                                                     b.memory_at_peak)


def test_a_run_that_keeps_breaking_port_ties_stops_early(monkeypatch):
    """ABORT_PORT_RACES near-ties of port requests stop the tracked run (`TooManyTies`)."""
    import dlsim.sim.ties as ties

    monkeypatch.setattr(ties, "ABORT_PORT_RACES", 1)
    with pytest.raises(TooManyTies):
        execute_tracked(_race_graph(EARLY)[0])


@pytest.mark.slow  # about 10 s (a full GPT-3 175B simulation of 384 micro-batches); .ci/run runs it
def test_gpt3_interleaved_breaks_a_port_tie_by_its_last_bits(monkeypatch):
    """GPT-3 175B on tp 8, pp 8, v 3, dp 16 with Megatron-LM 2022's stack: stage 4's forward of chunk 12
    and the all-gather of chunk 11's next input request its port at one instant every period, set off
    by two transfers equal in exact arithmetic. In the full run of 384 micro-batches the forward takes
    the port first in every period but two, where the all-gather's transfer ends one ulp earlier: the
    all-gather of micro-batch 155 starts 24 ms before its periodic place, the forward after it waits
    0.27 ms. The tracked run records these near-ties."""
    import dlsim.sim.ties as ties_module

    monkeypatch.setattr(ties_module, "ABORT_PORT_RACES", 10**9)
    graph = captured_graph(monkeypatch, "gpt3-175b", "dgx-a100", tp=8, pp=8, dp=16, microbatch_size=1,
                           num_microbatches=384, recompute="selective", stack="megatron-lm-2022",
                           schedule="interleaved", virtual_stages=3)
    tl, ties = execute_tracked(graph)
    assert len(port_races(ties, 0.0)) >= 8
    names = {t.name: t.tid for t in graph.tasks}
    lag = {m: tl.start[names[f"allgather F chunk11 mb{m}"]] - tl.end[names[f"send F chunk11 mb{m}"]]
           for m in (147, 155, 163)}
    assert lag[155] == 0.0 < lag[147] - 0.02 and abs(lag[147] - lag[163]) < 1e-9
    ends = (tl.end[names["send F chunk11 mb155"]], tl.end[names["send B chunk12 mb147"]])
    assert 0 < ends[1] - ends[0] < 1e-14  # one ulp apart; equal in the periods before and after
    assert tl.end[names["send F chunk11 mb147"]] == tl.end[names["send B chunk12 mb139"]]
