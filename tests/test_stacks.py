"""Software stacks as data (`dlsim.spec.stack`, stacks/*.yaml): every key sourced, the stack chosen
and named in every record, a flag overriding one key, bad stacks refused in one line."""

from __future__ import annotations

import json
import re

import pytest

from dlsim.api.optimize import optimize
from dlsim.api.simulate import simulate
from dlsim.cli import run
from dlsim.errors import SpecError
from dlsim.io.stack_yaml import all_stacks, load_stack
from dlsim.plan.steptime import optimizer_timer, step_kernels
from dlsim.spec.stack import STACK_KEYS, device_dtype

SMALL = {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "positions": 128}
COMMIT = re.compile(r"@[0-9a-f]{7,40}|@v\d")


def test_every_key_of_every_stack_has_a_source_naming_a_repository_at_a_commit():
    stacks = all_stacks()
    assert {"pytorch", "eager", "megatron-lm-2022"} <= {s.name for s in stacks}
    for s in stacks:
        assert s.version and s.framework, s.name
        assert set(s.values) == set(s.sources), s.name
        for key, source in s.sources.items():
            assert key in STACK_KEYS
            assert COMMIT.search(source) and "/" in source, (s.name, key, source)


def test_the_default_stack_fills_what_the_caller_left_and_the_record_says_so():
    r = simulate("gpt2", "dgx-h100", overrides=SMALL)
    pytorch = load_stack("pytorch")
    assert r.stack["name"] == "pytorch" and r.stack["chosen"] == "default"
    assert tuple(r.strategy["fused_kernels"]) == pytorch.values["fused_kernels"]
    assert r.strategy["dtype"] == "bf16"  # the stack's precision, which H100 computes
    assert "fused_kernels" not in r.assumed and "dtype" not in r.assumed


def test_a_given_field_overrides_one_key_of_the_stack():
    r = simulate("gpt2", "dgx-h100", overrides=SMALL, stack="megatron-lm-2022", fused_kernels=("flash_attention",))
    assert r.strategy["fused_kernels"] == ["flash_attention"]
    assert r.strategy["grad_accumulation"] == "main_grad"  # the stack's, untouched
    assert r.stack["overridden"] == ["fused_kernels"] and r.stack["chosen"] == "given"


def test_lists_and_tuples_alike_from_the_python_api():
    a = simulate("gpt2", "dgx-h100", overrides=SMALL, stack="eager", fused_kernels=("flash_attention",))
    b = simulate("gpt2", "dgx-h100", overrides=SMALL, stack="eager", fused_kernels=["flash_attention"])
    assert a.iteration_time_s == b.iteration_time_s


def test_a_stacks_precision_falls_back_to_what_the_device_computes():
    assert device_dtype("bf16", {"fp16": 1.0, "fp32": 1.0}) == "fp16"  # V100: fp16 tensor cores only
    assert device_dtype("bf16", {"fp32": 1.0}) is None  # a CPU: the model's own precision stays
    r = simulate("gpt2", "dgx1-v100", overrides=SMALL)
    assert r.strategy["dtype"] == "fp16"


def test_optimizer_implementations_cost_what_their_passes_move():
    """Closed form: the iteration differs by exactly the optimizer steps' difference (one device, the
    step last on its stream)."""
    times = {impl: simulate("gpt2", "dgx-h100", overrides=SMALL, stack="eager", optimizer_impl=impl)
             for impl in ("fused", "foreach")}
    from dlsim.api.models import as_cluster, as_model
    model, device = as_model("gpt2", SMALL), as_cluster("dgx-h100").device
    params = model.params

    def step(impl: str) -> float:
        from dlsim.plan.layertable import build_layer_table
        entries = build_layer_table(model, device, "fp32", batch=1, tp=1)
        return optimizer_timer(device, "fp32", "adam", step_kernels(entries, 1, "adam", impl), impl)(params).seconds

    delta = times["foreach"].iteration_time_s - times["fused"].iteration_time_s
    assert delta == pytest.approx(step("foreach") - step("fused"), rel=1e-9)
    assert delta > 0


def test_optimize_runs_every_candidate_on_the_models_stack_and_names_it():
    r = optimize("gpt2", "dgx-h100", gpus=8, global_batch=16, overrides=SMALL, max_microbatch_size=2, top=2,
                 stack="megatron-lm-2022", jobs=1)
    assert r.stack["name"] == "megatron-lm-2022"
    assert all(c.strategy.stack == "megatron-lm-2022" and c.strategy.grad_accumulation == "main_grad"
               for c in r.ranked)


