"""Measured-table lookup: exact hits, interpolation in log space, marked extrapolation, table loading."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dlsim.cost.layers import Gemm, PassCost, layer_cost
from dlsim.cost.lookup import (CONV_COLUMNS, GEMM_COLUMNS, MEMORY_COLUMNS, ConvRow, GemmRow, MeasuredKernelTimes,
                               MemoryRow, bracket, conv_shape, loglog, record, shape_of)
from dlsim.cost.pricing import price_pass
from dlsim.errors import SpecError
from dlsim.io.kernel_tables import load_kernel_times, read_table
from dlsim.io.profile_write import add_tables
from dlsim.io.profile_yaml import load_profile
from dlsim.results import Source
from dlsim.spec.model import build_model
from dlsim.calibrate.compute_fit import fit_gemm, fit_memory, relative_line

AXIS = [1, 4, 16, 64, 256]


def rate(m: float, n: float, k: float) -> float:
    """A throughput whose log is multilinear in (log m, log n, log k): grid interpolation is exact for it."""
    lm, ln, lk = math.log(m), math.log(n), math.log(k)
    return math.exp(20 + 0.3 * lm + 0.2 * ln + 0.25 * lk - 0.01 * lm * lk)


def grid_rows(skip: set[tuple[int, int, int]] = frozenset()) -> list[GemmRow]:
    return [GemmRow("fp32", m, n, k, 1, 2.0 * m * n * k / rate(m, n, k)) for m in AXIS for n in AXIS for k in AXIS
            if (m, n, k) not in skip]


def test_bracket_and_loglog_hand_values():
    assert bracket([1, 4, 16], 4) == ([(4, 1.0)], False)
    (lo, wlo), (hi, whi) = bracket([1, 4, 16], 8)[0]
    assert (lo, hi) == (4, 16) and wlo == pytest.approx(0.5) and whi == pytest.approx(0.5)
    assert bracket([1, 4, 16], 64) == ([(16, 1.0)], True)
    pts = [(10.0, 1.0), (1000.0, 100.0)]
    assert loglog(pts, 100.0)[0] == pytest.approx(10.0) and loglog(pts, 100.0)[1] == Source.INTERPOLATED
    assert loglog(pts, 10.0)[:2] == (1.0, Source.MEASURED)
    assert loglog(pts, 2000.0)[:2] == (pytest.approx(200.0), Source.EXTRAPOLATED)
    assert loglog(pts, 1.0)[:2] == (1.0, Source.EXTRAPOLATED)


def test_gemm_exact_hit_is_measured():
    t = MeasuredKernelTimes(grid_rows())
    e = t.gemm(Gemm(16, 64, 4), "fp32")
    assert e.source == Source.MEASURED
    assert e.seconds == pytest.approx(2 * 16 * 64 * 4 / rate(16, 64, 4))


@pytest.mark.parametrize("shape", [(8, 32, 100), (3, 200, 7), (50, 2, 130), (16, 10, 64)])
def test_gemm_multilinear_is_exact_for_multilinear_log_throughput(shape):
    t = MeasuredKernelTimes(grid_rows(), gemm_method="multilinear")
    e = t.gemm(Gemm(*shape), "fp32")
    assert e.source == Source.INTERPOLATED
    m, n, k = shape
    assert e.seconds == pytest.approx(2 * m * n * k / rate(m, n, k), rel=1e-9)


def test_gemm_interpolation_stays_inside_its_cell():
    """A kernel switch (a step in throughput) outside the cell does not change the estimate."""
    base = MeasuredKernelTimes(grid_rows(), gemm_method="multilinear")
    stepped = [GemmRow(r.dtype, r.m, r.n, r.k, 1, r.time_s * (3.0 if r.m >= 64 else 1.0)) for r in grid_rows()]
    q = Gemm(8, 32, 100)
    assert MeasuredKernelTimes(stepped, gemm_method="multilinear").gemm(q, "fp32").seconds == pytest.approx(
        base.gemm(q, "fp32").seconds)


def test_gemm_beyond_grid_is_clamped_and_extrapolated():
    t = MeasuredKernelTimes(grid_rows())
    e = t.gemm(Gemm(1024, 16, 16), "fp32")
    assert e.source == Source.EXTRAPOLATED and "edge" in e.note
    assert e.seconds == pytest.approx(2 * 1024 * 16 * 16 / rate(256, 16, 16))


def test_gemm_missing_corners_renormalise_or_extrapolate():
    q = Gemm(8, 32, 100)
    one_missing = MeasuredKernelTimes(grid_rows({(16, 64, 256)}), gemm_method="multilinear").gemm(q, "fp32")
    assert one_missing.source == Source.INTERPOLATED
    assert one_missing.seconds == pytest.approx(2 * 8 * 32 * 100 / rate(8, 32, 100), rel=0.05)
    corners = {(m, n, k) for m in (4, 16) for n in (16, 64) for k in (64, 256)}
    most = set(list(sorted(corners))[:6])
    assert MeasuredKernelTimes(grid_rows(most)).gemm(q, "fp32").source == Source.EXTRAPOLATED


def test_gemm_without_grid_scales_the_nearest_shape():
    rows = [GemmRow("fp32", 64, 64, 64, 1, 1e-3, set="model"), GemmRow("fp32", 512, 512, 512, 1, 0.1, set="model")]
    e = MeasuredKernelTimes(rows).gemm(Gemm(64, 64, 128), "fp32")
    assert e.source == Source.EXTRAPOLATED and e.seconds == pytest.approx(2e-3)
    assert MeasuredKernelTimes(rows).gemm(Gemm(8, 8, 8), "bf16") is None
    nearest = MeasuredKernelTimes(grid_rows(), gemm_method="nearest").gemm(Gemm(8, 32, 100), "fp32")
    assert nearest.source == Source.EXTRAPOLATED


def test_batched_gemm():
    rows = grid_rows() + [GemmRow("fp32", 16, 16, 64, 4, 1e-4), GemmRow("fp32", 16, 16, 64, 16, 4e-4)]
    t = MeasuredKernelTimes(rows)
    assert t.gemm(Gemm(16, 16, 64, 4), "fp32").source == Source.MEASURED
    mid = t.gemm(Gemm(16, 16, 64, 8), "fp32")
    assert mid.source == Source.INTERPOLATED and mid.seconds == pytest.approx(2e-4)
    single = t.gemm(Gemm(4, 4, 4), "fp32").seconds
    e = t.gemm(Gemm(4, 4, 4, 3), "fp32")
    assert e.source == Source.EXTRAPOLATED and e.seconds == pytest.approx(3 * single)


SHAPE = conv_shape(64, 56, 56, 64, 3, 3, 1, 1, 1, 1)


def geometry(n: int, shape=SHAPE) -> dict:
    s = shape
    return {"n": n, "c_in": s.c_in, "h": s.h, "w": s.w, "c_out": s.c_out, "k_h": s.k_h, "k_w": s.k_w,
            "stride": (s.stride_h, s.stride_w), "padding": (s.pad_h, s.pad_w), "dilation": (s.dil_h, s.dil_w),
            "groups": s.groups}


def conv_table(default: str | None = "mkldnn") -> MeasuredKernelTimes:
    rows = [ConvRow("fp32", "forward", "mkldnn", 2, SHAPE, 0.02), ConvRow("fp32", "forward", "mkldnn", 8, SHAPE, 0.08),
            ConvRow("fp32", "forward", "native", 2, SHAPE, 0.01)]
    return MeasuredKernelTimes(conv=rows, conv_algorithm=default)


def test_conv_lookup():
    t = conv_table()
    assert t.conv("forward", geometry(2), "fp32").seconds == 0.02  # the default algorithm, not the fastest
    mid = t.conv("forward", geometry(4), "fp32")
    assert mid.source == Source.INTERPOLATED and mid.seconds == pytest.approx(0.04)
    big = t.conv("forward", geometry(16), "fp32")
    assert big.source == Source.EXTRAPOLATED and big.seconds == pytest.approx(0.16)
    assert conv_table(None).conv("forward", geometry(2), "fp32").seconds == 0.01  # fastest
    assert t.conv("backward_data", geometry(2), "fp32") is None
    other = conv_shape(64, 56, 56, 128, 3, 3, 1, 1, 1, 1)
    assert t.conv("forward", geometry(2, other), "fp32") is None


def test_conv_geometry_from_layer_cost_matches_table_shape():
    model = build_model("c", "fp32", (64, 56, 56), "tensor",
                        [{"name": "c", "type": "conv2d", "out_channels": 64, "kernel": 3, "padding": 1}])
    cost = layer_cost(model.layers[0], 2)
    assert shape_of(cost.conv) == SHAPE
    e = price_pass(cost.forward, "conv2d", "forward", load_profile("dgx-h100").device, "fp32", conv_table(), cost.conv)
    assert e.source == Source.MEASURED and e.seconds == 0.02


def test_memory_bound_lookup_and_optimizer_step():
    rows = [MemoryRow("fp32", "relu", "forward", "a", 1000, 250, 1e-5), MemoryRow("fp32", "relu", "forward", "b", 100000, 25000, 1e-3),
            MemoryRow("fp32", "adam", "step", "adam|p100|t2", 2800, 1200, 5e-5),
            MemoryRow("fp32", "adam", "step", "adam|p10000|t4", 280000, 120000, 5e-4)]
    t = MeasuredKernelTimes(memory=rows)
    exact = t.memory_bound("relu", "forward", PassCost(flops=250, bytes_read=500, bytes_written=500), "fp32")
    assert exact.source == Source.MEASURED and exact.seconds == 1e-5
    mid = t.memory_bound("relu", "forward", PassCost(flops=1, bytes_read=5000, bytes_written=5000), "fp32")
    assert mid.source == Source.INTERPOLATED and mid.seconds == pytest.approx(1e-4)
    assert t.memory_bound("gelu", "forward", PassCost(bytes_read=10), "fp32") is None
    assert t.optimizer_step("adam", 100, 2).source == Source.MEASURED
    step = t.optimizer_step("adam", 1000, 3)
    assert step.source == Source.INTERPOLATED and step.seconds == pytest.approx(math.sqrt(5e-5 * 5e-4))
    assert t.optimizer_step("sgd", 100, 2) is None


def write_profile(folder: Path, gemm: list[GemmRow] = (), conv: list[ConvRow] = (), memory: list[MemoryRow] = (),
                  extra: str = "") -> Path:
    import csv
    folder.mkdir(parents=True, exist_ok=True)
    for name, columns, rows in (("gemm.csv", GEMM_COLUMNS, gemm), ("conv.csv", CONV_COLUMNS, conv),
                                ("memory.csv", MEMORY_COLUMNS, memory)):
        with open(folder / name, "w", newline="") as handle:
            w = csv.DictWriter(handle, columns)
            w.writeheader()
            for r in rows:
                w.writerow(record(r))
    (folder / "profile.yaml").write_text(
        "# a user's comment\nname: tiny\ndevice: {name: cpu, peak_tflops: {fp32: 0.2}, memory_gib: 8,\n"
        "  memory_bandwidth_gbytes_per_s: 20, launch_overhead_us: 5}\n"
        "intra_node: {name: none, latency_us: 0, bandwidth_gbytes_per_s: 20}\n" + extra)
    return folder


def test_tables_round_trip_and_estimate_uses_them(tmp_path):
    from dlsim.api.estimate import estimate
    model = build_model("mlp", "fp32", (32,), "tensor", [{"name": "fc", "type": "linear", "out_features": 16, "bias": False},
                                                          {"name": "loss", "type": "cross_entropy"}])
    cost = layer_cost(model.layers[0], 4)
    gemms = [GemmRow("fp32", g.m, g.n, g.k, 1, t, set="model")
             for t, g in zip((1e-5, 2e-5, 3e-5), [cost.forward.gemms[0], cost.backward_data.gemms[0],
                                                  cost.backward_weight.gemms[0]])]
    folder = write_profile(tmp_path / "p", gemms, extra="tables: {gemm: gemm.csv, conv: conv.csv, memory: memory.csv}\n")
    assert read_table("gemm", folder / "gemm.csv") == gemms
    times, notes = load_kernel_times(load_profile(folder))
    assert "3 GEMM" in notes[0]
    result = estimate(model, folder, 4, optimizer="sgd")
    fc = result.layers[0]
    # fc reads the model input: no ∇x; forward and ∇w come from the table
    assert (fc.forward.seconds, fc.backward_data.seconds, fc.backward_weight.seconds) == (1e-5, 0.0, 3e-5)
    assert fc.forward.source == Source.MEASURED


@pytest.mark.parametrize("text, reason", [
    ("dtype,m,n,k,count,time_s,iqr_s,repeats\n", "missing column 'set'"),
    ("dtype,m,n,k,count,time_s,iqr_s,repeats,set\nfp32,4,4,x,1,1e-5,0,5,grid\n", "k must be a number"),
    ("dtype,m,n,k,count,time_s,iqr_s,repeats,set\nfp32,4,4,4,1,-1,0,5,grid\n", "time_s must be a positive"),
    ("dtype,m,n,k,count,time_s,iqr_s,repeats,set\nfp99,4,4,4,1,1e-5,0,5,grid\n", "dtype 'fp99' is not one of"),
    ("dtype,m,n,k,count,time_s,iqr_s,repeats,set\nfp32,4,4,4,1,1e-5,0,5,grid\nfp32,4,4,4,1,2e-5,0,5,model\n",
     "duplicate row (first on line 2)"),
    ("dtype,m,n,k,count,time_s,iqr_s,repeats,set\nfp32,4,4,4,1,1e-5,0,5,even\n", "set 'even' is not one of"),
    ("", "empty file"),
])
def test_malformed_tables_are_one_line_errors(tmp_path, text, reason):
    path = tmp_path / "gemm.csv"
    path.write_text(text)
    with pytest.raises(SpecError) as exc:
        read_table("gemm", path)
    assert reason in str(exc.value) and "\n" not in str(exc.value)


def test_cli_reports_a_missing_table_on_one_line(tmp_path, cli):
    folder = write_profile(tmp_path / "p", extra="tables: {gemm: nowhere.csv}\n")
    code, out, err = cli("estimate", "lenet5", "--cluster", folder)
    assert code == 1 and err.count("\n") == 1 and "cannot read gemm table" in err


def test_add_tables_keeps_what_the_user_wrote(tmp_path):
    for extra, kept in [("", None), ("tables:\n  comm: allreduce.csv   # mine\n", "comm"),
                        ("tables: {gemm: my-gemm.csv}  # mine\n", "gemm")]:
        folder = write_profile(tmp_path / f"p{len(extra)}", extra=extra)
        path = folder / "profile.yaml"
        changes = add_tables(path, {"gemm": "gemm.csv", "conv": "conv.csv"})
        text = path.read_text()
        assert text.startswith("# a user's comment\n")
        tables = dict(load_profile(folder).tables)
        assert set(tables) >= {"gemm", "conv"}
        if kept == "gemm":
            assert tables["gemm"].endswith("my-gemm.csv") and any("kept your" in c for c in changes)
        if kept == "comm":
            assert "# mine" in text and tables["comm"].endswith("allreduce.csv")
        assert add_tables(path, {"gemm": "gemm.csv", "conv": "conv.csv"}) == [c for c in changes if "kept" in c]


def test_relative_line_and_roofline_fit_recover_their_parameters():
    a, b = relative_line([1.0, 2.0, 4.0], [3.0, 5.0, 9.0])
    assert (a, b) == (pytest.approx(2.0), pytest.approx(1.0))
    peak, eff, half, launch = 1e11, 0.8, 2e6, 5e-6
    rows = []
    for s in (8, 32, 128, 512):
        w = 2.0 * s ** 3
        rows.append(GemmRow("fp32", s, s, s, 1, w / (peak * eff * w / (w + half)) + launch))
    fit = fit_gemm(rows, "fp32", launch)
    assert fit.peak_flops * fit.efficiency == pytest.approx(peak * eff)
    assert fit.efficiency == 1.0  # the asymptote is above every measured throughput
    assert fit.half_flops == pytest.approx(half) and fit.median_abs_rel_error < 1e-9
    mem = [MemoryRow("fp32", "relu", "forward", str(q), q, 0, q / (20e9 * 0.5) + launch) for q in (1e4, 1e6, 1e8)]
    assert fit_memory(mem, 20e9, launch).efficiency == pytest.approx(0.5)
