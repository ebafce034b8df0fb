"""What a planner reads (issue 34): tokens/s and TFLOP/s per GPU, warnings for a wasteful strategy, a
cluster sized to the strategy, pipelined micro-batches from a global batch, identical candidates
collapsed, the winner saved as a strategy file that reads back to the same prediction."""

from __future__ import annotations

import json

import pytest

from dlsim.api.optimize import optimize
from dlsim.api.simulate import simulate
from dlsim.cli import run
from dlsim.spec.strategy import PIPELINED_MICROBATCH, make_strategy

SMALL = {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 512, "positions": 512}


def test_tokens_per_second_and_tflops_per_gpu():
    r = simulate("gpt2", "dgx-h100", overrides=SMALL, dp=2, global_batch=8)
    d = r.to_dict()
    assert d["tokens_per_s"] == pytest.approx(8 * 512 / r.iteration_time_s, rel=1e-12)
    assert d["model_tflops_per_gpu"] == pytest.approx(r.flops_per_iteration / r.iteration_time_s / 2 / 1e12, rel=1e-12)
    assert d["model_flops_utilisation"] == pytest.approx(d["model_tflops_per_gpu"] * 1e12 / r.peak_flops, rel=1e-12)
    assert simulate("resnet18", "dgx-h100", microbatch_size=2).to_dict()["tokens_per_s"] is None  # no tokens


def test_a_pipelined_strategy_given_only_a_global_batch_runs_small_micro_batches():
    s = make_strategy(dp=2, pp=4, global_batch=64)
    assert (s.microbatch_size, s.num_microbatches) == (PIPELINED_MICROBATCH, 32)
    assert (make_strategy(dp=2, global_batch=64).microbatch_size, make_strategy(dp=2, global_batch=64).num_microbatches) \
        == (32, 1)
    rec = simulate("gpt2", "dgx-h100", overrides=SMALL, pp=2, global_batch=16).to_dict()
    assert rec["strategy"]["num_microbatches"] == 16 and "micro-batches of 1 sample" in rec["assumed"]["microbatch_size"]


def test_wasteful_strategies_are_called_out(capsys):
    assert run(["simulate", "gpt2", "-c", "dgx-h100", "--set", "layers=8", "--pp", "8", "--global-batch", "1",
                "--microbatch-size", "1"]) == 0
    out = capsys.readouterr().out
    assert "warning: the pipeline bubble is" in out and "warning: model FLOPs utilisation" in out
    assert run(["simulate", "gpt2", "-c", "dgx-h100", "--set", "layers=2", "--dp", "8", "--global-batch", "64"]) == 0
    assert "warning" not in capsys.readouterr().out


def test_the_cluster_is_sized_to_the_strategy_and_says_so():
    r = simulate("gpt2", "dgx-h100", overrides=SMALL, dp=512, global_batch=512)  # the profile lists 32 nodes
    assert r.total_devices == 512
    assert any("cluster sized to the strategy: 64 nodes" in n for n in r.notes)


def test_optimize_collapses_candidates_that_ran_alike():
    """Selective recomputation recomputes the attention core, which flash attention does not keep:
    with the default stack the two candidates are one (listed as its equivalent)."""
    r = optimize("gpt2", "dgx-h100", gpus=8, global_batch=16, overrides=SMALL, max_microbatch_size=2, top=4, jobs=1)
    times = [(c.time_s, c.memory_bytes) for c in r.ranked]
    assert len(times) == len(set(times))
    assert any(any("rc-sel" in e for e in c.equivalents) for c in r.ranked)


def test_save_best_writes_a_strategy_that_reads_back_to_the_same_prediction(tmp_path, capsys):
    path = tmp_path / "best.yaml"
    args = ["optimize", "gpt2", "-c", "dgx-h100", "--set", "layers=2", "--gpus", "8", "--global-batch", "16",
            "--max-microbatch-size", "2", "--jobs", "1"]
    assert run(args + ["--save-best", str(path), "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert run(["simulate", "gpt2", "-c", "dgx-h100", "--set", "layers=2", "--strategy", str(path), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["iteration_time_s"] == pytest.approx(best["iteration_time_s"], rel=1e-12)
    assert run(args + ["--save-best", str(path)]) == 1  # never over a file without --force


def test_compare_shows_every_field_that_varies(tmp_path, capsys):
    """Strategies sharing a shape but differing in ZeRO and recomputation: both fields are columns of
    the CSV and in the table's names."""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("dp: 2\nzero: 1\nrecompute: full\nglobal_batch: 8\n")
    b.write_text("dp: 2\nzero: 2\nrecompute: none\nglobal_batch: 8\n")
    out = tmp_path / "c.csv"
    assert run(["compare", "gpt2", "-c", "dgx-h100", "--set", "layers=2", "--strategy", str(a), "--strategy", str(b),
                "--csv", str(out)]) == 0
    text = capsys.readouterr().out
    assert "zero=1" in text and "recompute=full" in text and "zero=2" in text
    header = out.read_text().splitlines()[0].split(",")
    assert {"zero", "recompute", "tokens_per_s", "model_tflops_per_gpu"} <= set(header)