@pytest.mark.parametrize("text, says", [
    ("name: x\nversion: '1'\nframework: f\nkeys: {dp: {value: 2, source: 'NVIDIA/Megatron-LM@55ba1f7 a.py'}}",
     "keys.dp: unknown field (allowed: bucket_size_bytes"),
    ("name: x\nversion: '1'\nframework: f\nkeys: {fused_kernels: {value: [flash_attention]}}",
     "keys.fused_kernels.source: missing required field"),
    ("name: x\nversion: '1'\nframework: f\nkeys: {zero: {value: 7, source: 'NVIDIA/Megatron-LM@55ba1f7 a.py'}}",
     "zero"),
    ("name: x\nframework: f\n", "version"),
    ("[1, 2", "line"),
])
def test_a_bad_stack_file_is_one_line_exit_1(tmp_path, capsys, text, says):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError):
        load_stack(path)
    code = run(["simulate", "gpt2", "-c", "dgx-h100", "--stack", str(path), "--set", "layers=2"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and says in err, err


def test_an_unknown_stack_name_is_one_line_exit_1(capsys):
    assert run(["simulate", "gpt2", "-c", "dgx-h100", "--stack", "tensorflow-1999"]) == 1
    err = capsys.readouterr().err
    assert "unknown stack 'tensorflow-1999'" in err and "megatron-lm-2022" in err


def test_stacks_lists_and_shows_every_key_with_its_source(capsys):
    assert run(["stacks"]) == 0
    out = capsys.readouterr().out
    assert "megatron-lm-2022" in out and "pytorch" in out
    assert run(["stacks", "show", "megatron-lm-2022", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert set(rec["sources"]) == {k.replace("_bytes", "") if k.endswith("bucket_size_bytes") else k
                                   for k in rec["values"]}
    assert all("55ba1f7" in s for s in rec["sources"].values())


def test_stacks_diff_names_every_key_that_differs_and_nothing_else(capsys, tmp_path):
    a, b = load_stack("megatron-lm-2021"), load_stack("megatron-lm-2022")
    assert run(["stacks", "diff", "megatron-lm-2021", "megatron-lm-2022", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    differ = {d["key"]: d for d in rec["differ"]}
    keys = set(a.values) | set(b.values)
    assert set(differ) == {k for k in keys if a.values.get(k) != b.values.get(k)} == {"grad_accumulation", "tp_async_backward"}
    assert differ["tp_async_backward"]["a"] is False and differ["tp_async_backward"]["b"] is True
    assert "e269e20" in differ["grad_accumulation"]["a_source"] and "55ba1f7" in differ["grad_accumulation"]["b_source"]
    assert set(rec["same"]) == {k for k in keys if k not in differ}
    # a key one stack leaves unset is compared with what a strategy then runs (the Strategy default)
    assert run(["stacks", "diff", "megatron-core", "fsdp2", "--json"]) == 0
    rec_mc = json.loads(capsys.readouterr().out)
    unset = next(d for d in rec_mc["differ"] if d["key"] == "fsdp_units")
    assert unset["a"] == "bucket" and "not set by the stack" in unset["a_source"] and unset["b"] == "block"
    assert run(["stacks", "diff", "megatron-core", "megatron-core"]) == 0
    assert "0 key(s) differ" in capsys.readouterr().out
    assert run(["stacks", "diff", "megatron-core", "tensorflow-1999"]) == 1
    assert "unknown stack 'tensorflow-1999'" in capsys.readouterr().err


def test_the_summary_names_the_stack_in_its_first_lines(capsys):
    assert run(["simulate", "gpt2", "-c", "dgx-h100", "--set", "layers=2"]) == 0
    head = capsys.readouterr().out.splitlines()[:4]
    assert any(line.startswith("stack pytorch") and "default" in line for line in head), head


def test_compare_grids_stacks(capsys):
    assert run(["compare", "gpt2", "-c", "dgx-h100", "--grid", "stack=eager,megatron-lm-2022", "--set", "layers=2",
                "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert [e["strategy"]["stack"] for e in rec["entries"]] == ["eager", "megatron-lm-2022"]


def test_optimize_compares_stacks_side_by_side(capsys):
    assert run(["optimize", "gpt2", "-c", "dgx-h100", "--gpus", "8", "--global-batch", "16", "--set", "layers=2",
                "--max-microbatch-size", "2", "--jobs", "1", "--stacks", "eager,megatron-lm-2022", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["kind"] == "stack_comparison" and {r["stack"] for r in rec["stacks"]} == {"eager", "megatron-lm-2022"}
    times = [r["iteration_time_s"] for r in rec["stacks"]]
    assert times == sorted(times) and rec["stacks"][0]["slowdown"] == 0.0
    for row in rec["stacks"]:  # each stack's best is its own search's winner
        assert rec["results"][row["stack"]]["best"]["iteration_time_s"] == row["iteration_time_s"]
    assert run(["optimize", "gpt2", "-c", "dgx-h100", "--gpus", "8", "--global-batch", "16", "--stacks", "eager"]) == 1
