"""`dlsim optimize`: the analytic evaluator against the event simulation on small spaces, the
exhaustive simulated optimum, the no-feasible verdict, the CLI outputs."""

from __future__ import annotations

import csv
import json
from collections import Counter
from dataclasses import replace

import pytest

from dlsim.api.models import as_cluster, as_model
from dlsim.api.optimize import APPROXIMATE_TOLERANCE, EVALUATOR_TOLERANCE, optimize, pareto_front, parse_fix
from dlsim.api.simulate import _default_pricer, simulate
from dlsim.cli import run
from dlsim.errors import InfeasibleError, SpecError
from dlsim.io.kernel_tables import load_kernel_times
from dlsim.plan.evaluate import Evaluator
from dlsim.plan.search import SearchSpace, candidates

SMALL_GPT = {"layers": 4, "hidden": 1024, "heads": 16, "seq_len": 1024, "positions": 1024}

# (profile, nodes, global batch, search options): each a space of at most 500 candidates
SPACES = [
    ("dgx-a100", 1, 32, {"max_microbatch_size": 2}),
    ("dgx-h100", 2, 32, {"max_microbatch_size": 2, "fix": {"schedule": "1f1b"}}),
]


def _space(profile, nodes, batch, opts):
    model = as_model("gpt3-175b", SMALL_GPT)
    cluster = replace(as_cluster(profile), nodes=nodes)
    space = SearchSpace(8 * nodes, batch, cluster.devices_per_node, max_microbatch_size=opts["max_microbatch_size"],
                        fixed=dict(opts.get("fix", {})))
    strategies = list(candidates(model, space, Counter()))
    return model, cluster, strategies


@pytest.fixture(scope="module", params=SPACES, ids=[f"{p}-{n}n" for p, n, _, _ in SPACES])
def simulated_space(request):
    profile, nodes, batch, opts = request.param
    model, cluster, strategies = _space(profile, nodes, batch, opts)
    assert 50 <= len(strategies) <= 500
    tables = load_kernel_times(cluster)[0] if cluster.tables else None
    ev = Evaluator(model, cluster, "fp16", lambda lay, algo: _default_pricer(cluster, lay, algo, True), tables)
    rows = [(s, ev.evaluate(s), simulate(model, cluster, s)) for s in strategies]
    return request.param, model, cluster, rows


def test_evaluator_within_tolerance_of_the_simulation(simulated_space):
    """Every candidate of the space within the tolerance the search relies on: `EVALUATOR_TOLERANCE`
    where the evaluator is exact in composition, `APPROXIMATE_TOLERANCE` where it flags what it does not
    model (here: pipeline transfers contending for the tensor-parallel ports beside prefetched gathers)."""
    _, _, _, rows = simulated_space
    for flagged, limit in ((False, EVALUATOR_TOLERANCE), (True, APPROXIMATE_TOLERANCE)):
        errors = {s: e.iteration_time_s / r.iteration_time_s - 1 for s, e, r in rows if bool(e.approximate) == flagged}
        if errors:
            worst = max(errors, key=lambda s: abs(errors[s]))
            assert abs(errors[worst]) <= limit, (worst, errors[worst])
    assert sum(not e.approximate for _, e, _ in rows) >= len(rows) // 2
    # ZeRO-2/3 are in it: the walk of every pass beside the communication stream is what holds them
    assert sum(s.zero >= 2 for s, _, _ in rows) >= len(rows) // 4


def test_evaluator_memory_matches_or_exceeds_the_simulation(simulated_space):
    """Pruning by the evaluator's memory never drops a candidate the simulation says fits (but ZeRO-3,
    whose gathered units the evaluator counts as the two largest: within 3% below)."""
    _, _, _, rows = simulated_space
    for s, e, r in rows:
        zero3 = s.zero == 3 and s.dp > 1
        assert e.peak_memory_bytes >= r.peak_memory_bytes * (0.97 if zero3 else 1 - 1e-9), s
        assert e.peak_memory_bytes <= r.peak_memory_bytes * (1.10 if zero3 else 1.06), s


def test_optimize_returns_the_exhaustive_simulated_optimum(simulated_space):
    (profile, nodes, batch, opts), model, cluster, rows = simulated_space
    feasible = [(r.iteration_time_s, s) for s, e, r in rows if r.feasible]
    best_time = min(t for t, _ in feasible)
    result = optimize(model, cluster, gpus=8 * nodes, global_batch=batch, top=3,
                      max_microbatch_size=opts["max_microbatch_size"], fix=opts.get("fix"), stack="eager")
    assert result.best.result.iteration_time_s == pytest.approx(best_time, rel=1e-12)
    assert result.enumerated == len(rows)


