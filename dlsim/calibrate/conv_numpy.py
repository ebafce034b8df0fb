"""Real convolution algorithms in NumPy: direct, im2col + GEMM, FFT and Winograd, each in its workspace.

Every algorithm computes one pass of a 2-D convolution (cross-correlation, NCHW, fp32, one group) into
an output array the caller owns, using only the temporaries `dlsim.cost.conv_methods.workspace_buffers`
lists (``implementation="numpy"``), carved from a caller-owned `Workspace` (a too-small arena raises `WorkspaceTooSmall`):

* forward:          y = conv(x, w)
* backward_data:    ∇x = conv^T(∇y, w)
* backward_weight:  ∇w (+)= Σ_n correlation of x and ∇y (``accumulate=True`` adds, as a micro-batch
  after the first must: μ-cuDNN's β = 1 for BackwardFilter)

direct and im2col (survey Appendix B.1, B.2) are here; FFT and Winograd in `conv_fft` and
`conv_winograd`. They are checked against each other and against PyTorch in tests/test_conv_methods.py.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from dlsim.calibrate.conv_index import gather, out_range
from dlsim.calibrate.conv_workspace import Workspace, arena_bytes
from dlsim.cost.conv_methods import ConvGeometry, applicable, workspace_buffers


def _offsets(g: ConvGeometry):
    """(index, i-range, j-range) per kernel offset (u, v): output rows/cols valid for it and input starts."""
    for u in range(g.k_h):
        rows = out_range(g.h_out, g.h, u * g.dil_h - g.pad_h, g.stride_h)
        for v in range(g.k_w):
            cols = out_range(g.w_out, g.w, v * g.dil_w - g.pad_w, g.stride_w)
            yield u * g.k_w + v, rows, cols


def _gather(dst: np.ndarray, src: np.ndarray, rows: tuple, cols: tuple, g: ConvGeometry) -> None:
    gather(dst, src, rows, cols, g.stride_h, g.stride_w)


def _scatter_add(dst: np.ndarray, src: np.ndarray, rows: tuple, cols: tuple, g: ConvGeometry) -> None:
    """dst[..., i·s + offset] += src[..., i, j] over the valid range (col2im)."""
    (i0, i1, r0), (j0, j1, c0) = rows, cols
    if i1 > i0 and j1 > j0:
        dst[..., r0:r0 + (i1 - i0 - 1) * g.stride_h + 1:g.stride_h,
            c0:c0 + (j1 - j0 - 1) * g.stride_w + 1:g.stride_w] += src[..., i0:i1, j0:j1]


def _shifted_inputs(xn: np.ndarray, offsets: list, slice_: np.ndarray | None, g: ConvGeometry):
    """Per kernel offset (idx, the input window it multiplies as a (C_in, H_out·W_out) matrix): the
    sample itself for a pointwise kernel, else the window gathered into the one-sample `slice_` buffer."""
    L = g.h_out * g.w_out
    for idx, rows, cols in offsets:
        if slice_ is None:
            yield idx, xn.reshape(g.c_in, L)
        else:
            _gather(slice_, xn, rows, cols, g)
            yield idx, slice_.reshape(g.c_in, L)


def _views(method: str, pass_name: str, g: ConvGeometry, ws: Workspace) -> dict[str, np.ndarray]:
    return ws.carve(workspace_buffers(method, pass_name, g, implementation="numpy"))


# --- direct: K_y·K_x shifted GEMMs per sample -----------------------------------------------

def direct_forward(x: np.ndarray, w: np.ndarray, y: np.ndarray, g: ConvGeometry, ws: Workspace) -> None:
    b = _views("direct", "forward", g, ws)
    kk, ci, co, L = g.k_h * g.k_w, g.c_in, g.c_out, g.h_out * g.w_out
    if kk > 1:
        wk = b["weights_by_offset"].reshape(kk, co, ci)
        np.copyto(wk.reshape(g.k_h, g.k_w, co, ci), w.transpose(2, 3, 0, 1))
        prod = b["partial_output"].reshape(co, L)
    else:
        wk = w.reshape(1, co, ci)
    slice_ = None if g.pointwise else b["input_slice"].reshape(ci, g.h_out, g.w_out)
    offsets = list(_offsets(g))
    for n in range(x.shape[0]):
        yn = y[n].reshape(co, L)
        for idx, src in _shifted_inputs(x[n], offsets, slice_, g):
            if idx == 0:
                np.matmul(wk[idx], src, out=yn)
            else:
                np.matmul(wk[idx], src, out=prod)
                yn += prod


def direct_backward_data(dy: np.ndarray, w: np.ndarray, dx: np.ndarray, g: ConvGeometry, ws: Workspace) -> None:
    b = _views("direct", "backward_data", g, ws)
    kk, ci, co, L = g.k_h * g.k_w, g.c_in, g.c_out, g.h_out * g.w_out
    wt = b["weights_transposed"].reshape(kk, ci, co)
    np.copyto(wt.reshape(g.k_h, g.k_w, ci, co), w.transpose(2, 3, 1, 0))
    offsets = list(_offsets(g))
    cols_buf = None if g.pointwise else b["input_grad_columns"].reshape(ci, g.h_out, g.w_out)
    for n in range(dy.shape[0]):
        dyn = dy[n].reshape(co, L)
        if cols_buf is None:
            np.matmul(wt[0], dyn, out=dx[n].reshape(ci, L))
            continue
        dx[n].fill(0)
        for idx, rows, cols in offsets:
            np.matmul(wt[idx], dyn, out=cols_buf.reshape(ci, L))
            _scatter_add(dx[n], cols_buf, rows, cols, g)


def direct_backward_weight(x: np.ndarray, dy: np.ndarray, dw: np.ndarray, g: ConvGeometry, ws: Workspace,
                           accumulate: bool = False) -> None:
    b = _views("direct", "backward_weight", g, ws)
    kk, ci, co, L = g.k_h * g.k_w, g.c_in, g.c_out, g.h_out * g.w_out
    acc = b["weight_grad_by_offset"].reshape(kk, co, ci)
    acc.fill(0)
    prod = b["partial_weight_grad"].reshape(co, ci)
    slice_ = None if g.pointwise else b["input_slice"].reshape(ci, g.h_out, g.w_out)
    offsets = list(_offsets(g))
    for n in range(x.shape[0]):
        dyn = dy[n].reshape(co, L)
        for idx, src in _shifted_inputs(x[n], offsets, slice_, g):
            np.matmul(dyn, src.T, out=prod)
            acc[idx] += prod
    result = acc.reshape(g.k_h, g.k_w, co, ci).transpose(2, 3, 0, 1)
    if accumulate:
        dw += result
    else:
        np.copyto(dw, result)


# --- im2col + GEMM: the lowered matrix of the whole (micro-)batch ---------------------------

def _lower(x: np.ndarray, cols: np.ndarray, g: ConvGeometry) -> None:
    """cols[n, c, u, v, i, j] = x[n, c, i·s + u·d − p, j·s + v·d − p] (zero outside x)."""
    for idx, rows, cs in _offsets(g):
        u, v = divmod(idx, g.k_w)
        _gather(cols[:, :, u, v], x, rows, cs, g)


def im2col_forward(x: np.ndarray, w: np.ndarray, y: np.ndarray, g: ConvGeometry, ws: Workspace) -> None:
    n, ci, co, L = x.shape[0], g.c_in, g.c_out, g.h_out * g.w_out
    wmat = w.reshape(co, -1)
    if g.pointwise:
        np.matmul(wmat, x.reshape(n, ci, L), out=y.reshape(n, co, L))
        return
    cols = _views("im2col", "forward", g, ws)["columns"].reshape(n, ci, g.k_h, g.k_w, g.h_out, g.w_out)
    _lower(x, cols, g)
    np.matmul(wmat, cols.reshape(n, -1, L), out=y.reshape(n, co, L))


def im2col_backward_data(dy: np.ndarray, w: np.ndarray, dx: np.ndarray, g: ConvGeometry, ws: Workspace) -> None:
    n, ci, co, L = dy.shape[0], g.c_in, g.c_out, g.h_out * g.w_out
    wmat_t = w.reshape(co, -1).T
    if g.pointwise:
        np.matmul(wmat_t, dy.reshape(n, co, L), out=dx.reshape(n, ci, L))
        return
    cols = _views("im2col", "backward_data", g, ws)["columns"].reshape(n, ci, g.k_h, g.k_w, g.h_out, g.w_out)
    np.matmul(wmat_t, dy.reshape(n, co, L), out=cols.reshape(n, -1, L))
    dx.fill(0)
    for idx, rows, cs in _offsets(g):
        u, v = divmod(idx, g.k_w)
        _scatter_add(dx, cols[:, :, u, v], rows, cs, g)


def im2col_backward_weight(x: np.ndarray, dy: np.ndarray, dw: np.ndarray, g: ConvGeometry, ws: Workspace,
                           accumulate: bool = False) -> None:
    n, ci, co, L = x.shape[0], g.c_in, g.c_out, g.h_out * g.w_out
    b = _views("im2col", "backward_weight", g, ws)
    if g.pointwise:
        lowered = x.reshape(n, ci, L)
    else:
        cols = b["columns"].reshape(n, ci, g.k_h, g.k_w, g.h_out, g.w_out)
        _lower(x, cols, g)
        lowered = cols.reshape(n, -1, L)
    prod = b["partial_weight_grad"].reshape(co, -1)
    dwm = dw.reshape(co, -1)
    if not accumulate:
        dwm.fill(0)
    for i in range(n):
        np.matmul(dy[i].reshape(co, L), lowered[i].T, out=prod)
        dwm += prod


# --- registry ---------------------------------------------------------------------------------

def _registry() -> dict[str, dict[str, Callable]]:
    from dlsim.calibrate import conv_fft, conv_winograd
    return {
        "direct": {"forward": direct_forward, "backward_data": direct_backward_data,
                   "backward_weight": direct_backward_weight},
        "im2col": {"forward": im2col_forward, "backward_data": im2col_backward_data,
                   "backward_weight": im2col_backward_weight},
        "fft": {"forward": conv_fft.fft_forward, "backward_data": conv_fft.fft_backward_data,
                "backward_weight": conv_fft.fft_backward_weight},
        "winograd": {"forward": conv_winograd.winograd_forward, "backward_data": conv_winograd.winograd_backward_data,
                     "backward_weight": conv_winograd.winograd_backward_weight},
    }


def numpy_applicable(method: str, g: ConvGeometry) -> str | None:
    """None if the NumPy implementation of `method` runs this geometry, else why not."""
    if g.groups != 1:
        return "the NumPy algorithms implement groups=1 only"
    return applicable(method, g)


def workspace_size(method: str, pass_name: str, g: ConvGeometry) -> int:
    """Bytes of workspace arena `method` needs for `pass_name` at batch `g.n` (fp32)."""
    return arena_bytes(workspace_buffers(method, pass_name, g, implementation="numpy"))


def run_pass(method: str, pass_name: str, g: ConvGeometry, ws: Workspace, *, x: np.ndarray | None = None,
             w: np.ndarray, dy: np.ndarray | None = None, out: np.ndarray, accumulate: bool = False) -> None:
    """Run one pass of `method` on the batch in x / dy (g.n must equal their leading dimension).

    forward: x, w → out (y); backward_data: dy, w → out (∇x); backward_weight: x, dy → out (∇w).
    """
    reason = numpy_applicable(method, g)
    if reason:
        raise ValueError(reason)
    fn = _registry()[method][pass_name]
    if pass_name == "forward":
        fn(x, w, out, g, ws)
    elif pass_name == "backward_data":
        fn(dy, w, out, g, ws)
    else:
        fn(x, dy, out, g, ws, accumulate)
