"""`dlsim sweep` with compression, variability and synchronisation modes in its grid: values checked
once with one-line errors, a field kept only on the points it means something for, and every point
the same simulation `simulate()` runs with the strategy records."""

from __future__ import annotations

import json

import pytest
import yaml

from dlsim.api.simulate import simulate
from dlsim.api.sweep import evaluate_point, run_sweep
from dlsim.errors import SpecError
from dlsim.io.sweep_spec import parse_sweep
from dlsim.spec.strategy import Compression, Variability

BASE = {"models": ["gpt2"], "clusters": ["dgx-h100"], "gpus": [8], "global_batch": 64,
        "fixed": {"microbatch_size": 8}}


def _varying(point) -> dict:
    return {k: v for k, v in point.fields if k != "microbatch_size"}


def test_compression_grid_keeps_each_parameter_on_its_compressor():
    spec = parse_sweep({**BASE, "grid": {"compression": ["none", "1bit", "qsgd", "topk"], "compression_bits": [2, 8],
                                         "compression_density": [0.01, 0.1]}})
    assert spec.size == 16  # the cross product, before fields that do not apply are dropped
    assert [_varying(p) for p in spec.points()] == [
        {"compression": "none"}, {"compression": "1bit"},
        {"compression": "qsgd", "compression_bits": 2}, {"compression": "qsgd", "compression_bits": 8},
        {"compression": "topk", "compression_density": 0.01}, {"compression": "topk", "compression_density": 0.1}]


def test_each_point_is_the_simulation_simulate_runs():
    spec = parse_sweep({**BASE, "grid": {"compression": ["qsgd", "topk"], "compression_bits": [2],
                                         "compression_density": [0.05], "jitter_cv": [0.0, 0.1],
                                         "straggler_fraction": [0.25]},
                        "fixed": {"microbatch_size": 8, "jitter": "lognormal", "straggler_slowdown": 2.0, "seed": 3}})
    points = list(spec.points())
    assert len(points) == 4
    seen = set()
    for p in points:
        rec = evaluate_point(p)
        assert rec["status"] == "ok", rec["reason"]
        f = dict(p.fields)
        comp = Compression(kind=f["compression"], **({"bits": 2} if f["compression"] == "qsgd" else {"density": 0.05}))
        var = Variability(jitter=f.get("jitter", "none"), jitter_cv=f.get("jitter_cv", 0.0),
                          straggler_fraction=0.25, straggler_slowdown=2.0, seed=3)
        sim = simulate("gpt2", "dgx-h100", dp=8, microbatch_size=8, global_batch=64, compression=comp, variability=var)
        assert rec["iteration_time_s"] == sim.iteration_time_s
        seen.add(rec["iteration_time_s"])
    assert len(seen) == 4  # the compressor and the jitter each change the time


def test_sync_grid_keeps_staleness_on_ssp_and_server_fields_on_parameter_servers(tmp_path):
    spec = parse_sweep({**BASE, "grid": {"sync": ["allreduce", "ps", "ssp"], "staleness": [1, 4],
                                         "compression": ["none", "1bit"]},
                        "fixed": {"microbatch_size": 8, "iterations": 6}})
    got = sorted(json.dumps(_varying(p), sort_keys=True) for p in spec.points())
    want = sorted(json.dumps(d, sort_keys=True) for d in (
        {"sync": "allreduce", "compression": "none"}, {"sync": "allreduce", "compression": "1bit"},
        {"sync": "ps", "iterations": 6}, {"sync": "ssp", "staleness": 1, "iterations": 6},
        {"sync": "ssp", "staleness": 4, "iterations": 6}))
    assert got == want
    out = run_sweep(spec, tmp_path / "r.jsonl", jobs=1)
    by = {json.dumps(_varying(p), sort_keys=True): r for p, r in zip(spec.points(), out.records)}
    assert all(r["status"] == "ok" for r in out.records), [r["reason"] for r in out.records]
    ssp = by[json.dumps({"sync": "ssp", "staleness": 1, "iterations": 6}, sort_keys=True)]
    sim = simulate("gpt2", "dgx-h100", dp=8, microbatch_size=8, global_batch=64, sync="ssp", staleness=1,
                   iterations=6)
    assert ssp["throughput_samples_per_s"] == sim.throughput_samples_per_s and ssp["updates"] == sim.updates


@pytest.mark.parametrize("grid, line", [
    ({"compression": ["none", "qsgd"], "compression_bits": [4, 17]},
     "s.yaml: grid.compression_bits[1]: must be an integer in [1, 16], got 17"),
    ({"compression": ["none", "zip"]}, "s.yaml: grid.compression[1]: unknown value 'zip' (use none, fp16, qsgd, topk, 1bit)"),
    ({"compression": ["qsgd"], "compression_bits": [2.5]}, "s.yaml: grid.compression_bits[0]: must be an integer, got 2.5"),
    ({"compression": ["topk"], "compression_density": [0]},
     "s.yaml: grid.compression_density[0]: must be a number in (0, 1], got 0"),
    ({"compression_density": [0.1]},
     "s.yaml: grid.compression_density: applies to compression topk only, and no point has it (compression: none)"),
    ({"jitter": ["normal"], "jitter_cv": [-1]}, "s.yaml: grid.jitter_cv[0]: must be a number in [0.0, 10.0], got -1"),
    ({"jitter_cv": [0.1]}, "s.yaml: grid.jitter_cv: no point uses it: it needs a jitter distribution in the grid or fixed"),
    ({"straggler_fraction": [0.1], "straggler_slowdown": [0.5]},
     "s.yaml: grid.straggler_slowdown[0]: must be a number >= 1, got 0.5"),
    ({"seed": [1]}, "s.yaml: grid.seed: no point uses it: it needs jitter or stragglers in the grid or fixed"),
    ({"staleness": [1, 2]}, "s.yaml: grid.staleness: applies to sync ssp only, and no point has it (sync: allreduce)"),
    ({"sync": ["ps"], "compression": ["1bit"]},
     "s.yaml: grid.compression: applies to sync allreduce only, and no point has it (sync: ps)"),
])
def test_bad_fields_are_one_line(grid, line):
    with pytest.raises(SpecError) as e:
        parse_sweep({**BASE, "grid": grid}, "s.yaml")
    assert str(e.value) == line


def test_cli_sweep_of_a_compression_study(cli, tmp_path):
    spec = tmp_path / "comp.yaml"
    spec.write_text(yaml.safe_dump({**BASE, "grid": {"compression": ["none", "qsgd"], "compression_bits": [2, 8]}}))
    code, out, err = cli("sweep", spec, "--jobs", "1")
    assert code == 0, err
    assert "3 points: ok 3" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**BASE, "grid": {"compression": ["qsgd"], "compression_bits": [True]}}))
    code, out, err = cli("sweep", bad, "--jobs", "1")
    assert code == 1 and err.strip() == f"error: {bad}: grid.compression_bits[0]: must be an integer, got True"
