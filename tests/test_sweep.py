"""`dlsim sweep`: spec validation, resumable results, the process pool, Dask, SIGKILL and restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dlsim.api.sweep import evaluate_point, read_results, reason_kind, run_sweep, summarize
from dlsim.cli import run
from dlsim.errors import SpecError
from dlsim.io.sweep_spec import load_sweep, parse_sweep

SMALL = {"models": ["lenet5", "gpt2"], "clusters": ["dgx-a100"], "gpus": [8, 16], "global_batch": 32,
         "grid": {"tp": [1, 2, 3], "pp": [1, 2], "microbatch_size": [1, 2]}}


def _strip(records):
    return sorted(json.dumps(r, sort_keys=True) for r in records)


def test_spec_points_and_stable_ids():
    s = parse_sweep(SMALL)
    pts = list(s.points())
    assert s.size == len(pts) == 2 * 2 * 3 * 2 * 2
    assert len({p.id for p in pts}) == len(pts)
    reordered = dict(SMALL, models=["gpt2", "lenet5"], grid={"pp": [2, 1], "microbatch_size": [2, 1], "tp": [3, 2, 1]})
    assert {p.id for p in parse_sweep(reordered).points()} == {p.id for p in pts}
    assert not {p.id for p in parse_sweep(dict(SMALL, model_only=True)).points()} & {p.id for p in pts}


@pytest.mark.parametrize("change, field", [
    ({"models": []}, "models"),
    ({"gpus": [8, 0]}, "gpus[1]"),
    ({"grid": {"tp": ["two"]}}, "grid.tp[0]"),
    ({"grid": {"tpp": [1]}}, "grid.tpp"),
    ({"fixed": {"dp": 2}}, "fixed.dp"),
    ({"grid": {"tp": [1, 2]}, "fixed": {"tp": 1}}, "grid.tp"),
    ({"max_points": 10}, "grid"),
    ({"colour": 1}, "colour"),
])
def test_spec_errors_name_the_field(change, field):
    with pytest.raises(SpecError) as e:
        parse_sweep({**SMALL, **change}, "s.yaml")
    assert e.value.field == field and "\n" not in str(e.value)


def test_pool_equals_in_process_and_resume_skips(tmp_path):
    s = parse_sweep(SMALL)
    a = run_sweep(s, tmp_path / "a.jsonl", jobs=1)
    b = run_sweep(s, tmp_path / "b.jsonl", jobs=2, chunk=3)
    assert a.backend == "in process" and b.backend.startswith("process pool")
    assert _strip(a.records) == _strip(b.records)
    statuses = {r["status"] for r in a.records}
    assert "ok" in statuses and "infeasible" in statuses  # tp=3 divides neither 8 GPUs nor 12 heads
    again = run_sweep(s, tmp_path / "b.jsonl", jobs=2)
    assert again.computed == 0 and again.resumed == s.size
    assert len((tmp_path / "b.jsonl").read_text().splitlines()) == s.size
    summ = summarize(s, a.records)
    assert {(r["model"], r["gpus"]) for r in summ["best"]} == {(m, g) for m in ("lenet5", "gpt2") for g in (8, 16)}
    assert sum(summ["infeasible_by_reason"].values()) == sum(1 for r in a.records if r["status"] != "ok")


def test_truncated_last_line_is_dropped_and_repeated_once(tmp_path):
    s = parse_sweep(SMALL)
    out = tmp_path / "r.jsonl"
    run_sweep(s, out, jobs=1)
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:10]) + lines[10][:25])  # a torn write
    assert len(read_results(out)) == 10
    r = run_sweep(s, out, jobs=1)
    assert r.resumed == 10 and r.computed == s.size - 10
    ids = [json.loads(x)["id"] for x in out.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == s.size


def test_dask_local_cluster_gives_the_pool_results(tmp_path):
    pytest.importorskip("dask.distributed")
    s = parse_sweep(SMALL)
    pool = run_sweep(s, tmp_path / "pool.jsonl", jobs=2)
    dask = run_sweep(s, tmp_path / "dask.jsonl", dask_local=2, chunk=4)
    assert dask.backend.startswith("dask local")
    assert _strip(dask.records) == _strip(pool.records)


def test_sigkill_then_restart_loses_and_repeats_nothing(tmp_path):
    spec = dict(SMALL, gpus=[8, 16, 32, 64], global_batch=[32, 64], grid={**SMALL["grid"], "recompute": ["none", "selective"]})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    total = load_sweep(path).size
    out = tmp_path / "killed.jsonl"
    cmd = [sys.executable, "-m", "dlsim", "sweep", str(path), "--out", str(out), "--jobs", "2"]
    env = {**os.environ, "DLSIM_PROGRESS": "0"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= total // 4:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the parent and its pool workers, with no chance to clean up
    proc.wait()
    before = out.read_bytes()
    kept = before[:before.rfind(b"\n") + 1]
    n_before = kept.count(b"\n")
    assert 0 < n_before < total
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{n_before} resumed, {total - n_before} simulated" in done.stderr
    after = out.read_bytes()
    assert after.startswith(kept)  # nothing written before the kill was lost or rewritten
    ids = [json.loads(x)["id"] for x in after.splitlines()]
    assert len(ids) == len(set(ids)) == total
    clean = tmp_path / "clean.jsonl"
    run_sweep(load_sweep(path), clean, jobs=1)
    assert _strip(json.loads(x) for x in after.splitlines()) == _strip(json.loads(x) for x in clean.read_text().splitlines())


def test_cli_table_csv_plot_and_bad_spec(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(dict(SMALL, models=["lenet5"], gpus=[8])))
    assert run(["sweep", str(path), "--out", str(tmp_path / "o.jsonl"), "--jobs", "1",
                "--summary", str(tmp_path / "s.csv"), "--plot", str(tmp_path / "s.png")]) == 0
    out = capsys.readouterr().out
    assert "best strategy" in out and "lenet5" in out
    assert (tmp_path / "s.csv").read_text().startswith("model,cluster,gpus")
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [lenet5]\nclusters: [dgx-a100]\nglobal_batch: 8\ngrid: {tp: [x]}\n")
    assert run(["sweep", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "grid.tp[0]" in err and err.count("\n") == 1
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("models: [no-such-model]\nclusters: [dgx-a100]\nglobal_batch: 8\n")
    assert run(["sweep", str(unknown), "--out", str(tmp_path / "u.jsonl")]) == 1
    err = capsys.readouterr().err
    assert "no-such-model" in err and err.count("\n") == 1
    assert run(["sweep", str(path), "--scheduler", "tcp://127.0.0.1:1", "--dask-local", "2"]) == 1


def test_results_never_go_into_an_input(tmp_path, capsys):
    """--out naming the spec, or a file of a profile directory it sweeps, is refused in one line
    (results are appended, so --force does not apply) and the input is left as it was."""
    import shutil
    profile = tmp_path / "prof"
    shutil.copytree(Path(__file__).resolve().parent.parent / "hardware_profiles" / "dgx-a100", profile)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(dict(SMALL, models=["lenet5"], clusters=[str(profile)], gpus=[8])))
    for target in (path, profile / "profile.yaml"):
        before = target.read_bytes()
        assert run(["sweep", str(path), "--out", str(target), "--jobs", "1", "--force"]) == 1
        err = capsys.readouterr().err
        assert "is an input of this run" in err and err.count("\n") == 1
        assert target.read_bytes() == before


def test_reason_kind_groups_alike():
    assert reason_kind("tp x pp = 3 x 1 = 3 does not divide 8 GPUs (remainder 2)") == \
        reason_kind("tp x pp = 3 x 2 = 6 does not divide 16 GPUs (remainder 4)")


def test_example_sweep_spec_loads():
    s = load_sweep(Path(__file__).resolve().parents[1] / "examples" / "sweeps" / "gpt2-llama3-8b.yaml")
    assert s.size == 288 and s.models == ("gpt2", "llama3-8b")


@pytest.mark.parametrize("engine", ["simulation", "analytic"])
def test_kept_builders_change_no_result(engine):
    """A worker's kept scenario builders (measured tables, layer tables, remembered comm prices, the
    evaluator) give every point the record a fresh builder gives, in any order."""
    s = parse_sweep(SMALL)
    pts = list(s.points())
    plain = [evaluate_point(p, memo=False, engine=engine) for p in pts]
    memo = [evaluate_point(p, memo=True, engine=engine) for p in pts] + \
        [evaluate_point(p, memo=True, engine=engine) for p in reversed(pts)]
    assert _strip(plain + plain) == _strip(memo)