def test_optimize_memory_objective_and_tight_memory():
    model = as_model("gpt3-175b", SMALL_GPT)
    cluster = as_cluster("dgx-a100")
    full = optimize(model, cluster, gpus=8, global_batch=32, objective="memory", top=3, max_microbatch_size=2)
    # the least memory per device among the simulated; ranked by memory
    mems = [c.result.peak_memory_bytes for c in full.ranked]
    assert mems == sorted(mems)
    limit = 1.2 * full.best.result.peak_memory_bytes / (cluster.device.memory_bytes - cluster.device.memory_reserved)
    tight = optimize(model, cluster, gpus=8, global_batch=32, top=3, max_microbatch_size=2,
                     max_memory_fraction=limit)
    assert tight.dropped.get("out of memory", 0) > 0
    assert all(c.estimate.peak_memory_bytes <= tight.memory_limit_bytes for c in tight.ranked)


def test_record_states_why_pareto_and_assumptions():
    r = optimize(as_model("gpt3-175b", SMALL_GPT), "dgx-a100", gpus=8, global_batch=16, top=3, fix=["tp=2"])
    rec = r.to_dict()
    assert rec["kind"] == "optimize" and rec["dtype"] == "bf16"  # the default stack's precision
    assert rec["stack"]["name"] == "pytorch" and all(c.strategy.stack == "pytorch" for c in r.ranked)
    assert all(row["strategy"]["tp"] == 2 for row in rec["ranked"])
    why = rec["why"]
    assert why["bottleneck"] in ("compute", "recompute", "exposed_comm", "bubble", "idle")
    assert 0 <= why["exposed_comm_share"] <= 1 and 0 <= why["bubble_share"] <= 1
    assert why["memory_headroom_bytes"] > 0 and "trade" in why["runner_up"]
    times = [p["iteration_time_s"] for p in rec["pareto"]]
    mems = [p["peak_memory_bytes"] for p in rec["pareto"]]
    assert times == sorted(times) and mems == sorted(mems, reverse=True)
    for key in ("dtype", "optimizer", "collective", "tensor_parallel", "p2p_overlap"):
        assert key in rec["assumed"]


def test_pareto_front_and_fix_parsing():
    pts = [(1.0, 5.0, "a"), (2.0, 3.0, "b"), (2.5, 4.0, "c"), (3.0, 1.0, "d")]
    assert [p[2] for p in pareto_front(pts)] == ["a", "b", "d"]
    assert parse_fix(["tp=8", "sequence-parallel=true", "schedule=1f1b"]) == {
        "tp": 8, "sequence_parallel": True, "schedule": "1f1b"}
    with pytest.raises(SpecError):
        parse_fix(["tp"])
    with pytest.raises(SpecError):
        parse_fix(["nonsense=1"])


def test_no_feasible_candidate_names_the_limit():
    with pytest.raises(InfeasibleError, match="out of memory.*closest"):
        optimize("gpt3-175b", "dgx-a100", gpus=8, global_batch=16)
    with pytest.raises(InfeasibleError, match="can be built"):
        optimize(as_model("gpt3-175b", SMALL_GPT), "dgx-a100", gpus=8, global_batch=16, fix=["tp=3"])


