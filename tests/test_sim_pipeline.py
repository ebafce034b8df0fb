"""Pipeline schedules: closed forms against simulation, event order, in-flight activations."""

import pytest

from dlsim.plan.pipeline import closed_form_iteration, one_f_one_b, peak_inflight, stage_ops
from simkit import run_uniform

# reference/algorithms.md §4.1 simulation check (t_f = 1, t_b = 2)
TABLE = [("gpipe", 4, 8, 1, 33.0), ("1f1b", 4, 8, 1, 33.0), ("interleaved", 4, 8, 2, 28.5),
         ("interleaved", 4, 8, 4, 26.25), ("gpipe", 8, 32, 1, 117.0), ("1f1b", 8, 32, 1, 117.0),
         ("interleaved", 8, 32, 2, 106.5), ("interleaved", 8, 32, 4, 101.25)]


@pytest.mark.parametrize("schedule,p,m,v,expected", TABLE)
def test_closed_form_exact(schedule, p, m, v, expected):
    _, tl, _ = run_uniform(schedule, p, m, v)
    assert tl.makespan == expected
    assert closed_form_iteration(schedule, p, m, v, 1.0, 2.0) == expected


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 3, 5, 1), ("1f1b", 5, 7, 1), ("1f1b", 4, 2, 1),
                                             ("interleaved", 3, 6, 3), ("interleaved", 2, 2, 2)])
def test_closed_form_other_sizes(schedule, p, m, v):
    t_f, t_b = 0.37, 0.81
    _, tl, _ = run_uniform(schedule, p, m, v, layers_per_chunk=3, t_f=t_f, t_b=t_b)
    assert tl.makespan == pytest.approx(closed_form_iteration(schedule, p, m, v, t_f, t_b), rel=1e-12)


def _log(graph, tl, device):
    stream = next(i for i, s in enumerate(graph.streams) if s.device == device and s.kind == "compute")
    return [(graph.tasks[t].label[0], graph.tasks[t].label[2], tl.start[t], tl.end[t]) for t in graph.orders[stream]
            if graph.tasks[t].label[0] in ("F", "B")]


def test_event_order_1f1b_two_stages_two_microbatches():
    graph, tl, _ = run_uniform("1f1b", 2, 2)
    assert _log(graph, tl, 0) == [("F", 0, 0.0, 1.0), ("F", 1, 1.0, 2.0), ("B", 0, 4.0, 6.0), ("B", 1, 7.0, 9.0)]
    assert _log(graph, tl, 1) == [("F", 0, 1.0, 2.0), ("B", 0, 2.0, 4.0), ("F", 1, 4.0, 5.0), ("B", 1, 5.0, 7.0)]
    assert tl.makespan == 9.0


def test_event_order_gpipe_two_stages_two_microbatches():
    graph, tl, _ = run_uniform("gpipe", 2, 2)
    assert _log(graph, tl, 0) == [("F", 0, 0.0, 1.0), ("F", 1, 1.0, 2.0), ("B", 1, 5.0, 7.0), ("B", 0, 7.0, 9.0)]
    assert _log(graph, tl, 1) == [("F", 0, 1.0, 2.0), ("F", 1, 2.0, 3.0), ("B", 1, 3.0, 5.0), ("B", 0, 5.0, 7.0)]


def test_megatron_op_orders():
    ops = [o.kind + str(o.microbatch) for o in one_f_one_b(4, 6, 1)]
    assert ops == ["F0", "F1", "F2", "B0", "F3", "B1", "F4", "B2", "F5", "B3", "B4", "B5"]
    assert [o.kind for o in one_f_one_b(4, 6, 3)] == ["F", "B"] * 6
    inter = stage_ops("interleaved", 2, 4, 2, 0)
    # warmup = 2(p - r - 1) + (v - 1)p = 4 forwards: (mb 0, chunk 0), (1, 0), (0, 1), (1, 1)
    assert [(o.microbatch, o.chunk) for o in inter[:4]] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert sum(o.kind == "F" for o in inter) == sum(o.kind == "B" for o in inter) == 8


@pytest.mark.parametrize("schedule,p,m,v,stage0", [("gpipe", 4, 8, 1, 8), ("1f1b", 4, 8, 1, 4),
                                                    ("interleaved", 4, 8, 2, 11), ("interleaved", 4, 8, 4, 19),
                                                    ("interleaved", 8, 32, 2, 23)])
def test_peak_inflight_activations(schedule, p, m, v, stage0):
    """reference/algorithms.md §4.3: peak in-flight chunk-micro-batches per stage (sim-verified values at stage 0)."""
    graph, tl, _ = run_uniform(schedule, p, m, v, saved=1.0)
    peaks = [tl.memory_peak[d] for d in range(p)]
    assert peaks[0] == stage0
    assert peaks == [peak_inflight(schedule, p, m, v, r) for r in range(p)]


