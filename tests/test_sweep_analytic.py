"""`dlsim sweep --analytic`: points priced by the analytic evaluator, the simulation where it does not
model a strategy, records naming their engine, resuming across engines without mixing them."""

from __future__ import annotations

import json

import pytest
import yaml

from dlsim.api.analytic import estimate_strategy
from dlsim.api.simulate import simulate
from dlsim.api.sweep import evaluate_point, read_results, run_sweep
from dlsim.cli import run
from dlsim.io.sweep_fields import simulate_fields
from dlsim.io.sweep_spec import parse_sweep

SPEC = {"models": ["gpt2"], "clusters": ["dgx-a100"], "gpus": [8], "global_batch": 32,
        "grid": {"tp": [1, 2], "pp": [1, 2], "compression": ["none", "qsgd"]}}


def _fields(rec):
    """What the sweep passes for `rec`'s point (its grid fields as `dlsim.io.sweep_fields` reads them)."""
    point = rec["point"]
    fields, given = simulate_fields({k: point[k] for k in ("tp", "pp", "compression")})
    return dict(nodes=1, global_batch=point["global_batch"], dp=rec["dp"], given=given, **fields)


def test_analytic_points_are_the_evaluators_and_the_rest_simulated(tmp_path):
    s = parse_sweep(SPEC)
    out = run_sweep(s, tmp_path / "r.jsonl", jobs=1, analytic=True)
    assert out.engine == "analytic" and out.computed == s.size == 8
    assert all(r["status"] == "ok" for r in out.records)
    for rec in out.records:
        fields = _fields(rec)
        if rec["point"]["compression"] == "none":
            assert rec["engine"] == "analytic" and "analytic_refused" not in rec
            assert rec["tolerance"] > 0 and isinstance(rec["approximate"], list)
            assert rec["iteration_time_s"] == estimate_strategy("gpt2", "dgx-a100", **fields)["iteration_time_s"]
        else:
            assert rec["engine"] == "simulation" and "compression" in rec["analytic_refused"]
            assert rec["iteration_time_s"] == simulate("gpt2", "dgx-a100", **fields).iteration_time_s
    assert dict(out.fallbacks) == {"gradient compression is not modelled analytically": 4}


def test_resume_across_engines_prices_again_and_keeps_both(tmp_path):
    s = parse_sweep(SPEC)
    path = tmp_path / "r.jsonl"
    sim = run_sweep(s, path, jobs=1)
    assert {r["engine"] for r in sim.records} == {"simulation"} and sim.other_engine == 0
    ana = run_sweep(s, path, jobs=1, analytic=True)
    assert ana.resumed == 0 and ana.computed == s.size and ana.other_engine == s.size
    assert len(path.read_text().splitlines()) == 2 * s.size
    again = run_sweep(s, path, jobs=1, analytic=True)
    assert again.computed == 0 and again.records == ana.records
    assert read_results(path) == {r["id"]: r for r in sim.records}
    assert read_results(path, engine="analytic") == {r["id"]: r for r in ana.records}
    # a file written before records named their engine: simulated records, resumed by a plain sweep only
    old = tmp_path / "old.jsonl"
    old.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "engine"}) + "\n" for r in sim.records))
    assert run_sweep(s, old, jobs=1).computed == 0
    assert run_sweep(s, old, jobs=1, analytic=True).computed == s.size


def test_a_record_with_an_unknown_engine_is_refused(tmp_path):
    s = parse_sweep(SPEC)
    path = tmp_path / "r.jsonl"
    rec = evaluate_point(next(iter(s.points())), engine="analytic")
    path.write_text(json.dumps({**rec, "engine": "guess"}) + "\n")
    with pytest.raises(Exception) as e:
        run_sweep(s, path, jobs=1, analytic=True)
    assert "engine" in str(e.value) and "line 1" in str(e.value)


def test_cli_sweep_analytic(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    out = tmp_path / "o.jsonl"
    assert run(["sweep", str(spec), "--analytic", "--out", str(out), "--jobs", "1", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "priced analytically" in captured.err
    assert "4 simulated instead: gradient compression is not modelled analytically" in captured.err
    assert "best strategy" in captured.out
    assert run(["sweep", str(spec), "--out", str(out), "--jobs", "1", "--quiet"]) == 0
    assert "8 records of the analytic evaluator in the file kept, not used" in capsys.readouterr().err
