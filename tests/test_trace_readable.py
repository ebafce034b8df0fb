"""Traces a performance engineer can read (issue 34 item 6): slices named by layer and kernel or collective with
bytes and source, flows from send to receive, process ids from 1; Gantt bars at least a few pixels wide and
forward, backward and recomputation in colours of their own."""

from __future__ import annotations

import re

import pytest

from dlsim.api.simulate import run_simulation
from dlsim.spec.strategy import Strategy


@pytest.fixture(scope="module")
def pipeline_trace():
    """gpt2 on 4 pipeline stages, 8 micro-batches, 2-way tensor parallelism, full recomputation: 48 sends."""
    strategy = Strategy(tp=2, pp=4, microbatch_size=1, num_microbatches=8, recompute="full")
    return run_simulation("gpt2", "dgx-h100", strategy, trace=True).trace


@pytest.fixture(scope="module")
def fused_trace():
    """gpt2 under 4-way tensor parallelism: each pass one fused task whose parts are kernels and collectives."""
    return run_simulation("gpt2", "dgx-h100", Strategy(tp=4, microbatch_size=2), trace=True).trace


def spans(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_process_ids_start_at_one(pipeline_trace):
    names = {e["pid"]: e["args"]["name"] for e in pipeline_trace["traceEvents"] if e.get("name") == "process_name"}
    assert min(names) == 1 and names[1].startswith("rank0") and names[max(names)] == "links"
    assert 0 not in {e["pid"] for e in pipeline_trace["traceEvents"]}


def test_every_slice_says_what_it_runs_its_bytes_and_its_source(pipeline_trace, fused_trace):
    """Slices were named `F chunk0 mb0 [compute 4]`: no layer, kernel or collective, no bytes."""
    for trace in (pipeline_trace, fused_trace):
        device = [e for e in spans(trace) if e["cat"] != "link"]
        assert device and not [e["name"] for e in device if re.search(r"\[(compute|comm|recompute) \d+\]", e["name"])]
        for e in device:
            args = e["args"]
            assert "source" in args and ("layers" in args or "op" in args or e["name"].startswith("optimizer")), e
            if args.get("op"):
                assert args["bytes"] > 0 and f"{args['op']} " in e["name"]
    fused = spans(fused_trace)
    assert any(e["name"].startswith("F allreduce ") and "g: output of" in e["name"] for e in fused)
    assert any(e["args"].get("layers", "").startswith("h.") and e["name"].startswith("B ") for e in fused)
    phases = {e["args"].get("phase") for e in spans(pipeline_trace)}
    assert {"forward", "backward", "recompute", "forward send", "backward send", "optimizer"} <= phases


def test_flows_from_each_send_to_its_receiver(pipeline_trace):
    events = pipeline_trace["traceEvents"]
    sends = [e for e in spans(pipeline_trace) if e["args"].get("op") == "send"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(sends) == 48 and set(starts) == set(ends) == {e["args"]["task"] for e in sends}
    ranks = {e["args"]["name"].split()[0]: e["pid"] for e in events if e.get("name") == "process_name"}
    for e in sends:
        s, f = starts[e["args"]["task"]], ends[e["args"]["task"]]
        assert (s["pid"], s["tid"], s["ts"]) == (e["pid"], e["tid"], e["ts"])  # bound to the send's slice
        assert f["pid"] == ranks[f"rank{e['args']['to_rank']}"] and f["ts"] >= e["ts"] + e["dur"] - 1e-6
        assert f["bp"] == "e"


def test_gantt_draws_every_send_and_colours_each_pass(pipeline_trace):
    """The Gantt chart drew 2 of 96 pipeline sends (bars under a pixel vanish) in one colour for every pass."""
    pytest.importorskip("matplotlib")
    from dlsim.report.gantt import COLORS, MIN_WIDTH, gantt_figure, timeline_rows
    data = timeline_rows(pipeline_trace, devices=8)
    makespan = data["makespan_s"]
    send_rows = [r for r in data["rows"] if "p2p" in r["label"]]
    sends = sum(len(r["spans"].get("comm", [])) for r in send_rows)
    assert sends == 48 and any(d < MIN_WIDTH * makespan for r in send_rows for _, d in r["spans"]["comm"])
    fig = gantt_figure(pipeline_trace, devices=8)
    ax = fig.axes[0]
    scale = 1e-3 if makespan < 2.0 else 1.0
    drawn = 0
    for collection in ax.collections:
        colour = tuple(round(c, 3) for c in collection.get_facecolor()[0][:3])
        if colour != tuple(round(int(COLORS["comm"][i:i + 2], 16) / 255, 3) for i in (1, 3, 5)):
            continue
        for path in collection.get_paths():
            xs = path.vertices[:, 0]
            assert xs.max() - xs.min() >= MIN_WIDTH * makespan / scale * 0.999
            drawn += 1
    assert drawn >= sends
    legend = {t.get_text() for t in fig.legends[0].get_texts()}
    assert {"forward", "backward", "recomputation"} <= legend
    assert len({COLORS["forward"], COLORS["backward"], COLORS["recompute"]}) == 3
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_slices_of_one_kind_closer_than_the_narrowest_bar_are_one_bar():
    """A pass split into slivers by its collectives is drawn as one bar (so that a widened neighbour of
    another kind cannot hide it); a lone sliver is widened to the narrowest bar; far-apart spans stay apart."""
    from dlsim.report.gantt import MIN_WIDTH, visible
    makespan = 10.0
    least = MIN_WIDTH * makespan  # 0.02 s
    slivers = [(1.0 + 0.001 * i, 0.0005) for i in range(40)]  # 40 slices 0.5 ms apart
    assert visible(slivers, makespan) == [(1.0, pytest.approx(0.0395))]
    assert visible([(5.0, 0.001)], makespan) == [(5.0, least)]
    assert visible([(2.0, 0.5), (3.0, 0.5)], makespan) == [(2.0, 0.5), (3.0, 0.5)]
