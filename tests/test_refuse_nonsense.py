"""Every value, bound and combination is checked before the work, and nonsense is refused in one line
(issue 29). Each test reproduces a defect fuzzing found: a search or a loop that ran until killed, an
emulated cluster built before its options were read, an option ignored, a value silently replaced by a
default, an internal error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _one_line(err: str) -> None:
    assert len(err.strip().splitlines()) == 1 and "internal error" not in err and "Traceback" not in err, err


def _never(*_a, **_k):
    raise AssertionError("the expensive step started before the options were checked")


# ------------------------------------------------------------------------------------ check before work
def test_optimize_bounds_the_global_batch_before_searching(cli, monkeypatch):
    import dlsim.api.optimize
    monkeypatch.setattr(dlsim.api.optimize, "SearchSpace", _never)
    code, _, err = cli("optimize", "gpt2", "-c", "dgx-h100", "--gpus", "8", "--global-batch", "1000000000000")
    assert code == 1 and "global_batch" in err and "over the limit" in err
    _one_line(err)


@pytest.mark.parametrize("flag, value, field", [("--bucket-mib", "nan", "bucket_mib"), ("--bucket-mib", "-1", "bucket_mib"),
                                               ("--bucket-mib", "1e30", "bucket_mib"), ("--rate", "10", "rate"),
                                               ("--rate", "-5mbit", "rate"), ("--repeats", "0", "repeats")])
def test_validate_ddp_checks_its_options_before_building_the_cluster(cli, monkeypatch, flag, value, field):
    from dlsim.validate import emulated_cluster
    monkeypatch.setattr(emulated_cluster.EmulatedCluster, "__enter__", _never)
    code, _, err = cli("validate", "ddp", "lenet5", "-p", ROOT / "hardware_profiles" / "cpu-epyc-2core", flag, value)
    assert code == 1 and field.replace("_", "-") in err.replace("_", "-"), err
    _one_line(err)


@pytest.mark.parametrize("args, word", [(["--gemms", "-1"], "gemms"), (["--dtype", "bogus"], "bogus"),
                                        (["--gemms", "0", "--convs", "0"], "nothing to validate")])
def test_validate_kernels_refuses_counts_and_dtypes_before_timing(cli, monkeypatch, args, word):
    import dlsim.api.validate
    monkeypatch.setattr(dlsim.api.validate, "warm_allocator", _never)
    code, out, err = cli("validate", "kernels", "-c", "cpu-epyc-2core", *args)
    assert code == 1 and word in err and not out
    _one_line(err)


def test_calibrate_microbatch_refuses_zero_repeats_and_leaves_nothing(cli, tmp_path):
    out = tmp_path / "t.csv"
    code, _, err = cli("calibrate", "microbatch", "lenet5", "--batch", "2", "--out", out, "--repeats", "0")
    assert code == 1 and "--repeats" in err and not out.exists()
    _one_line(err)


def test_calibrate_microbatch_never_cuts_a_file_that_is_not_its_table(cli, tmp_path):
    out = tmp_path / "notes.txt"
    out.write_text("my notes\nno newline")
    code, _, err = cli("calibrate", "microbatch", "lenet5", "--batch", "2", "--out", out)
    assert code == 1 and "not a benchmark table" in err
    assert out.read_text() == "my notes\nno newline"


# ------------------------------------------------------------------------------------- ONNX
def test_an_onnx_loop_of_a_huge_trip_count_is_refused_not_run(cli, tmp_path):
    pytest.importorskip("onnx")
    from fuzz_attacks import onnx_file
    huge = onnx_file(tmp_path, "loop", 10**18)
    assert huge.stat().st_size < 400
    code, _, err = cli("import", "onnx", huge)
    assert code == 1 and "Loop y" in err and "loop iterations" in err
    _one_line(err)
    (tmp_path / "small").mkdir()
    small = onnx_file(tmp_path / "small", "loop", 3)
    code, out, err = cli("import", "onnx", small, "--cluster", "dgx-h100")  # a loop of a few iterations imports
    assert code == 0 and "type: generic" in out, err


def _lstm(tmp_path, kind: str) -> Path:
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    h, f, steps = 4, 3, 5
    w, r, b = np.zeros((1, 4 * h, f), np.float32), np.zeros((1, 4 * h, h), np.float32), np.zeros((1, 8 * h), np.float32)
    attrs = {"hidden_size": h, "layout": 1}
    if kind == "W":
        w = np.zeros((1, 4 * h, f + 2), np.float32)
    elif kind == "R":
        r = np.zeros((1, 4 * h, h + 1), np.float32)
    elif kind == "B":
        b = np.zeros((1, 3), np.float32)
    elif kind == "hidden_size":
        attrs["hidden_size"] = 0
    elif kind == "directions":
        w = np.zeros((2, 4 * h, f), np.float32)
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", steps, f])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", steps, 1, h])],
                              initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R"),
                                           numpy_helper.from_array(b, "B")])
    path = tmp_path / f"lstm_{kind}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("kind, word", [("W", "input W"), ("R", "input R"), ("B", "input B"),
                                        ("hidden_size", "hidden_size"), ("directions", "input W")])
def test_malformed_onnx_lstm_inputs_are_refused(cli, tmp_path, kind, word):
    code, _, err = cli("import", "onnx", _lstm(tmp_path, kind))
    assert code == 1 and "LSTM y" in err and word in err
    _one_line(err)


def test_a_well_formed_onnx_lstm_still_imports(cli, tmp_path):
    code, out, err = cli("import", "onnx", _lstm(tmp_path, "ok"), "--cluster", "dgx-h100")
    assert code == 0 and "type: lstm" in out, err


# ------------------------------------------------------------------------------------ nonsense
def test_a_zero_stride_is_refused_not_replaced_by_the_kernel(cli, tmp_path):
    text = (ROOT / "models" / "lenet5.yaml").read_text()
    model = tmp_path / "m.yaml"
    model.write_text(text.replace("{name: c1, type: conv2d, out_channels: 1, kernel: 5}",
                                  "{name: c1, type: conv2d, out_channels: 1, kernel: 5, stride: 0}"))
    code, _, err = cli("model", "show", model)
    assert code == 1 and "stride must be a positive integer, got 0" in err
    _one_line(err)


@pytest.mark.parametrize("args", [["estimate", "lenet5", "-c", "dgx-h100", "--dtype", ""],
                                  ["simulate", "lenet5", "-c", "dgx-h100", "--dtype", ""],
                                  ["model", "show", "lenet5", "--dtype", ""]])
def test_an_empty_dtype_is_refused_not_the_default(cli, args):
    code, _, err = cli(*args)
    assert code == 1 and "unknown dtype ''" in err
    _one_line(err)


def test_an_empty_name_is_refused_not_the_default(cli, tmp_path):
    code, _, err = cli("import", "onnx", _lstm(tmp_path, "ok"), "--name", "")
    assert code == 1 and "--name" in err
    _one_line(err)


def test_a_unit_less_bandwidth_names_the_accepted_spellings(cli):
    code, _, err = cli("comm", "allreduce", "--size", "1MB", "--ranks", "8", "--bandwidth", "10", "--latency", "1us")
    assert code == 1 and "needs a unit" in err and "GB/s" in err and "Gbps" in err
    _one_line(err)


def test_reserved_memory_above_capacity_is_refused(cli, tmp_path):
    prof = tmp_path / "prof"
    shutil.copytree(ROOT / "hardware_profiles" / "dgx-h100", prof)
    text = (prof / "profile.yaml").read_text()
    assert "  memory_reserved_gib: 2 " in text
    (prof / "profile.yaml").write_text(text.replace("  memory_reserved_gib: 2 ", "  memory_reserved_gib: 500 ", 1))
    code, _, err = cli("estimate", "lenet5", "-c", prof)
    assert code == 1 and "memory_reserved_gib" in err and "500 GiB reserved" in err
    _one_line(err)


@pytest.mark.parametrize("args, words", [
    (["--set", "layers=0"], "--set does nothing without MODEL"),
    (["--dtype", "fp16"], "--dtype does nothing without MODEL"),
    (["--gap", "0.1"], "--gap does nothing with --mode wr"),
    (["--solver", "highs"], "--solver does nothing with --mode wr"),
])
def test_an_option_that_does_nothing_in_that_mode_is_refused(cli, tmp_path, args, words):
    table = tmp_path / "b.csv"
    table.write_text("layer,pass,microbatch_size,algorithm,time_s,workspace_bytes\nconv1,forward,4,slow,4.0,0\n"
                     "conv1,forward,2,slow,2.0,0\nconv1,forward,1,slow,1.0,0\n")
    code, _, err = cli("plan", "microbatch", "--bench-table", table, "--batch", "4", *args)
    assert code == 1 and words in err
    _one_line(err)


def test_jobs_does_nothing_on_dask(cli, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [lenet5]\nclusters: [dgx-h100]\ngpus: [8]\nglobal_batch: 32\ngrid: {tp: [1, 2]}\n")
    code, _, err = cli("sweep", spec, "--scheduler", "tcp://127.0.0.1:1", "--jobs", "2")
    assert code == 1 and "--jobs does nothing on Dask" in err


def test_a_comment_only_strategy_file_is_announced(cli, tmp_path):
    strategy = tmp_path / "s.yaml"
    strategy.write_text("# dp: 8 (commented out)\n")
    code, _, err = cli("simulate", "lenet5", "-c", "dgx-h100", "--strategy", strategy)
    assert code == 0 and f"warning: strategy file {strategy} sets no field" in err


@pytest.mark.parametrize("text, where", [("garbage header\nx,y\n", "line 1"),
                                         ("quantity,value,unit,how\nlaunch_overhead_s,nan,s,x\nfoo\n", "line 2")])
def test_a_damaged_device_csv_is_refused_naming_the_line(cli, tmp_path, text, where):
    import yaml
    prof = tmp_path / "prof"
    shutil.copytree(ROOT / "hardware_profiles" / "cpu-epyc-2core", prof,
                    ignore=shutil.ignore_patterns("passes", "1thread", "median-run", "single-pass-run"))
    meta = yaml.safe_load((prof / "meta.yaml").read_text())
    meta.pop("host", None)  # no comparison of this host with the calibration's (seconds of timing)
    (prof / "meta.yaml").write_text(yaml.safe_dump(meta))
    (prof / "device.csv").write_text(text)
    code, _, err = cli("estimate", "lenet5", "-c", prof)
    assert code == 1 and f"device.csv: {where}" in err
    _one_line(err)


@pytest.mark.torch
@pytest.mark.parametrize("body, what", [("import sys\ndef f():\n    sys.exit(3)\n", "called sys.exit(3)"),
                                        ("import sys\ndef f():\n    sys.exit(0)\n", "called sys.exit(0)"),
                                        ("def f():\n    raise RuntimeError('no GPU')\n", "raised RuntimeError: no GPU"),
                                        ("import sys\nsys.exit(5)\ndef f():\n    pass\n", "importing it called sys.exit(5)")])
def test_a_factory_that_exits_or_raises_is_one_line_naming_it(cli, tmp_path, body, what):
    pytest.importorskip("torch")
    source = tmp_path / "fac.py"
    source.write_text(body)
    code, _, err = cli("import", "torch", f"{source}:f", "--input-shape", "4")
    assert code == 1 and what in err and "fac.py" in err
    _one_line(err)


# ------------------------------------------------------------------------------------ plot
def _trace(cli, tmp_path) -> dict:
    code, _, err = cli("simulate", "lenet5", "-c", "dgx-h100", "--dp", "2", "--trace", tmp_path / "t.json")
    assert code == 0, err
    return json.loads((tmp_path / "t.json").read_text())


@pytest.mark.parametrize("damage", ["x-name", "thread-name", "ts"])
def test_plot_of_a_damaged_trace_is_one_line(cli, tmp_path, damage):
    trace = _trace(cli, tmp_path)
    for e in trace["traceEvents"]:
        if damage == "x-name" and e.get("ph") == "X":
            e["name"] = 123
            break
        if damage == "thread-name" and e.get("name") == "thread_name":
            e["args"]["name"] = 42
            break
        if damage == "ts" and e.get("ph") == "X":
            e["ts"] = "soon"
            break
    (tmp_path / "d.json").write_text(json.dumps(trace))
    code, _, err = cli("plot", tmp_path / "d.json", "-o", tmp_path / "p.png")
    assert code == 1 and "traceEvents[" in err and not (tmp_path / "p.png").exists()
    _one_line(err)


@pytest.mark.parametrize("damage", [lambda r: r.pop("sizes_bytes"), lambda r: r.update(algorithms=5)])
def test_plot_of_a_damaged_comm_record_is_one_line(cli, tmp_path, damage):
    code, _, err = cli("comm", "allreduce", "--sweep", "1KB:1MB", "--ranks", "8", "-c", "dgx-h100", "--json",
                       tmp_path / "c.json")
    assert code == 0, err
    rec = json.loads((tmp_path / "c.json").read_text())
    damage(rec)
    (tmp_path / "d.json").write_text(json.dumps(rec))
    code, _, err = cli("plot", tmp_path / "d.json", "-o", tmp_path / "p.png")
    assert code == 1 and "comm-sweep record is missing or has a malformed field" in err
    _one_line(err)


def test_calibrate_comm_refuses_a_nan_budget_before_launching_ranks(cli, tmp_path, monkeypatch):
    """Found by the fuzzer: --budget nan passed `budget <= 0` and reached the MPI ranks."""
    import dlsim.api.calibrate_comm
    monkeypatch.setattr(dlsim.api.calibrate_comm, "calibrate_comm", _never)
    code, _, err = cli("calibrate", "comm", "--out", tmp_path / "cm", "--budget", "nan")
    assert code == 1 and "--budget" in err and "not a finite number" in err
    _one_line(err)
    from dlsim.errors import SpecError
    monkeypatch.undo()
    with pytest.raises(SpecError, match="budget"):
        dlsim.api.calibrate_comm.calibrate_comm(tmp_path / "cm", ranks=2, budget_s=float("nan"))
    assert not (tmp_path / "cm").exists()


def test_every_float_option_refuses_nan_and_inf():
    """click's float reads ``nan`` and ``inf``; every float option of every command uses FINITE_FLOAT."""
    import click

    from dlsim.cli import _register, main
    from dlsim.cli.options import FiniteFloat
    _register()

    def commands(group):
        for command in group.commands.values():
            yield command
            if isinstance(command, click.Group):
                yield from commands(command)
    loose = [f"{c.name} {p.opts[0]}" for c in commands(main) for p in c.params
             if type(p.type) is click.types.FloatParamType and not isinstance(p.type, FiniteFloat)]
    assert not loose, f"float options that take nan: {loose}"
