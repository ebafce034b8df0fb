"""Calibration in shuffled passes: every kernel once per pass, the minimum (or median) over passes kept."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch
pytest.importorskip("torch")

from dlsim.calibrate.compute_passes import combine_passes, pass_dir, run_passes, shuffled
from dlsim.calibrate.compute_plan import GemmTask, OptimizerTask, memory_sweep
from dlsim.calibrate.compute_run import Backend
from dlsim.calibrate.compute_timer import KernelTimer
from dlsim.cost.layers import Gemm

COLUMNS = "dtype,m,n,k,count,time_s,iqr_s,repeats,set"


def rows(path: Path) -> list[dict]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def write_pass(out: Path, index: int, lines: list[str]) -> None:
    d = pass_dir(out, index)
    d.mkdir(parents=True, exist_ok=True)
    (d / "gemm.csv").write_text("\n".join([COLUMNS, *lines]) + "\n")


def test_combination_takes_the_statistic_over_passes_the_spread_and_all_repeats(tmp_path):
    write_pass(tmp_path, 1, ["fp32,2,3,4,1,3e-06,1e-07,5,grid", "fp32,8,8,8,1,9e-06,0,5,grid"])
    write_pass(tmp_path, 2, ["fp32,2,3,4,1,2e-06,1e-07,5,grid"])  # 8x8x8 not measured yet in this pass
    write_pass(tmp_path, 3, ["fp32,2,3,4,1,5e-06,1e-07,3,grid", "fp32,8,8,8,1,7e-06,0,5,grid"])
    assert combine_passes(tmp_path, 3, statistic="min") == (1, 0)
    (row,) = rows(tmp_path / "gemm.csv")
    assert (row["m"], row["n"], row["k"]) == ("2", "3", "4")
    assert float(row["time_s"]) == pytest.approx(2e-6)
    assert float(row["iqr_s"]) == pytest.approx(3e-6)  # largest - smallest pass
    assert row["repeats"] == "13"
    assert combine_passes(tmp_path, 3) == (0, 1)  # idempotent: the row is there, nothing appended twice
    assert len(rows(tmp_path / "gemm.csv")) == 1


def test_median_over_passes_and_an_existing_row_is_kept(tmp_path):
    for i, t in enumerate(("4e-06", "1e-06", "2e-06"), start=1):
        write_pass(tmp_path, i, [f"fp32,2,3,4,1,{t},0,5,grid", f"fp32,1,1,1,1,{t},0,5,grid"])
    (tmp_path / "gemm.csv").write_text(COLUMNS + "\nfp32,1,1,1,1,9e-06,0,5,grid\n")  # measured earlier: kept
    assert combine_passes(tmp_path, 3, statistic="median") == (1, 1)
    by_shape = {(r["m"], r["n"], r["k"]): float(r["time_s"]) for r in rows(tmp_path / "gemm.csv")}
    assert by_shape == {("1", "1", "1"): 9e-6, ("2", "3", "4"): pytest.approx(2e-6)}


def test_shuffled_order_is_seeded_and_a_permutation():
    tasks = [GemmTask("fp32", Gemm(i, 1, 1)) for i in range(1, 30)]
    a, b = shuffled(tasks, 3), shuffled(tasks, 3)
    assert a == b and sorted(t.gemm.m for t in a) == list(range(1, 30)) and a != tasks
    assert shuffled(tasks, 4) != a


def test_real_passes_measure_every_kernel_per_pass_and_resume(tmp_path):
    tasks = [GemmTask("fp32", Gemm(4, 4, 4)), GemmTask("fp32", Gemm(8, 2, 4)),
             *memory_sweep(["fp32"], ops=("relu",), elements=(256,)), OptimizerTask("sgd", (8, 8), 1)]
    backend = Backend.create("cpu")
    timer = KernelTimer("cpu", repeats=2, min_block_s=1e-4, statistic="min")
    first = run_passes(tasks, tmp_path, backend, timer, 3, statistic="min")
    assert not first.failed and first.measured == len(tasks)
    for p in (1, 2, 3):
        assert len(rows(pass_dir(tmp_path, p) / "gemm.csv")) == 2
    combined = {(r["m"], r["n"], r["k"]): float(r["time_s"]) for r in rows(tmp_path / "gemm.csv")}
    per_pass = [{(r["m"], r["n"], r["k"]): float(r["time_s"]) for r in rows(pass_dir(tmp_path, p) / "gemm.csv")}
                for p in (1, 2, 3)]
    for key, t in combined.items():
        assert t == pytest.approx(min(p[key] for p in per_pass), rel=1e-8)
    device = [r["quantity"] for r in rows(tmp_path / "device.csv")]  # device numbers once, in the profile itself
    assert len(device) == len(set(device)) and \
        len([q for q in device if not q.startswith(("fresh_memory", "host_op", "heap_refault", "optimizer_in_loop"))]) == 3
    again = run_passes(tasks, tmp_path, backend, timer, 3, statistic="min")
    assert (again.measured, again.skipped) == (0, len(tasks))