def test_cli_no_feasible_exits_1_with_one_line(capsys):
    assert run(["optimize", "gpt3-175b", "-c", "dgx-a100", "--gpus", "8", "--global-batch", "16"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "out of memory" in err and "over by" in err
    # pinned degrees that cannot make the device count: the limit and by how much, before any search
    small = ["--set", "layers=4", "--set", "hidden=1024", "--set", "heads=16", "--set", "seq_len=1024"]
    for fix, words in ((["tp=3"], "tp 3) does not divide --gpus 8 (remainder 2)"),
                       (["tp=4", "pp=4"], "tp x pp = 16) does not divide --gpus 8 (remainder 8)"),
                       (["dp=2", "tp=2", "pp=1"], "uses 4 devices, --gpus is 8 (4 left over)")):
        args = ["optimize", "gpt3-175b", *small, "-c", "dgx-a100", "--gpus", "8", "--global-batch", "16"]
        assert run(args + [x for f in fix for x in ("--fix", f)]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err


def test_cli_table_json_csv(tmp_path, capsys):
    args = ["optimize", "gpt3-175b", "--set", "layers=4", "--set", "hidden=1024", "--set", "heads=16", "--set",
            "seq_len=1024", "--set", "positions=1024", "-c", "dgx-a100", "--gpus", "8", "--global-batch", "16",
            "--top", "2", "--max-microbatch-size", "2", "--fix", "pp=1"]
    out_json, out_csv = tmp_path / "opt.json", tmp_path / "opt.csv"
    assert run(args + ["--json", str(out_json), "--csv", str(out_csv)]) == 0
    text = capsys.readouterr().out
    assert "best:" in text and "Pareto front" in text and "bottleneck" in text
    rec = json.loads(out_json.read_text())
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == len(rec["ranked"]) and rows[0]["label"] == rec["best"]["label"]
    # never overwrite without --force
    assert run(args + ["--csv", str(out_csv)]) == 1
    assert run(args + ["--csv", str(out_csv), "--force"]) == 0
    assert run(args + ["--objective", "speed"]) == 1  # not an objective: a usage error, bad input
    assert run(args + ["--objective", "cost"]) == 1  # the whole run's cost needs a token budget (--tokens)


def test_fast_paths_equal_the_slow_ones(simulated_space, monkeypatch):
    """The evaluator's caches, the search's lower-bound pruning and the simulation pool change nothing: a fresh evaluator
    per candidate gives the same estimates, the bound never exceeds the estimate, and optimize with
    pruning returns the same ranking and Pareto front as without, as when the space is small enough to
    be timed whole (`EXHAUSTIVE_CANDIDATES`)."""
    import dlsim.api.optimize as optimize_mod
    (profile, nodes, batch, opts), model, cluster, rows = simulated_space
    tables = load_kernel_times(cluster)[0] if cluster.tables else None

    def fresh():
        return Evaluator(model, cluster, "fp16", lambda lay, algo: _default_pricer(cluster, lay, algo, True), tables)

    shared = fresh()
    for s, e, _ in rows:
        assert shared.lower_bound(s) <= e.iteration_time_s
    for s, e, _ in rows[:: max(1, len(rows) // 12)]:
        alone = fresh().evaluate(s)
        assert alone.iteration_time_s == e.iteration_time_s and alone.memory == e.memory
    kw = dict(gpus=8 * nodes, global_batch=batch, top=3, max_microbatch_size=opts["max_microbatch_size"],
              fix=opts.get("fix"))
    monkeypatch.setattr(optimize_mod, "EXHAUSTIVE_CANDIDATES", 10**6)
    whole = optimize(model, cluster, jobs=1, **kw)
    monkeypatch.setattr(optimize_mod, "EXHAUSTIVE_CANDIDATES", 0)
    fast, slow = optimize(model, cluster, jobs=2, **kw), optimize(model, cluster, prune_bound=False, jobs=1, **kw)
    assert slow.pruned == 0 and fast.pruned > 0 and fast.evaluated + fast.pruned == slow.evaluated
    assert whole.pruned == 0 and whole.evaluated == slow.evaluated
    assert [c.row(1) for c in whole.ranked] == [c.row(1) for c in slow.ranked]
    assert [c.row(1) for c in fast.ranked] == [c.row(1) for c in slow.ranked]
    assert fast.pareto == slow.pareto


def test_parallel_search_equals_one_process(simulated_space, monkeypatch):
    """Sizing and evaluating on forked processes (forced here on a small space) gives exactly the
    evaluations, drops, pruned count and closest miss of one process, for both objectives."""
    import dlsim.plan.search as search_mod
    from dlsim.api.optimize import _prune
    (profile, nodes, batch, opts), model, cluster, rows = simulated_space
    space = SearchSpace(8 * nodes, batch, cluster.devices_per_node, max_microbatch_size=opts["max_microbatch_size"],
                        fixed=dict(opts.get("fix", {})))
    import dlsim.api.optimize as optimize_mod
    monkeypatch.setattr(search_mod, "PARALLEL_MIN_CANDIDATES", 1)
    monkeypatch.setattr(optimize_mod, "EXHAUSTIVE_CANDIDATES", 0)  # pruned, as large spaces are
    for objective in ("time", "memory"):
        out = []
        for jobs in (1, 2):
            ev = Evaluator(model, cluster, "fp16", lambda lay, algo: _default_pricer(cluster, lay, algo, True), None)
            limit = sorted(e.peak_memory_bytes for _, e, _ in rows)[len(rows) // 2]  # half out of memory
            o = search_mod.search(ev, model, space, limit, _prune(objective, 3, ev.capacity), jobs)
            out.append(([(e.strategy, e.iteration_time_s, e.memory) for e in o.evaluations], o.dropped, o.pruned,
                        o.closest_oom, o.enumerated))
        assert out[0][0] and out[0][3] is not None
        assert out[0] == out[1]


def test_cli_plot_writes_a_png(tmp_path):
    out = tmp_path / "pareto.png"
    args = ["optimize", "gpt3-175b", "--set", "layers=4", "--set", "hidden=1024", "--set", "heads=16", "--set",
            "seq_len=1024", "--set", "positions=1024", "-c", "dgx-a100", "--gpus", "8", "--global-batch", "16",
            "--top", "2", "--max-microbatch-size", "2", "--plot", str(out)]
    assert run(args) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    from PIL import Image
    with Image.open(out) as im:
        im.verify()
        assert "Pareto" in im.info.get("Description", "") or "memory per device" in im.info.get("Description", "")
    assert run(args + ["--plot", str(tmp_path / "x.txt")]) != 0


def test_approximate_flags_are_known_before_timing(simulated_space):
    """The search prunes by the tolerance of a candidate not yet timed: `maybe_approximate` must flag
    every candidate whose estimate comes flagged approximate."""
    (profile, nodes, batch, opts), model, cluster, rows = simulated_space
    tables = load_kernel_times(cluster)[0] if cluster.tables else None
    ev = Evaluator(model, cluster, "fp16", lambda lay, algo: _default_pricer(cluster, lay, algo, True), tables)
    assert any(e.approximate for _, e, _ in rows)
    for s, e, _ in rows:
        if e.approximate:
            assert ev.maybe_approximate(s), (s, e.approximate)
    assert ev.maybe_approximate(replace(rows[0][0], offload="optimizer"))


def test_evaluator_tables_equal_the_simulators():
    """The evaluator builds one layer table per micro-batch size and adds each micro-batch count's
    gradient accumulation to it: the same entries as the simulator's table for that count, and one
    stage partition (on the costs without accumulation) shared by every count."""
    from dlsim.cost.memory import grad_accumulation_bytes
    from dlsim.plan.layertable import build_layer_table, with_grad_accumulation
    model, cluster = as_model("gpt3-175b", SMALL_GPT), as_cluster("dgx-a100")
    ev = Evaluator(model, cluster, "fp16", lambda lay, algo: _default_pricer(cluster, lay, algo, True), None)
    base = build_layer_table(model, cluster.device, "fp16", batch=2, tp=2, sequence_parallel=True)
    for m in (1, 4):
        acc = grad_accumulation_bytes("autograd", "fp16", m)
        got = ev.table(2, True, 2, accumulation=acc)
        assert got.entries == with_grad_accumulation(base, cluster.device, acc)
        assert got.costs == [e.forward.seconds + e.backward.seconds for e in base]
        for a, b in zip(got.entries, base):  # every other field the base entry's
            assert a == replace(b, backward=a.backward, backward_weight=a.backward_weight)
        assert (got.entries != base) == (acc > 0)
    assert ev.table(2, True, 2, accumulation=acc).entries != ev.table(2, True, 2).entries
    assert ev.table(2, True, 2, accumulation=acc).key == ev.table(2, True, 2).key


def test_memory_floor_skips_only_what_cannot_matter(simulated_space):
    """The search drops a candidate by `memory_floor` without its exact memory only when it is over the
    limit and no closer to it than the closest miss: the floor never exceeds the exact peak, and the
    closest miss is the exhaustive one."""
    from dlsim.plan.search import search
    (profile, nodes, batch, opts), model, cluster, rows = simulated_space
    tables = load_kernel_times(cluster)[0] if cluster.tables else None
    ev = Evaluator(model, cluster, "fp16", lambda lay, algo: _default_pricer(cluster, lay, algo, True), tables)
    for s, e, _ in rows:
        assert ev.memory_floor(s) <= e.peak_memory_bytes
    big, a100 = as_model("gpt3-175b"), as_cluster("dgx-a100")
    ev = Evaluator(big, a100, "fp16", lambda lay, algo: _default_pricer(a100, lay, algo, True))
    space = SearchSpace(8, 16, 8)
    out = search(ev, big, space, ev.capacity)
    assert not out.evaluations and out.dropped["out of memory"] == out.enumerated
    exhaustive = min(max(x.total for x in ev.memory(s)) for s in candidates(big, space, Counter()))
    assert out.closest_oom[0] == exhaustive
