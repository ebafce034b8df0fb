"""Port occupancy derived after the run (dlsim.sim.occupancy): the per-port intervals in the order
their holders ended (`Timeline.port_busy`) and the per-device arrays the breakdowns take hold the
same intervals, bit for bit; by hand for a fused task, slowed and not, a transfer and a collective."""

from __future__ import annotations

import numpy as np
import pytest
from simkit import captured_graph

from dlsim.plan.taskgraph import COMM, COMPUTE, SimDevice, TaskGraph
from dlsim.sim import occupancy
from dlsim.sim.engine import execute

SIGMA = 0.189


def _per_device(graph, tl):
    """(from `port_busy`, from `device_spans`): per device the set of (start, end) intervals."""
    nd = len(graph.devices)
    busy: dict[int, set] = {d: set() for d in range(nd)}
    for pid, spans in enumerate(tl.port_busy):
        busy[graph.ports[pid].device % nd].update((a, b) for a, b, _ in spans)
    arrays = {d: set(zip(np.asarray(a, dtype=float).tolist(), np.asarray(b, dtype=float).tolist()))
              for d, (a, b) in enumerate(tl.port_log.device_spans(tl.start, tl.end, tl.stretched, nd))}
    return busy, arrays


def _graph() -> tuple[TaskGraph, dict[str, int]]:
    """Two devices: on d0 a fused task (compute 1 s, communication 0.5 s on d0's out port, compute
    1 s, communication 0.25 s) beside a 2 s collective of its communication stream, then a 0.5 s
    transfer from d0's out port to d1's in port; on d1 a collective group of 1 s holding its port."""
    g = TaskGraph(overlap_slowdown=SIGMA)
    for d in range(2):
        g.devices.append(SimDevice(f"d{d}", d, 0, 1, 1e12, ()))
    out0 = g.add_port("d0 out", 0, "nvlink", "out")
    in1 = g.add_port("d1 in", 1, "nvlink", "in")
    cs0, ms0 = g.add_stream("compute", 0, "compute"), g.add_stream("comm", 0, "comm")
    cs1, cs1b = g.add_stream("compute", 1, "compute"), g.add_stream("comm", 1, "comm")
    parts = ((COMPUTE, 1.0, 0.0), (COMM, 0.5, 0.0), (COMPUTE, 1.0, 0.0), (COMM, 0.25, 0.0))
    ids = {"fused": g.add("fused", 0, cs0, 0.0, COMPUTE, [], parts=parts, ports=(out0,))}
    g.add("allreduce", 0, ms0, 2.0, COMM, [])
    ids["send"] = g.add("send", 0, cs0, 0.5, COMM, [ids["fused"]], ports=(out0, in1))
    a = g.add("member a", 1, cs1, 0.0, COMM, [ids["send"]])
    b = g.add("member b", 1, cs1b, 0.0, COMM, [])
    g.add_group([a, b], 1.0, ports=(in1,))
    ids["member"] = a
    return g, ids


@pytest.mark.parametrize("holders", [0, 10**9], ids=["arrays", "listed"])
def test_fused_transfer_and_collective_by_hand(monkeypatch, holders):
    monkeypatch.setattr(occupancy, "FEW_HOLDERS", holders)
    g, ids = _graph()
    tl = execute(g)
    k = ids["fused"]
    first, second, third = tl.stretched[k][:3]  # slowed: its communication parts where they ran
    assert first == pytest.approx(1.0 + SIGMA) and second == first + 0.5
    send_start, send_end = tl.start[ids["send"]], tl.end[ids["send"]]
    assert send_start == tl.end[k] and send_end == send_start + 0.5
    group = (send_end, send_end + 1.0, ids["member"])
    assert tl.port_busy == [
        [(first, first + 0.5, k), (third, third + 0.25, k), (send_start, send_end, ids["send"])],
        [(send_start, send_end, ids["send"]), group]]
    busy, arrays = _per_device(g, tl)
    assert busy == arrays

    g.overlap_slowdown = 0.0  # not slowed: the parts back to back from the start
    tl = execute(g)
    assert tl.stretched == {}
    assert tl.port_busy[0][:2] == [(1.0, 1.5, k), (2.5, 2.75, k)]
    busy, arrays = _per_device(g, tl)
    assert busy == arrays


@pytest.mark.parametrize("case", [
    # fused passes with asynchronous tensor-parallel communication, priced collectives, pipeline sends
    {"pp": 4, "tp": 2, "dp": 2, "num_microbatches": 8, "schedule": "1f1b", "stack": "megatron-lm-2022"},
    # every rank, collectives as point-to-point messages
    {"pp": 2, "tp": 2, "dp": 2, "num_microbatches": 4, "schedule": "1f1b", "symmetry": False,
     "expand_collectives": True},
], ids=["megatron-2022", "expanded"])
def test_device_arrays_hold_the_port_intervals(monkeypatch, case):
    """Fused tasks alike computed together with numpy and one by one (`occupancy.FEW`), and every holder
    one by one (`occupancy.FEW_HOLDERS`): the same."""
    graph = captured_graph(monkeypatch, "megatron-gpt-1.7b", "dgx-a100", overrides={"layers": 8}, nodes=4,
                           microbatch_size=1, **case)
    tl = execute(graph)
    for few, holders in ((1, 0), (10**9, 0), (1, 10**9)):
        monkeypatch.setattr(occupancy, "FEW", few)
        monkeypatch.setattr(occupancy, "FEW_HOLDERS", holders)
        busy, arrays = _per_device(graph, tl)
        assert any(busy.values())
        assert busy == arrays
