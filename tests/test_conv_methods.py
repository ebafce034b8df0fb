"""Convolution methods: Table 6 formulas by hand, runtime multiplicities, workspaces, and the real NumPy kernels
checked against each other, against PyTorch, and against the workspace they declare."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from dlsim.calibrate.conv_check import TOLERANCE, check_layers, operands, relative_error, run_all, torch_reference
from dlsim.calibrate.conv_numpy import run_pass, workspace_size
from dlsim.calibrate.conv_winograd import winograd_matrices
from dlsim.calibrate.conv_workspace import Workspace, WorkspaceTooSmall, arena_bytes
from dlsim.cost.conv_methods import (PASSES, applicable, conv_geometry, conv_method_costs, fast_len, fft_size,
                                     geometry_from_dict, method_pass_cost, table6_depth, table6_work, winograd_alpha,
                                     workspace_buffers)
from dlsim.cost.layers import layer_cost
from dlsim.spec.model import build_model


def test_winograd_alpha_is_m_plus_r_minus_1():
    # Appendix B.4: the input tile of F(2x2, 3x3) is 4x4 (Table 6's "m - r + 1" would give 0)
    assert winograd_alpha(2, 3) == 4 and winograd_alpha(4, 3) == 6 and winograd_alpha(2, 5) == 6


def test_table6_work_by_hand():
    # direct / im2col: N*C_out*H'*W'*C_in*Ky*Kx = 2*8*4*4*3*3*3
    assert table6_work("direct", 2, 3, 4, 4, 8, 3, 3) == 2 * 8 * 16 * 3 * 9 == 6912
    assert table6_work("im2col", 2, 3, 4, 4, 8, 3, 3) == 6912
    # FFT, c = 1, HW = 16: 16*4*(8*3 + 2*3 + 2*8) + 16*2*3*8 = 64*46 + 768
    assert table6_work("fft", 2, 3, 4, 4, 8, 3, 3) == 64 * 46 + 768 == 3712
    # Winograd F(2,3): alpha = 4, alpha*(9 + 12 + 32 + 8 + 4) = 260; P = 2*2*2 = 8; + 8*3*8
    assert table6_work("winograd", 2, 3, 4, 4, 8, 3, 3) == 260 + 192


def test_table6_depth_by_hand():
    assert table6_depth("direct", 64, 56, 56, 3, 3) == 6 + 2 + 2
    assert table6_depth("fft", 64, 56, 56, 3, 3) == 2 * 12 + 6          # ceil(log2 3136) = 12
    assert table6_depth("winograd", 64, 56, 56, 3, 3) == 2 * 2 + 4 * 2 + 6


def test_runtime_multiplicity_winograd_work_by_hand():
    g = conv_geometry(1, 2, 4, 4, 3, 3, 3, padding=1)     # H' = W' = 4, P = 1*2*2 = 4, alpha = 4
    c = method_pass_cost("winograd", "forward", g)
    kernel = 3 * 2 * (9 * 4 + 16 * 3)          # C_out*C_in*(r²α + α²r)
    data = 4 * 2 * 2 * 64                      # P*C_in*2α³
    output = 3 * 4 * (16 * 2 + 4 * 4)          # C_out*P*(α²m + m²α)
    gemm = 16 * 3 * 2 * 4                      # α²*C_out*C_in*P
    assert c.work == kernel + data + output + gemm
    assert c.matmul_flops == 2 * gemm and c.flops == 2 * (kernel + data + output + gemm)


def test_winograd_f2x3_saves_2_25x_multiplies():
    g = conv_geometry(8, 64, 56, 56, 64, 3, 3, padding=1)
    direct = method_pass_cost("direct", "forward", g).work
    wino = method_pass_cost("winograd", "forward", g)
    assert direct / (wino.matmul_flops / 2) == pytest.approx(36 / 16)   # Lavin & Gray: 36 -> 16 per tile


def test_direct_depths_follow_table4():
    g = conv_geometry(32, 64, 14, 14, 128, 3, 3, padding=1)
    assert method_pass_cost("direct", "forward", g).depth == 6 + 2 + 2
    assert method_pass_cost("direct", "backward_data", g).depth == 7 + 2 + 2
    assert method_pass_cost("direct", "backward_weight", g).depth == 5 + 4 + 4
    assert method_pass_cost("im2col", "forward", g).depth == math.ceil(math.log2(64 * 9))


def test_fast_len_is_5_smooth():
    assert [fast_len(n) for n in (1, 2, 7, 15, 17, 29, 31, 97, 121)] == [1, 2, 8, 15, 18, 30, 32, 100, 125]


def test_workspaces_by_hand():
    g = conv_geometry(4, 16, 14, 14, 32, 3, 3, padding=1)
    assert method_pass_cost("im2col", "forward", g).workspace_bytes == 4 * 16 * 9 * 196 * 4
    assert method_pass_cost("im2col", "backward_weight", g).workspace_bytes == (4 * 16 * 9 * 196 + 32 * 16 * 9) * 4
    assert method_pass_cost("direct", "forward", g).workspace_bytes == 0           # Algorithm 3: in place
    assert (method_pass_cost("direct", "forward", g, implementation="numpy").workspace_bytes
            == (9 * 32 * 16 + 16 * 196 + 32 * 196) * 4)                           # one sample's scratch
    hf, wf = fft_size(g)
    assert (hf, wf) == (15, 15)
    bins = 15 * 8
    fwd = (15 * 15 * 16 * 32 + 2 * bins * 16 * 32 + 15 * 15 * 4 * 16 + 2 * bins * 4 * 16 + 2 * bins * 4 * 32
           + 15 * 15 * 4 * 32) * 4
    assert method_pass_cost("fft", "forward", g).workspace_bytes == fwd
    pointwise = conv_geometry(4, 16, 14, 14, 32, 1, 1)
    assert method_pass_cost("im2col", "forward", pointwise).workspace_bytes == 0
    # im2col grows with the batch, the direct method's per-sample buffers do not
    assert (method_pass_cost("im2col", "forward", g.with_batch(8)).workspace_bytes
            == 2 * method_pass_cost("im2col", "forward", g).workspace_bytes)
    assert (method_pass_cost("direct", "forward", g.with_batch(8), implementation="numpy").workspace_bytes
            == method_pass_cost("direct", "forward", g, implementation="numpy").workspace_bytes)


def test_applicability():
    assert applicable("fft", conv_geometry(1, 3, 8, 8, 4, 3, 3, stride=2)) == "fft needs stride 1 and dilation 1"
    assert applicable("winograd", conv_geometry(1, 3, 8, 8, 4, 3, 1)).startswith("winograd needs a square")
    assert applicable("fft", conv_geometry(1, 4, 8, 8, 4, 3, 3, groups=2)) == "fft needs groups=1"
    costs = conv_method_costs(2, 4, 8, 8, 4, 3, 3, stride=2, padding=1, dtype_bytes=2)
    assert sorted(costs) == ["direct", "im2col"] and sorted(costs["direct"]) == sorted(PASSES)
    with pytest.raises(ValueError):
        conv_geometry(1, 3, 2, 2, 4, 5, 5)


def test_geometry_from_layer_cost():
    model = build_model("t", "fp32", (3, 16, 16), "tensor",
                        [{"name": "c", "type": "conv2d", "out_channels": 8, "kernel": 3, "stride": 2, "padding": 1}])
    g = geometry_from_dict(layer_cost(model.layers[0], 5).conv)
    assert (g.n, g.c_in, g.h, g.c_out, g.k_h, g.stride_h, g.pad_h, g.h_out) == (5, 3, 16, 8, 3, 2, 1, 8)
    assert g.signature == "conv3x16x16-8-k3x3-s2x2-p1x1-d1x1-g1"


def test_winograd_matrices_compute_1d_correlation():
    rng = np.random.default_rng(1)
    for m, r in ((2, 3), (4, 3), (3, 2), (2, 5)):
        at, g, bt = winograd_matrices(m, r)
        d, w = rng.standard_normal(m + r - 1), rng.standard_normal(r)
        expect = np.array([sum(d[i + k] * w[k] for k in range(r)) for i in range(m)])
        assert np.allclose(at @ ((g @ w) * (bt @ d)), expect)


# --- the real NumPy kernels -----------------------------------------------------------------

GEOMETRIES = [  # n, c_in, h, w, c_out, k_h, k_w, stride, padding, dilation
    (2, 3, 7, 6, 4, 3, 3, 1, 1, 1), (2, 5, 8, 8, 3, 3, 3, 1, 0, 1), (1, 4, 9, 7, 2, 1, 1, 1, 0, 1),
    (2, 3, 9, 9, 5, 3, 3, 2, 1, 1), (2, 3, 10, 9, 4, 3, 2, 2, 1, 2), (1, 2, 11, 11, 3, 5, 5, 1, 2, 1),
    (3, 4, 6, 6, 2, 1, 1, 2, 0, 1), (2, 3, 7, 7, 4, 2, 2, 1, 1, 1),
]


def _tensors(g, seed=0):
    return operands(g, seed)


@pytest.mark.parametrize("args", GEOMETRIES)
def test_numpy_methods_agree_with_each_other(args):
    g = conv_geometry(*args)
    results = run_all(g, *_tensors(g))
    for (method, p), res in results.items():
        assert relative_error(res, results["direct", p]) <= TOLERANCE, (method, p)


@pytest.mark.torch
@pytest.mark.parametrize("args", GEOMETRIES)
def test_numpy_methods_match_pytorch(args):
    pytest.importorskip("torch")
    g = conv_geometry(*args)
    x, w, dy = _tensors(g, seed=3)
    refs = torch_reference(g, x, w, dy)
    for (method, p), res in run_all(g, x, w, dy).items():
        assert relative_error(res, refs[p]) <= TOLERANCE, (method, p)


@pytest.mark.torch
def test_check_layers_covers_every_applicable_algorithm_and_pass():
    pytest.importorskip("torch")
    layers = [("a", conv_geometry(1, 3, 6, 6, 4, 3, 3, 1, 1)), ("s", conv_geometry(1, 3, 9, 9, 2, 3, 3, 2, 1))]
    rows = check_layers(layers, batch=2)
    assert {(r.layer, r.algorithm) for r in rows} == {("a", m) for m in ("direct", "im2col", "fft", "winograd")} | {
        ("s", "direct"), ("s", "im2col")}
    assert len(rows) == 6 * 3 and all(r.ok and r.vs_torch is not None for r in rows)
    assert all(r.vs_direct == 0.0 for r in rows if r.algorithm == "direct")
    bad = np.ones((2, 2), np.float32)
    assert relative_error(bad, np.zeros((2, 2))) == 1.0 and relative_error(3 * bad, 2 * bad) == 0.5


def test_backward_weight_accumulates_across_microbatches():
    g = conv_geometry(4, 3, 8, 8, 4, 3, 3, padding=1)
    x, w, dy = _tensors(g)
    for method in ("direct", "im2col", "fft", "winograd"):
        whole = np.empty_like(w)
        run_pass(method, "backward_weight", g, Workspace(workspace_size(method, "backward_weight", g)),
                 x=x, dy=dy, w=w, out=whole)
        half = g.with_batch(2)
        ws = Workspace(workspace_size(method, "backward_weight", half))
        split = np.empty_like(w)
        run_pass(method, "backward_weight", half, ws, x=x[:2], dy=dy[:2], w=w, out=split)
        run_pass(method, "backward_weight", half, ws, x=x[2:], dy=dy[2:], w=w, out=split, accumulate=True)
        assert np.allclose(split, whole, atol=1e-4), method


def test_too_small_workspace_is_refused():
    g = conv_geometry(2, 3, 8, 8, 4, 3, 3, padding=1)
    x, w, dy = _tensors(g)
    need = workspace_size("im2col", "forward", g)
    assert need == arena_bytes(workspace_buffers("im2col", "forward", g, implementation="numpy"))
    with pytest.raises(WorkspaceTooSmall, match="needs"):
        run_pass("im2col", "forward", g, Workspace(need - 64), x=x, w=w, out=np.empty_like(dy))


@pytest.mark.parametrize("method", ["direct", "im2col", "fft", "winograd"])
def test_declared_workspace_is_all_the_temporary_memory(method):
    """tracemalloc sees NumPy's buffers: beyond the arena a pass allocates at most NumPy's fixed ufunc
    buffers (8192 elements per operand) and, for FFT's ∇w, one weight-sized gather."""
    g = conv_geometry(8, 16, 20, 20, 24, 3, 3, padding=1)
    x, w, dy = _tensors(g)
    for p in PASSES:
        shape = {"forward": dy.shape, "backward_data": x.shape, "backward_weight": w.shape}[p]
        out = np.empty(shape, np.float32)
        ws = Workspace(workspace_size(method, p, g))
        run_pass(method, p, g, ws, x=x, w=w, dy=dy, out=out)
        tracemalloc.start()
        run_pass(method, p, g, ws, x=x, w=w, dy=dy, out=out)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak <= 160 * 1024 + w.nbytes, (p, peak, ws.nbytes)
        assert ws.nbytes > 4 * peak or method == "direct", (p, peak, ws.nbytes)