def test_identical_runs_are_identical():
    a = run_uniform("interleaved", 4, 8, 2, t_f=0.3, t_b=0.7)[1]
    b = run_uniform("interleaved", 4, 8, 2, t_f=0.3, t_b=0.7)[1]
    assert a.start == b.start and a.end == b.end and a.memory_peak == b.memory_peak


def test_tied_embedding_copy_and_gradient_sync():
    """Megatron keeps the word embedding on the last stage too and all-reduces its gradient with the first."""
    from dlsim.api.models import as_model
    from dlsim.api.simulate import run_simulation
    gpt = as_model("gpt2", {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024})
    sim = run_simulation(gpt, "dgx-h100", pp=2, microbatch_size=1, num_microbatches=4, stage_partition=(22, 23),
                         trace=True, stack="eager")  # fp32 weights: 4 bytes each
    first = sum(layer.params for layer in gpt.layers[:22])
    last = sum(layer.params for layer in gpt.layers[22:]) + gpt.layer("embed").params
    assert [d.memory["weights"] / 4 for d in sim.result.devices] == [first, last]
    syncs = [e for e in sim.trace["traceEvents"] if e["ph"] == "X" and e["name"].startswith("allreduce ")
             and e["name"].endswith(": tied embedding grads") and e["cat"] == "comm"]
    assert len(syncs) == 2 and syncs[0]["ts"] == syncs[1]["ts"] and syncs[0]["dur"] > 0


def test_microbatch_plan_prices_convolutions():
    from dlsim.api.simulate import simulate
    plain = simulate("resnet18", "dgx-h100", microbatch_size=32, stack="eager")
    planned = simulate("resnet18", "dgx-h100", microbatch_size=32, microbatch_plan="wr", workspace_limit="8MiB",
                       stack="eager")
    assert any("μ-cuDNN WR plan" in n for n in planned.notes)
    assert planned.iteration_time_s == pytest.approx(plain.iteration_time_s, rel=0.5)


@pytest.mark.parametrize("p,m", [(2, 2), (4, 8), (8, 16)])
def test_point_to_point_time_in_fill_and_drain(p, m):
    """reference/algorithms.md §4.1 [derived]: with transfers c ≤ min(t_f, t_b), GPipe hides the steady
    state's transfers and pays 2(p − 1)c; 1F1B, whose backward passes wait on round trips, pays at least that."""
    from simkit import RingPricer
    c = 0.25
    ideal = closed_form_iteration("gpipe", p, m, 1, 1.0, 2.0) + 2 * (p - 1) * c
    assert run_uniform("gpipe", p, m, pricer=RingPricer(c, 0.0))[1].makespan == ideal
    assert run_uniform("1f1b", p, m, pricer=RingPricer(c, 0.0))[1].makespan >= ideal


def test_blocking_exchanges_hold_the_sender():
    """Megatron-LM's p2p_communication waits for every exchange: with p2p_overlap off, stage 0's second
    forward starts only when the first forward's send (c) is done; with it on, right after the first."""
    from simkit import RingPricer
    c, t_f = 0.25, 1.0
    for overlap, start in ((True, t_f), (False, t_f + c)):
        graph, tl, _ = run_uniform("gpipe", 2, 2, pricer=RingPricer(c, 0.0), out_bytes=1.0, p2p_overlap=overlap)
        second = next(i for i, t in enumerate(graph.tasks) if t.label[:3] == ("F", 0, 1))
        assert tl.start[second] == start


def test_scatter_gather_sends_slices_and_gathers_them():
    """Narayanan et al. SC'21 §4.1: a replicated boundary of n bytes crosses as n/tp per rank, then an
    all-gather of n over the receiver's tp group; the next stage's forward waits for the gather."""
    from simkit import RingPricer
    alpha, beta, n, tp = 0.01, 1.0, 8.0, 2
    pricer = RingPricer(alpha, beta)
    graph, tl, _ = run_uniform("gpipe", 2, 1, pricer=pricer, out_bytes=n, tp=tp, p2p_scatter_gather=True)
    sends = [t for t in graph.tasks if t.name.startswith("send")]
    gathers = [t for t in graph.tasks if t.name.startswith("allgather")]
    assert sends and all(t.duration == pytest.approx(alpha + n / tp * beta) for t in sends)
    assert len(gathers) == len(sends)
    assert all(t.duration == pricer.collective("allgather", n, [0, 1]).seconds for t in gathers)
    plain = run_uniform("gpipe", 2, 1, pricer=pricer, out_bytes=n, tp=tp)[0]
    assert not any(t.name.startswith("allgather") for t in plain.tasks)
