"""Calibration of the NumPy kernels (resumable) and real execution of plans on tiny shapes."""

from __future__ import annotations

import numpy as np
import pytest

from dlsim.calibrate.conv_numpy import run_pass, workspace_size
from dlsim.calibrate.conv_workspace import Workspace, WorkspaceTooSmall
from dlsim.calibrate.microbatch_bench import bench_layers
from dlsim.calibrate.microbatch_exec import PlanRunner, execute_plan
from dlsim.cost.conv_methods import conv_geometry
from dlsim.io.bench_table import load_bench_table
from dlsim.plan.microbatch import BenchTable, Kernel, KernelTable, plan_wd, plan_wr

TINY = """
name: tiny
input: {shape: [4, 8, 8]}
layers:
  - {name: a, type: conv2d, out_channels: 6, kernel: 3, padding: 1}
  - {name: r, type: relu}
  - {name: b, type: conv2d, out_channels: 6, kernel: 3, padding: 1}
  - {name: c, type: conv2d, out_channels: 5, kernel: 1}
"""
LAYERS = [("a", conv_geometry(1, 4, 8, 8, 6, 3, 3, padding=1)), ("b", conv_geometry(1, 6, 8, 8, 6, 3, 3, padding=1)),
          ("c", conv_geometry(1, 6, 8, 8, 5, 1, 1))]


def test_bench_layers_measures_each_shape_once_and_resumes():
    emitted = []
    rows = bench_layers(LAYERS, 4, (1, 2, 4), repeats=1, min_samples=1, prune=False, emit=emitted.append)
    assert rows and sum(len(e) for e in emitted) == len(rows)
    keys = {(layer, p, k.size, k.algorithm) for layer, p, k in rows}
    assert ("c", "forward", 4, "winograd") not in keys and ("b", "forward", 4, "winograd") in keys
    assert {k.workspace_bytes for layer, p, k in rows if k.algorithm == "im2col" and layer == "a" and p == "forward"} == {
        workspace_size("im2col", "forward", LAYERS[0][1].with_batch(b)) for b in (1, 2, 4)}
    done = {(layer, p, k.size, k.algorithm): k for layer, p, k in rows}
    assert bench_layers(LAYERS, 4, (1, 2, 4), done=done, repeats=1, min_samples=1, prune=False) == []


def test_calibrate_cli_writes_and_resumes(tmp_path, cli):
    model = tmp_path / "tiny.yaml"
    model.write_text(TINY)
    out = tmp_path / "t.csv"
    code, stdout, err = cli("calibrate", "microbatch", model, "--batch", 2, "--out", out, "--repeats", 1,
                            "--layers", "a,c", "--threads", 1, "--no-prune")
    assert code == 0, err
    first = out.read_text()
    table = load_bench_table(out)
    assert table.layers() == ["a", "c"] and "rows for 2 layers" in stdout
    code, stdout, err = cli("calibrate", "microbatch", model, "--batch", 2, "--out", out, "--repeats", 1,
                            "--layers", "a,c", "--no-prune")
    assert code == 0 and out.read_text() == first                # nothing re-measured, nothing rewritten
    code, stdout, err = cli("plan", "microbatch", model, "--bench-table", out, "--batch", 2, "--json", "--layers", "a,c")
    assert code == 0, err


def _reference(g1, tensors, batch):
    g = g1.with_batch(batch)
    out = {}
    for p, shape in (("forward", tensors.y.shape), ("backward_data", tensors.dx.shape), ("backward_weight", tensors.w.shape)):
        res = np.empty(shape, np.float32)
        run_pass("direct", p, g, Workspace(workspace_size("direct", p, g)), x=tensors.x, w=tensors.w, dy=tensors.dy,
                 out=res)
        out[p] = res
    return out


@pytest.mark.parametrize("mode", ["wr", "wd"])
def test_executed_plan_computes_the_whole_batch(mode):
    rows = bench_layers(LAYERS, 4, (1, 2, 4), repeats=1, min_samples=1, prune=False)
    table = BenchTable.from_rows(rows)
    limit = 64 * 1024 if mode == "wr" else 6 * 64 * 1024
    plan = plan_wr(table, 4, limit) if mode == "wr" else plan_wd(table, 4, limit)
    runner = PlanRunner(plan, dict(LAYERS))
    runner.run_once()
    for name, g1 in LAYERS:
        t = runner.tensors[name]
        ref = _reference(g1, t, 4)
        assert np.allclose(t.y, ref["forward"], atol=1e-4)
        assert np.allclose(t.dx, ref["backward_data"], atol=1e-4)
        assert np.allclose(t.dw, ref["backward_weight"], atol=1e-3)
    rec = execute_plan(plan, dict(LAYERS), repeats=2)
    assert rec["measured_time_s"] > 0 and len(rec["repetitions_s"]) == 2
    assert rec["predicted_time_s"] == pytest.approx(plan.time_s)
    assert len(rec["kernels"]) == 9


def test_workspace_limit_is_enforced_at_run_time():
    """A table that under-reports im2col's workspace gets a plan that cannot run in the limit's arena."""
    g1 = LAYERS[0][1]
    lying = KernelTable("a", "forward", (Kernel("im2col", 2, 1e-6, 0.0), Kernel("direct", 2, 1.0, 0.0)))
    plan = plan_wr(BenchTable((lying,)), 2, 1024.0)
    assert plan.layer("a").get("forward").microbatches[0].algorithm == "im2col"
    with pytest.raises(WorkspaceTooSmall, match="needs"):
        execute_plan(plan, {"a": g1}, repeats=1)


def test_bench_layers_stops_between_configurations_and_resumes():
    """A time-boxed chunk (`stop`) keeps what it measured; the next run measures exactly the rest."""
    calls = []
    first = bench_layers(LAYERS[:1], 2, (1, 2), repeats=1, min_samples=1, prune=False,
                         stop=lambda: calls.append(1) or len(calls) > 3)
    assert len(first) == 3
    done = {(layer, p, k.size, k.algorithm): k for layer, p, k in first}
    rest = bench_layers(LAYERS[:1], 2, (1, 2), done=done, repeats=1, min_samples=1, prune=False)
    whole = {(layer, p, k.size, k.algorithm) for layer, p, k in first + rest}
    assert len(whole) == len(first) + len(rest) == 3 * 2 * 4       # passes x sizes x algorithms, nothing twice


def test_speedup_figure_from_records(tmp_path):
    from dlsim.report.microbatch_plots import plot_speedup_vs_limit
    sweep = {"mode": "wr", "limits_bytes": [2 ** 20, 2 ** 21], "series": [
        {"policy": "undivided", "speedup": [1.0, 1.0]}, {"policy": "powerOfTwo", "speedup": [None, 1.3]}]}
    path = tmp_path / "s.png"
    plot_speedup_vs_limit([sweep], [{"mode": "wr", "limit_bytes": 2 ** 21, "speedup": 1.2}], path, title="t")
    assert path.read_bytes()[:4] == b"\x89PNG"
