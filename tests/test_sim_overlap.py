"""Overlap slowdown in the engine (issue 13 item 4): compute kernels beside a device's in-flight
communication progress at rate 1/(1 + σ) (dlsim.sim.engine), against the closed form of
dlsim.cost.overlap; the lost time is exposed communication and the breakdown adds up."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlsim.api.models import as_cluster
from dlsim.api.simulate import simulate
from dlsim.cost.overlap import overlap_cost
from dlsim.plan.taskgraph import COMM, COMPUTE, SimDevice, TaskGraph
from dlsim.sim.analysis import device_times
from dlsim.sim.engine import execute

SIGMA = 0.189  # dgx-a100's overlap_slowdown (Lee et al. 2025)


def _graph(sigma: float) -> tuple[TaskGraph, int, int]:
    g = TaskGraph(overlap_slowdown=sigma)
    g.devices.append(SimDevice("d0", 0, 0, 1, 1e12, ()))
    return g, g.add_stream("compute", 0, "compute"), g.add_stream("comm", 0, "comm")


def _adds_up(g, tl, pipelined=False):
    bd = device_times(g, tl, pipelined)[0].breakdown
    total = bd.compute + bd.recompute + bd.exposed_comm + bd.bubble + bd.idle
    assert total == pytest.approx(tl.makespan, rel=1e-12, abs=1e-15)
    return bd


@pytest.mark.parametrize("c,m,sigma", [(1.0, 0.5, SIGMA), (1.0, 1.189, SIGMA), (1.0, 2.0, SIGMA), (0.3, 0.7, 0.5),
                                       (2e-3, 7e-4, SIGMA), (1.0, 0.0, SIGMA), (1.0, 0.5, 0.0)])
def test_closed_form_compute_beside_collective(c, m, sigma):
    """One compute task of c seconds and one collective of m seconds started together on one device:
    the compute ends at c + overlap_cost(c, m, σ)[0], the iteration at c + both terms of overlap_cost;
    the time lost is exposed communication."""
    g, cs, ms = _graph(sigma)
    k = g.add("kernel", 0, cs, c, COMPUTE, [])
    g.add("allreduce", 0, ms, m, COMM, [])
    tl = execute(g)
    extra, exposed = overlap_cost(c, m, sigma)
    assert tl.end[k] == pytest.approx(c + extra, rel=1e-14)
    assert tl.makespan == pytest.approx(c + extra + exposed, rel=1e-14)
    bd = _adds_up(g, tl)
    assert bd.compute == c
    assert bd.exposed_comm == pytest.approx(extra + exposed, rel=1e-12, abs=1e-15)


def test_fused_task_slows_only_its_compute_parts_and_rigid_parts_keep_their_duration():
    """A fused task (compute 1 s, blocking collective 0.5 s, compute 1 s) beside a 2 s collective:
    the first part runs slowed to 1 + σ, the collective part at full rate, the second part slowed
    until the collective ends at 2 s. Marked rigid (its slowdown already priced), the first part
    keeps its 1 s."""
    parts = ((COMPUTE, 1.0, 0.0), (COMM, 0.5, 0.0), (COMPUTE, 1.0, 0.0))
    g, cs, ms = _graph(SIGMA)
    k = g.add("fused", 0, cs, 0.0, COMPUTE, [], parts=parts)
    g.add("allreduce", 0, ms, 2.0, COMM, [])
    tl = execute(g)
    first = 1.0 + SIGMA
    second = first + 0.5
    end = 2.0 + (1.0 - (2.0 - second) / (1.0 + SIGMA))
    assert tl.stretched[k] == pytest.approx((first, second, end), rel=1e-14)
    assert tl.end[k] == pytest.approx(end, rel=1e-14)
    bd = _adds_up(g, tl)
    assert bd.compute == 2.0
    assert bd.exposed_comm == pytest.approx(end - 2.0, rel=1e-12)

    g, cs, ms = _graph(SIGMA)
    k = g.add("fused", 0, cs, 0.0, COMPUTE, [], parts=parts, rigid=(0,))
    g.add("allreduce", 0, ms, 2.0, COMM, [])
    tl = execute(g)
    assert tl.stretched[k][:2] == pytest.approx((1.0, 1.5), rel=1e-14)
    assert tl.end[k] == pytest.approx(2.0 + (1.0 - 0.5 / (1.0 + SIGMA)), rel=1e-14)
    _adds_up(g, tl)


def test_rate_changes_follow_every_start_and_end_of_communication():
    """Collectives back to back, then one after a gap, and a point-to-point transfer into the device:
    the kernel is slowed exactly while a collective is in flight (hand-computed); the pipeline
    transfer does not slow it (dlsim.sim.engine)."""
    g, cs, ms = _graph(SIGMA)
    g.devices.append(SimDevice("d1", 1, 1, 1, 1e12, ()))
    cs1 = g.add_stream("compute1", 1, "compute")
    link = g.add_stream("d1->d0", 1, "link")
    out1, in0 = g.add_port("d1 out", 1, "ib", "out"), g.add_port("d0 in", 0, "ib", "in")
    k = g.add("kernel", 0, cs, 3.0, COMPUTE, [])
    a = g.add("ar1", 0, ms, 0.5, COMM, [])  # [0, 0.5]
    g.add("ar2", 0, ms, 0.5, COMM, [a])  # [0.5, 1.0]
    pre = g.add("pre", 1, cs1, 1.5, COMPUTE, [])  # device 1 computes alone: nothing in flight there
    pre2 = g.add("pre2", 1, cs1, 0.5, COMPUTE, [pre])
    g.add("ar3", 0, ms, 0.25, COMM, [pre])  # [1.5, 1.75]
    g.add("send", 1, link, 0.25, COMM, [pre2], ports=(out1, in0))  # [2.0, 2.25]: not slowing
    tl = execute(g)
    slowed = 1.25  # [0, 1.0] and [1.5, 1.75] under a collective
    assert tl.end[k] == pytest.approx(3.0 + slowed * SIGMA / (1 + SIGMA), rel=1e-14)
    assert (tl.end[pre], tl.end[pre2]) == (1.5, 2.0)
    _adds_up(g, tl)


def test_zero_sigma_runs_without_the_model_and_sigma_without_overlap_changes_nothing():
    """σ = 0: no task is slowed. σ > 0 where nothing overlaps: the same timeline, bit for bit."""
    timelines = []
    for sigma in (0.0, SIGMA):
        g, cs, ms = _graph(sigma)
        k = g.add("kernel", 0, cs, 0.1, COMPUTE, [])
        g.add("allreduce", 0, ms, 0.3, COMM, [k])
        g.add("step", 0, cs, 0.05, COMPUTE, [g.tasks[-1].tid])
        timelines.append(execute(g))
    assert timelines[0].start == timelines[1].start and timelines[0].end == timelines[1].end
    assert timelines[0].stretched == timelines[1].stretched == {}


def _cluster(sigma: float):
    c = as_cluster("dgx-a100")
    return replace(c, device=replace(c.device, overlap_slowdown=sigma))


KW = dict(overrides={"layers": 8}, nodes=4, microbatch_size=4, tp=1, pp=1, dp=32, stack="eager")  # overlapped buckets


def test_data_parallel_buckets_slow_the_backward_within_the_closed_form_bounds():
    """Gradient buckets reduced beside the backward kernels: with σ > 0 the iteration is slower than
    with σ = 0, by no more than overlap_cost(compute, communication, σ)[0] of the device (a kernel is
    slowed at most while communication is in flight, and at most for its own work times 1 + σ); the
    compute counted is the same, the difference lands in exposed communication, and it adds up."""
    base = simulate("megatron-gpt-1.7b", _cluster(0.0), **KW)
    slowed = simulate("megatron-gpt-1.7b", _cluster(SIGMA), **KW)
    assert as_cluster("dgx-a100").device.overlap_slowdown == SIGMA
    b, s = base.devices[0].breakdown, slowed.devices[0].breakdown
    compute = b.compute + b.recompute
    bound = overlap_cost(compute, base.devices[0].communication_s, SIGMA)[0]
    delta = slowed.iteration_time_s - base.iteration_time_s
    assert base.devices[0].communication_s > 0 and b.exposed_comm < base.devices[0].communication_s  # it overlaps
    assert 0 < delta <= bound * (1 + 1e-12)
    assert s.compute == pytest.approx(b.compute, rel=1e-12) and s.recompute == pytest.approx(b.recompute, rel=1e-12)
    assert s.exposed_comm - b.exposed_comm == pytest.approx(delta, rel=1e-9)
    for r in slowed.devices:
        bd = r.breakdown
        assert bd.compute + bd.recompute + bd.exposed_comm + bd.bubble + bd.idle == pytest.approx(
            slowed.iteration_time_s, rel=1e-12)


def test_async_tensor_parallel_kernels_are_not_slowed_twice():
    """The kernels beside an asynchronous tensor-parallel collective carry their slowdown already
    (dlsim.cost.overlap in the graph builder): marked rigid, the engine leaves them as priced."""
    from dlsim.sim import scenario_run as api
    kw = dict(overrides={"layers": 4}, nodes=1, microbatch_size=1, tp=8, pp=1, dp=1, tp_async_backward=True,
              stack="eager")
    seen = {}
    real = api.build_iteration

    def spy(x):
        seen["graph"] = g = real(x)
        return g

    api.build_iteration, saved = spy, api.build_iteration
    try:
        simulate("megatron-gpt-1.7b", _cluster(SIGMA), **kw)
    finally:
        api.build_iteration = saved
    g = seen["graph"]
    rigid = [t for t in g.tasks if t.rigid]
    assert rigid
    for t in rigid:
        for n in t.rigid:
            assert t.segments()[n][0] != COMM
    tl = execute(g)
    for t in rigid:
        ends = tl.stretched.get(t.tid)
        if ends is None:
            continue
        at = tl.start[t.tid]
        for n, (_, seconds, _) in enumerate(t.segments()):
            if n in t.rigid:
                assert ends[n] - at == pytest.approx(seconds, rel=1e-12)
            at = ends[n]
