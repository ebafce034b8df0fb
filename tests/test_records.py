"""Records say what was run (issue 16): every command's record names its dtype (never null) and
lists under ``assumed`` every default that was filled in; options a mode would ignore are refused."""

from __future__ import annotations

import json

import pytest

BENCH = """layer,pass,microbatch_size,algorithm,time_s,workspace_bytes
conv1,forward,2,fast,0.5,200
conv1,forward,1,fast,0.25,100
conv1,forward,2,slow,2.0,0
conv1,forward,1,slow,1.0,0
"""


def _record(cli, *args):
    code, out, err = cli(*args, "--json")
    assert code == 0, err
    rec = json.loads(out)
    assert '"dtype": null' not in out
    return rec


def test_simulate_names_dtype_and_defaults(cli):
    rec = _record(cli, "simulate", "gpt2", "-c", "dgx-h100")
    assert rec["dtype"] == rec["strategy"]["dtype"] == "bf16"  # the default stack's precision (dlsim stacks)
    assert rec["stack"]["name"] == "pytorch" and rec["stack"]["chosen"] == "default"
    a = rec["assumed"]
    assert not {"dtype", "optimizer", "recompute", "fused_kernels"} & set(a)  # the stack's, named in rec["stack"]
    assert a["dp"] == 1 and a["model_only"] is False and a["collective"] == "auto"
    rec = _record(cli, "simulate", "gpt2", "-c", "dgx-h100", "--stack", "eager")
    a = rec["assumed"]
    assert rec["dtype"] == "fp32" and a["dtype"] == "fp32" and a["zero"] == 0  # eager names no dtype: the model's
    assert "iterations" not in a and "staleness" not in a  # another mode's defaults are no assumption of this run
    rec = _record(cli, "simulate", "gpt2", "-c", "dgx-h100", "--dtype", "bf16", "--dp", "2", "--optimizer", "sgd")
    assert rec["dtype"] == "bf16" and "dtype" not in rec["assumed"] and "dp" not in rec["assumed"]
    assert "optimizer" not in rec["assumed"]


def test_simulate_summary_says_the_precision(cli):
    code, out, _ = cli("simulate", "gpt2", "-c", "dgx-h100", "--stack", "eager")
    assert code == 0 and "precision fp32 (the model's dtype" in out
    code, out, _ = cli("simulate", "gpt2", "-c", "dgx-h100", "--dtype", "bf16")
    assert "precision bf16, optimizer adam" in out


