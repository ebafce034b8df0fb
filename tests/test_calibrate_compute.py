"""Compute calibration on tiny shapes: planning, kernels, resumable tables, profile writing, the CUDA path (mocked)."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlsim.calibrate.compute_plan import (CONV_ALGORITHMS, MEMORY_SWEEP_OPS, ConvTask, GemmTask, MemoryTask,
                                          OptimizerTask, gemm_grid, memory_sweep, model_tasks, optimizer_sweep)
from dlsim.calibrate.compute_store import TableFile
from dlsim.cost.layers import Gemm
from dlsim.cost.lookup import conv_shape
from dlsim.errors import DlsimError
from dlsim.io.model_yaml import load_model

ROOT = Path(__file__).resolve().parents[1]


def test_model_tasks_cover_every_kernel_once():
    model = load_model("lenet5")
    tasks = model_tasks(model, 4, "fp32", "cpu")
    convs = [t for t in tasks if isinstance(t, ConvTask)]
    shapes = {t.shape for t in convs}
    # every (shape, pass, algorithm) once
    assert len(convs) == len(shapes) * 3 * len(CONV_ALGORITHMS["cpu"])
    assert len(set(tasks)) == len(tasks)
    gemms = {t.gemm for t in tasks if isinstance(t, GemmTask)}
    fc = next(layer for layer in model.layers if layer.type == "linear")
    assert Gemm(4, fc.attrs["out_features"], fc.in_shapes[0][-1]) in gemms
    mem = {(t.layer.type, t.pass_name) for t in tasks if isinstance(t, MemoryTask)}
    assert ("cross_entropy", "forward") in mem and ("cross_entropy", "backward_data") in mem
    steps = [t for t in tasks if isinstance(t, OptimizerTask)]
    assert {t.optimizer for t in steps} == {"sgd", "momentum", "adam"}
    assert sum(steps[0].sizes) == model.params
    assert steps[0].key_tensors == sum(1 for layer in model.layers if layer.params)


def test_grid_and_sweeps():
    grid = gemm_grid(["fp32"], max_dim=64, max_flops=2.0 * 64 * 64 * 16, attention=False, odd=0)
    dims = [1, 2, 4, 8, 16, 32, 64]
    assert len(grid) == sum(1 for m in dims for n in dims for k in dims if m * n * k <= 64 * 64 * 16)
    assert grid[0].gemm == Gemm(1, 1, 1) and all(t.set == "grid" for t in grid)
    sweep = memory_sweep(["fp32"], elements=(4096,))
    assert {t.layer.type for t in sweep} == set(MEMORY_SWEEP_OPS)
    assert all(t.bytes > 0 for t in sweep)
    assert len(optimizer_sweep()) == 3 * 6


def test_table_file_appends_resumes_and_drops_a_partial_line(tmp_path):
    path = tmp_path / "t.csv"
    key = lambda rec: (rec["a"],)  # noqa: E731
    table = TableFile(path, ("a", "b"), key)
    table.append({"a": "1", "b": "x,y"})
    table.append({"a": "2", "b": "z"})
    with open(path, "a") as handle:
        handle.write("3,unfinish")  # a run killed in the middle of a line
    again = TableFile(path, ("a", "b"), key)
    assert again.dropped_partial and again.keys == {("1",), ("2",)}
    assert path.read_text() == 'a,b\n1,"x,y"\n2,z\n'
    with pytest.raises(ValueError, match="header"):
        TableFile(path, ("a", "c"), key)


pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from dlsim.calibrate.compute_ops import conv_algorithm, conv_fn, gemm_fn, memory_op, optimizer_step_fn  # noqa: E402
from dlsim.calibrate.compute_run import KEYS, Backend, open_tables, run_calibration  # noqa: E402
from dlsim.calibrate.compute_timer import KernelTimer, check_device  # noqa: E402


def fast_timer(device: str = "cpu") -> KernelTimer:
    return KernelTimer(device, repeats=1, min_block_s=0.0)


def test_kernels_run_and_have_the_right_shapes():
    cpu = torch.device("cpu")
    assert tuple(gemm_fn(Gemm(3, 5, 7), "fp32", cpu)().shape) == (3, 5)
    assert tuple(gemm_fn(Gemm(3, 5, 7, 2), "fp32", cpu)().shape) == (2, 3, 5)
    shape = conv_shape(4, 9, 9, 6, 3, 3, 2, 2, 1, 1)
    for pass_name, want in (("forward", (2, 6, 5, 5)), ("backward_data", (2, 4, 9, 9)), ("backward_weight", (6, 4, 3, 3))):
        for algo in CONV_ALGORITHMS["cpu"]:
            with conv_algorithm(algo):
                fn, nbytes = conv_fn(shape, 2, pass_name, "fp32", cpu)
                out = fn()
            got = out if pass_name == "forward" else out[0 if pass_name == "backward_data" else 1]
            assert tuple(got.shape) == want and nbytes == got.numel() * 4
    for t in memory_sweep(["fp32"], elements=(1024,)):
        memory_op(t.layer, t.batch, t.pass_name, "fp32", cpu)()
    emb = next(t for t in model_tasks(load_model("gpt2", {"layers": 1, "seq_len": 8}), 1, "fp32")
               if isinstance(t, MemoryTask) and t.layer.type == "embedding" and t.pass_name == "backward_weight")
    grads = memory_op(emb.layer, 1, "backward_weight", "fp32", cpu)()
    assert len(grads) == 2  # token and position tables
    step = optimizer_step_fn("adam", (10, 3), cpu)
    step()
    with pytest.raises(DlsimError):
        memory_op(emb.layer, 1, "backward_data", "fp32", cpu)


def read_rows(path: Path) -> list[dict]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def test_run_writes_rows_and_a_rerun_measures_only_what_is_missing(tmp_path):
    tasks = [GemmTask("fp32", Gemm(4, 4, 4)), ConvTask("fp32", "forward", "mkldnn", 1, conv_shape(2, 6, 6, 2, 3, 3)),
             *memory_sweep(["fp32"], ops=("relu",), elements=(256,)), OptimizerTask("sgd", (8, 8), 1)]
    backend = Backend.create("cpu")
    first = run_calibration(tasks, tmp_path, backend, fast_timer())
    assert first.measured == len(tasks) and not first.failed
    tables = open_tables(tmp_path)
    # device: launch overhead, stream, softmax (the CPU's host probes are dlsim.api.host_probes', tested there)
    assert {k: len(t.keys) for k, t in tables.items()} == {"gemm": 1, "conv": 1, "memory": 3, "device": 3}
    again = run_calibration(tasks, tmp_path, backend, fast_timer())
    assert (again.measured, again.skipped) == (0, len(tasks))
    lines = (tmp_path / "memory.csv").read_text().splitlines()
    (tmp_path / "memory.csv").write_text("\n".join(lines[:-1]) + "\n")  # lose one row
    third = run_calibration(tasks, tmp_path, backend, fast_timer())
    assert (third.measured, third.skipped) == (1, len(tasks) - 1)
    assert len(read_rows(tmp_path / "memory.csv")) == 3


def test_cuda_path_with_a_mocked_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DlsimError, match="no CUDA device"):
        check_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert check_device("cuda").type == "cuda"
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: syncs.append(1))
    timer = KernelTimer("cuda", repeats=3, min_block_s=0.0)
    timing = timer.time(lambda: None)
    assert timing.repeats == 3 and len(syncs) == 2 * (2 + 3)  # before and after every block
    # workspace: peak memory of the call minus its output
    state = {"now": 1000, "peak": 1000}
    def fake_call():
        state["peak"] = state["now"] + 300
        return None
    backend = Backend("cuda", torch.device("cpu"), (lambda: None, lambda: state["now"], lambda: state["peak"]))
    assert backend.workspace(fake_call, 100, lambda: None) == 200
    for algo, bench, det in (("cudnn-default", False, False), ("cudnn-benchmark", True, False),
                             ("cudnn-deterministic", False, True)):
        with conv_algorithm(algo):
            assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic) == (bench, det)


def test_cli_cuda_without_a_gpu_is_one_line(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, out, err = cli("calibrate", "compute", "--device", "cuda", "--out", tmp_path / "x", "--no-grid")
    assert code == 1 and err.count("\n") == 1 and "no CUDA device" in err


def test_calibrate_api_writes_a_loadable_profile_and_keeps_a_users(tmp_path):
    from dlsim.api.calibrate_compute import calibrate_compute
    from dlsim.api.estimate import estimate
    from dlsim.io.profile_yaml import load_profile
    from dlsim.io.yamlfile import read_yaml
    out = tmp_path / "cpu-test"
    rec = calibrate_compute(out, models=["lenet5"], batches=[2], grid=False, repeats=1, flush_cache=False,
                            algorithms=["mkldnn"], threads=1, command="test")
    assert rec["measured"] > 50 and not rec["failed"]
    profile = load_profile(out)
    assert set(profile.tables) == {"gemm", "conv", "memory"} and profile.device.launch_overhead > 0
    meta = read_yaml(out / "meta.yaml")
    assert meta["defaults"]["conv_algorithm"] == "mkldnn" and meta["runs"][0]["command"] == "test"
    result = estimate("lenet5", out, 2).to_dict()
    assert result["measured_share"] > 0.95
    # a second run with a user-edited profile: nothing of theirs changes, nothing is re-measured
    text = "# my notes\n" + (out / "profile.yaml").read_text().replace("tables: {", "tables: {comm: mine.csv, ")
    (out / "profile.yaml").write_text(text)
    meta_text = (out / "meta.yaml").read_text()
    again = calibrate_compute(out, models=["lenet5"], batches=[2], grid=False, repeats=1, flush_cache=False,
                              algorithms=["mkldnn"], threads=1)
    assert again["measured"] == 0 and (out / "profile.yaml").read_text() == text
    # a finished calibration's rerun measures and writes nothing (issue 34)
    assert again["nothing_to_do"] and (out / "meta.yaml").read_text() == meta_text
    # a model it has not measured yet: only its kernels, and one more run in meta.yaml
    third = calibrate_compute(out, models=["lenet5"], batches=[3], grid=False, repeats=1, flush_cache=False,
                              algorithms=["mkldnn"], threads=1)
    assert third["measured"] > 0 and not third.get("nothing_to_do")
    assert len(read_yaml(out / "meta.yaml")["runs"]) == 2


def test_bad_calibration_input_is_one_line(cli, tmp_path):
    for args, reason in ((["--model", "lenet5"], "--model needs --batch"),
                         (["--model", "lenet5", "--batch", "2", "--algorithm", "fft"], "unknown cpu convolution algorithm"),
                         (["--model", "lenet5", "--batch", "2", "--set", "seq_len=8"], "no model given has a parameter"),
                         (["--model", "nonesuch", "--batch", "2"], "no such model")):
        code, out, err = cli("calibrate", "compute", "--out", tmp_path / "x", "--no-grid", *args)
        assert code == 1 and err.count("\n") == 1 and reason in err, err


@pytest.mark.slow
def test_killed_calibration_restarts_without_losing_or_repeating_rows(tmp_path):
    """A real `dlsim calibrate compute` killed by SIGKILL midway, then run again to completion."""
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "dlsim", "calibrate", "compute", "--out", str(out), "--model", "resnet18",
           "--batch", "1", "--no-grid", "--repeats", "2", "--no-flush-cache", "-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    conv = out / "conv.csv"
    deadline = time.time() + 120
    while time.time() < deadline and (not conv.exists() or len(conv.read_text().splitlines()) < 15):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {name: (out / name).read_text() for name in ("gemm.csv", "conv.csv", "memory.csv")}
    kept = {name: [line for line in text.splitlines(keepends=True) if line.endswith("\n")]
            for name, text in before.items()}
    assert len(kept["conv.csv"]) > 10
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    for name, lines in kept.items():
        after = (out / name).read_text().splitlines(keepends=True)
        assert after[:len(lines)] == lines  # every row measured before the kill is still there, unchanged
        keys = [tuple(r[c] for c in KEYS[name.split(".")[0]]) for r in csv.DictReader(after)]
        assert len(keys) == len(set(keys))  # and none was measured twice
    full = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert "nothing to do" in full.stdout


def test_odd_gemms_are_off_powers_of_two_capped_deterministic_and_disjoint_from_heldout():
    from dlsim.calibrate.compute_plan import halton, odd_gemms
    from dlsim.cost.lookup import GemmRow
    from dlsim.validate.compute_heldout import heldout_gemms
    assert [halton(i, 2) for i in (1, 2, 3)] == [0.5, 0.25, 0.75] and halton(1, 3) == pytest.approx(1 / 3)
    odd = odd_gemms(64, max_dim=256, max_flops=2.0 * 64**3)
    assert len(odd) == 64 and odd == odd_gemms(64, max_dim=256, max_flops=2.0 * 64**3)
    for g in odd:
        assert 2.0 * g.m * g.n * g.k <= 2.0 * 64**3
        assert all(d == 1 or d & (d - 1) for d in (g.m, g.n, g.k))  # no power of two ≥ 2
    tasks = gemm_grid(["fp32"], max_dim=256, max_flops=2.0 * 64**3, attention=False, odd=64)
    assert [t.gemm for t in tasks if t.set == "odd"] == sorted(odd, key=lambda g: (g.flops, g.m, g.n, g.k))
    rows = [GemmRow("fp32", t.gemm.m, t.gemm.n, t.gemm.k, 1, 1e-5, set=t.set) for t in tasks]
    held = heldout_gemms(rows, "fp32", 40, seed=0)
    assert held and not {(g.m, g.n, g.k) for g in held} & {(g.m, g.n, g.k) for g in odd}


def test_calibration_leaves_the_thread_count_alone(monkeypatch):
    """Any torch.set_num_threads call, even to the count in use, left CPU flash attention 1.6-1.7x slower
    for the rest of the process (torch 2.13): the calibrating process sets it only when it changes, and the
    fresh-memory probe runs each thread count in a process of its own."""
    torch = pytest.importorskip("torch")
    from dlsim.calibrate import alloc_probe
    from dlsim.calibrate.compute_timer import set_threads

    calls = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    assert set_threads(None) == torch.get_num_threads() and set_threads(torch.get_num_threads()) == torch.get_num_threads()
    assert calls == []
    set_threads(torch.get_num_threads() + 1)
    assert calls == [torch.get_num_threads() + 1]
    fresh = []
    monkeypatch.setattr(alloc_probe, "call_in_fresh_process", lambda fn, *args, what: fresh.append(args) or 1e-9)
    rows = alloc_probe.fresh_memory_rows(2, repeats=1)
    assert [r["quantity"] for r in rows] == ["fresh_memory_s_per_byte_t1", "fresh_memory_s_per_byte_t2"]
    assert fresh == [(1, 1), (2, 1)] and calls == [torch.get_num_threads() + 1]


def test_ctrl_c_says_how_to_resume(cli, tmp_path, monkeypatch):
    """Ctrl-C said `error: aborted` (exit 1) without saying that a rerun resumes (issue 34)."""
    import dlsim.cli.calibrate_compute as command

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(command, "calibrate_compute", interrupted)
    out = tmp_path / "my profile"
    code, _, err = cli("calibrate", "compute", "--out", out, "--model", "lenet5", "--batch", "2")
    assert code == 130 and "aborted" not in err and len(err.strip().splitlines()) == 1
    assert f"to resume, rerun: dlsim calibrate compute --out '{out}' --model lenet5 --batch 2" in err
