"""Trace output: gzip (Perfetto opens .json.gz), rank and time-window filters (issue 16)."""

import gzip
import json

import pytest

from dlsim.errors import SpecError
from dlsim.plan.comm import Layout
from dlsim.sim.tracefilter import TraceFilter, kept_devices, parse_ranks, parse_window

GPT = ["--set", "layers=4", "--set", "hidden=256", "--set", "heads=4", "--set", "seq_len=128", "--set", "vocab=1024"]
RUN = ["simulate", "gpt2", "--cluster", "dgx-h100", "--dp", "2", "--tp", "2", "--pp", "2",
       "--microbatch-size", "1", "--num-microbatches", "2", *GPT]


def _spans(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_parse_ranks_merges_and_bounds():
    assert parse_ranks("0-7,64") == ((0, 7), (64, 64))
    assert parse_ranks(" 5, 0-3 ,4,10-12") == ((0, 5), (10, 12))
    assert parse_ranks([3, 1, 2]) == ((1, 3),)
    for bad in ("", "a", "7-3", "-1", "0-99999999", ",".join(["1"] * 5000), "1.5"):
        with pytest.raises(SpecError):
            parse_ranks(bad)


def test_parse_window_units():
    assert parse_window("2s:3s") == (2.0, 3.0)
    assert parse_window("0:500ms") == (0.0, pytest.approx(0.5))
    assert parse_window("100ms:")[1] == float("inf")
    assert parse_window(":1") == (0.0, 1.0)
    for bad in ("1s", "3s:2s", "1s:1s", "1x:2s", "a:b:c", "-1s:2s", "nan:1"):
        with pytest.raises(SpecError):
            parse_window(bad)


def test_kept_devices_follow_symmetry():
    class Dev:
        def __init__(self, rank, stage):
            self.rank, self.stage = rank, stage

    class Graph:
        pass

    lay = Layout(dp=4, tp=2, pp=2, devices_per_node=8)
    g = Graph()
    g.devices = [Dev(0, 0), Dev(8, 1)]  # symmetry: one device per stage stands for its 8 ranks
    assert kept_devices(g, lay, TraceFilter(ranks=parse_ranks("5")), False, False) == {0}
    assert kept_devices(g, lay, TraceFilter(ranks=parse_ranks("9-10")), False, False) == {1}
    assert kept_devices(g, lay, TraceFilter(ranks=parse_ranks("100")), False, False) == set()
    g.devices = [Dev(lay.rank(d, t, s), s) for s in range(2) for d in range(4) for t in range(2)]  # --full
    assert kept_devices(g, lay, TraceFilter(ranks=parse_ranks("0-1,9")), True, True) == {0, 1, 9}
    # replicas explicit, tp ranks folded: rank 3 (dp1 tp1) is shown by the dp1 tp0 device
    g.devices = [Dev(lay.rank(d, 0, s), s) for s in range(2) for d in range(4)]
    assert kept_devices(g, lay, TraceFilter(ranks=parse_ranks("3")), True, False) == {1}


def test_gzip_trace_is_the_plain_trace(cli, tmp_path):
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    for path in (plain, packed):
        code, _, err = cli(*RUN, "--full", "--trace", str(path))
        assert code == 0, err
    assert packed.read_bytes()[:2] == b"\x1f\x8b"
    assert json.loads(gzip.decompress(packed.read_bytes())) == json.loads(plain.read_text())
    assert packed.stat().st_size < plain.stat().st_size / 4


def test_rank_and_window_filters(cli, tmp_path):
    full, part = tmp_path / "full.json", tmp_path / "part.json.gz"
    assert cli(*RUN, "--full", "--trace", str(full))[0] == 0
    whole = json.loads(full.read_text())
    end = whole["otherData"]["makespan_s"]
    code, _, err = cli(*RUN, "--full", "--trace", str(part), "--trace-ranks", "0-1,5",
                       "--trace-window", f"{end / 4 * 1e3}ms:{end / 2}s")
    assert code == 0, err
    trace = json.loads(gzip.decompress(part.read_bytes()))
    spans = _spans(trace)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"rank0 (dp0 tp0 pp0)", "rank1 (dp0 tp1 pp0)", "rank5 (dp0 tp1 pp1)", "links"}
    links_pid = 9  # process ids from 1: rank r is process r + 1, the links the last
    assert spans and {e["pid"] for e in spans} <= {1, 2, 6, links_pid}
    assert all(e["ts"] <= end / 2 * 1e6 + 1e-6 and e["ts"] + e["dur"] >= end / 4 * 1e6 - 1e-6 for e in spans)
    assert len(spans) < len(_spans(whole)) / 4
    assert trace["otherData"]["filter"]["ranks"] == [[0, 1], [5, 5]]
    assert trace["otherData"]["filter"]["window_s"] == pytest.approx([end / 4, end / 2])
    ports = {e["tid"] for e in spans if e["pid"] == links_pid}
    named = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "thread_name" and e["pid"] == links_pid}
    assert ports <= set(named) and all(n.startswith(("rank0", "rank1", "rank5")) for n in named.values())


def test_filters_need_a_trace(cli):
    code, _, err = cli(*RUN, "--trace-ranks", "0")
    assert code == 1 and "--trace" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli(*RUN, "--trace", "x.json", "--trace-window", "2s:1s")
    assert code == 1 and "before it starts" in err