def test_strategy_file_fields_are_given(cli, tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("dp: 2\nrecompute: full\nbucket_size_mib: 10\n")
    rec = _record(cli, "simulate", "gpt2", "-c", "dgx-h100", "--strategy", f)
    assert not {"dp", "recompute", "bucket_size_bytes"} & set(rec["assumed"])
    assert rec["assumed"]["collective"] == "auto" and "zero" not in rec["assumed"]  # zero: the stack's
    assert rec["stack"]["overridden"] == ["bucket_size_bytes", "recompute"]


def test_parameter_server_record(cli):
    rec = _record(cli, "simulate", "lenet5", "-c", "dgx-h100", "--dp", "2", "--sync", "ps", "--iterations", "3",
                  "--stack", "eager")
    assert rec["kind"] == "async_simulation" and rec["dtype"] == "fp32" and rec["assumed"]["dtype"] == "fp32"
    assert rec["staleness_max"] == 0  # BSP
    assert "bucket_size_bytes" not in rec["assumed"] and "iterations" not in rec["assumed"]


def test_estimate_and_model_show(cli):
    rec = _record(cli, "estimate", "gpt2", "-c", "dgx-h100")
    assert rec["dtype"] == "fp32" and rec["assumed"]["dtype"] == "fp32"
    assert rec["assumed"]["batch"] == 32 and rec["assumed"]["optimizer"] == "adam"
    rec = _record(cli, "estimate", "gpt2", "-c", "dgx-h100", "--batch", "4", "--dtype", "bf16", "--optimizer", "sgd")
    assert not {"batch", "dtype", "optimizer"} & set(rec["assumed"])
    code, out, _ = cli("estimate", "gpt2", "-c", "dgx-h100")
    assert "defaults: batch 32, dtype fp32 (the model's), optimizer adam" in out.splitlines()[0]
    rec = _record(cli, "model", "show", "gpt2")
    assert rec["dtype"] == "fp32" and rec["assumed"] == {"batch": 1, "dtype": "fp32"}


def test_comm_and_plan_microbatch(cli, tmp_path):
    rec = _record(cli, "comm", "allreduce", "--size", "1MB", "--ranks", "8", "-c", "dgx-h100")
    assert rec["dtype"].startswith("any") and rec["assumed"] == {"algorithm": "auto", "model": "auto"}
    rec = _record(cli, "comm", "allreduce", "--sweep", "1KB:1MB", "--ranks", "8", "-c", "dgx-h100")
    assert rec["dtype"].startswith("any")
    rec = _record(cli, "plan", "microbatch", "alexnet", "-c", "dgx1-p100", "--batch", "8")
    assert rec["dtype"] == "fp32" and rec["assumed"]["dtype"] == "fp32" and rec["assumed"]["policy"] == "powerOfTwo"
    bench = tmp_path / "b.csv"
    bench.write_text(BENCH)
    rec = _record(cli, "plan", "microbatch", "--bench-table", bench, "--batch", "2")
    assert rec["dtype"].startswith("as in the benchmark table") and rec["assumed"]["workspace_limit"] == "64MiB"


@pytest.mark.parametrize("args, field", [
    (["--compression-density", "0.1"], "compression.density"),
    (["--compression", "qsgd", "--compression-density", "0.1"], "compression.density"),
    (["--compression", "topk", "--compression-bits", "4"], "compression.bits"),
    (["--iterations", "3"], "iterations"),
    (["--ps-shards", "2"], "ps_shards"),
    (["--staleness", "1", "--sync", "ps"], "staleness"),
    (["--sync", "async", "--bucket-size", "1MB"], "bucket_size"),
    (["--sync", "async", "--compression", "fp16"], "compression"),
    (["--sync", "ps", "--no-overlap"], "overlap"),
    (["--straggler-slowdown", "2"], "straggler_slowdown"),
    (["--straggler-fraction", "0.5"], "straggler_fraction"),
    (["--jitter-cv", "0.1"], "jitter_cv"),
    (["--jitter", "normal"], "jitter"),
    (["--seed", "3"], "seed"),
    (["--recompute-layers", "2"], "recompute_layers"),
    (["--tp-async-backward"], "tp_async_backward"),
    (["--tp-comm-overlap"], "tp_comm_overlap"),
    (["--workspace-limit", "1MB"], "workspace_limit"),
    (["--expand-collectives"], "expand_collectives"),
    (["--sync", "ssp", "--trace", "t.json"], "trace"),
    (["--nodes", "99999999999999999999999"], "nodes"),
    (["--sync", "ssp", "--staleness", "99999999999999999999999"], "staleness"),
])
def test_options_outside_their_mode_are_refused(cli, tmp_path, monkeypatch, args, field):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("simulate", "lenet5", "-c", "dgx-h100", "--dp", "2", *args)
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and f"{field}:" in err
    assert not (tmp_path / "t.json").exists()


def test_options_in_their_mode_work(cli):
    for args in (["--sync", "ssp", "--staleness", "1", "--iterations", "3", "--ps-shards", "2"],
                 ["--compression", "topk", "--compression-density", "0.1"],
                 ["--jitter", "normal", "--jitter-cv", "0.1", "--seed", "3"],
                 ["--straggler-fraction", "0.5", "--straggler-slowdown", "2"],
                 ["--sync", "async", "--straggler-fraction", "0.5", "--straggler-slowdown", "2", "--iterations", "3"]):
        code, _, err = cli("simulate", "lenet5", "-c", "dgx-h100", "--dp", "2", *args)
        assert code == 0, (args, err)


def test_strategy_file_options_outside_their_mode(cli, tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("dp: 2\niterations: 5\n")
    code, _, err = cli("simulate", "lenet5", "-c", "dgx-h100", "--strategy", f)
    assert code == 1 and "iterations:" in err
    f.write_text("dp: 2\ncompression: {kind: qsgd, density: 0.1}\n")
    code, _, err = cli("simulate", "lenet5", "-c", "dgx-h100", "--strategy", f)
    assert code == 1 and "compression.density:" in err


@pytest.mark.parametrize("args, field", [
    (["allreduce", "--shards", "2"], "shards"),
    (["allreduce", "--fanout", "2"], "fanout"),
    (["broadcast", "--inter-algorithm", "ring"], "inter_algorithm"),
    (["allreduce", "--model", "hockney", "--overhead", "1us"], "model"),
])
def test_comm_parameters_outside_their_algorithm_are_refused(cli, args, field):
    code, _, err = cli("comm", *args, "--size", "1MB", "--ranks", "8", "--latency", "5us", "--bandwidth", "10GB/s")
    assert code == 1 and err.startswith(f"error: {field}:")
    code, _, err = cli("comm", "gossip", "--fanout", "2", "--size", "1MB", "--ranks", "8", "--latency", "5us",
                       "--bandwidth", "10GB/s")
    assert code == 0, err


@pytest.mark.parametrize("value", ["nan", "2", "-0.1", "'x'", "true"])
def test_dropout_probability_is_checked(cli, value):
    code, _, err = cli("model", "show", "alexnet", "--set", f"dropout={value}")
    assert code == 1 and "'drop6'.p:" in err


def test_example_strategy_files_load():
    from pathlib import Path

    from dlsim.api.simulate import as_strategy
    files = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))
    assert len(files) >= 3
    for f in files:
        assert "dlsim simulate" in f.read_text()
        as_strategy(f, {})
