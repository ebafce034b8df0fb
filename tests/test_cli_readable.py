"""Outputs a newcomer reads right the first time (issue 34 item 4): usable memory is called usable,
parameter counts read 70.6B, the out-of-memory verdict is said once, a size comes back in the system it
was given in, and an option with an optional value (`--json [FILE]`) never swallows the model name."""

from __future__ import annotations

import json

import pytest

from dlsim.units import format_bytes, format_params, size_is_decimal


def test_profiles_say_which_memory_is_usable(cli):
    code, out, _ = cli("profiles")
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("dgx-h100 "))
    assert "79.65 GiB" in row and "77.65 GiB" in row  # the device's memory and what a training process can use
    assert "usable" in out.splitlines()[0]
    code, out, _ = cli("profiles", "--json")
    rec = next(r for r in json.loads(out) if r["name"] == "dgx-h100")
    assert rec["memory_usable_bytes"] == pytest.approx(rec["memory_bytes"] - 2 * 2**30)


def test_results_say_usable(cli):
    code, out, _ = cli("simulate", "gpt2", "--cluster", "dgx-h100", "--dp", "2", "--microbatch-size", "1")
    assert code == 0
    assert "of 77.65 GiB usable" in out
    code, out, _ = cli("estimate", "gpt2", "--cluster", "dgx-h100", "--batch", "1")
    assert code == 0 and "of 77.65 GiB usable" in out


@pytest.mark.parametrize("count,text", [(70_553_706_496, "70.6B"), (124_439_808, "124M"), (6_738_415_616, "6.74B"),
                                        (1_000_000_000_000, "1T"), (405_000_000_000, "405B"), (61_100_840, "61.1M"),
                                        (8_192, "8.19K"), (12, "12"), (0, "0")])
def test_parameter_counts_read_as_readers_expect(count, text):
    assert format_params(count) == text


def test_model_show_and_models_print_billions(cli):
    code, out, _ = cli("model", "show", "llama3-70b")
    assert code == 0 and "total: 70.6B parameters (70,553,706,496)" in out
    assert "70.55G" not in out
    code, out, _ = cli("models")
    row = next(line for line in out.splitlines() if line.startswith("llama3-70b "))
    assert " 70.6B " in row


def test_out_of_memory_verdict_is_said_once(cli):
    code, out, err = cli("simulate", "llama3-70b", "--cluster", "dgx-h100", "--dp", "8", "--microbatch-size", "1",
                         "--num-microbatches", "1")
    assert code == 1
    assert (out + err).count("out of memory on rank0") == 1
    assert err.startswith("error: out of memory on rank0") and "over by" in err
    assert "DOES NOT FIT" in out  # the summary still marks the memory line


@pytest.mark.parametrize("text,decimal", [("1GB", True), ("100MB", True), ("3kB", True), ("1Gb", True),
                                          ("64MiB", False), ("1GiB", False), ("4096", False)])
def test_size_system_follows_the_spelling(text, decimal):
    assert size_is_decimal(text) is decimal


def test_format_bytes_decimal():
    assert format_bytes(1e9, decimal=True) == "1 GB"
    assert format_bytes(1.5e6, decimal=True) == "1.5 MB"
    assert format_bytes(2**30) == "1 GiB"


def test_comm_answers_in_the_system_it_was_asked_in(cli):
    code, out, _ = cli("comm", "allreduce", "--size", "1GB", "--ranks", "8", "--cluster", "dgx-h100")
    assert code == 0 and out.startswith("allreduce of 1 GB on 8 ranks")
    code, out, _ = cli("comm", "allreduce", "--size", "64MiB", "--ranks", "8", "--cluster", "dgx-h100")
    assert code == 0 and out.startswith("allreduce of 64 MiB on 8 ranks")
    code, out, _ = cli("comm", "allreduce", "--sweep", "1KB:1MB:10", "--ranks", "8", "--cluster", "dgx-h100")
    assert code == 0 and "100 kB" in out and "1 MB" in out
    assert "KiB" not in out and "MiB" not in out


@pytest.mark.parametrize("args", [
    ("simulate", "--json", "gpt2", "--cluster", "dgx-h100", "--dp", "2", "--microbatch-size", "1"),
    ("estimate", "--json", "gpt2", "--cluster", "dgx-h100", "--batch", "1"),
    ("model", "show", "--json", "lenet5"),
    ("comm", "--json", "allreduce", "--size", "1MB", "--ranks", "4", "--latency", "1us", "--bandwidth", "10GB/s"),
])
def test_json_before_the_positional_is_the_flag(cli, args):
    code, out, err = cli(*args)
    assert code == 0, err
    assert isinstance(json.loads(out), dict)


def test_json_with_a_file_still_writes_it(cli, tmp_path):
    path = tmp_path / "r.json"
    code, out, err = cli("estimate", "--json", str(path), "gpt2", "--cluster", "dgx-h100", "--batch", "1")
    assert code == 0, err
    assert json.loads(path.read_text())["model"] == "gpt2" and "iteration time" in out


def test_a_missing_model_is_still_a_usage_error(cli):
    code, _, err = cli("estimate", "--cluster", "dgx-h100")
    assert code == 1 and "Missing argument 'MODEL'" in err
