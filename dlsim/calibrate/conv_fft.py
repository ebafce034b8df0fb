"""FFT convolution in NumPy (survey Appendix B.3; Mathieu, Henaff & LeCun 2014; Vasilache et al. ICLR 2015).

Stride 1, dilation 1, one group. Planes are zero-padded to fast lengths H_f×W_f
(`dlsim.cost.conv_methods.fft_size`) and laid out (H_f, W_f, batch, channels), so that the per-frequency
channel products are one batched GEMM over H_f·(W_f/2+1) bins and every transform writes into its
workspace buffer (``numpy.fft`` with ``out=``). The kernel is placed at offsets (u − P) mod H_f, which
turns zero padding P into a circular shift:

* forward:  Ŷ = X̂ · conj(K̂)   (circular correlation), y = first H'×W' of the inverse;
* ∇x:       ∇X̂ = ∇Ŷ · K̂     (the adjoint: circular convolution), ∇x = first H×W;
* ∇w:       ∇K̂ = Σ_n X̂ · conj(∇Ŷ), ∇w[u] = inverse at (u − P) mod H_f.

The kernel is transformed on every call, as cuDNN's FFT algorithms do per micro-batch. All transforms
use ``norm="ortho"`` (NumPy then computes in single precision; with the default normalisation its
forward transforms take a float64 path and allocate hidden float64 copies). A forward-forward-inverse
chain of orthonormal transforms carries a factor 1/√(H_f·W_f), which is folded into the placed kernel
(y, ∇x) or the gathered gradient (∇w).
"""

from __future__ import annotations

import numpy as np

from dlsim.calibrate.conv_workspace import Workspace
from dlsim.cost.conv_methods import ConvGeometry, fft_size, workspace_buffers


def _placement(g: ConvGeometry, hf: int, wf: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of kernel tap (u, v) in the circular plane."""
    return (np.arange(g.k_h) - g.pad_h) % hf, (np.arange(g.k_w) - g.pad_w) % wf


def _kernel_spectrum(w: np.ndarray, g: ConvGeometry, b: dict, hf: int, wf: int) -> np.ndarray:
    """K̂ (H_f, W_f/2+1, C_in, C_out) of the placed kernel."""
    kp = b["kernel_planes"].reshape(hf, wf, g.c_in, g.c_out)
    kp.fill(0)
    rows, cols = _placement(g, hf, wf)
    kp[rows[:, None], cols[None, :]] = w.transpose(2, 3, 1, 0)
    kp *= np.float32(np.sqrt(hf * wf))
    spec = b["kernel_spectrum"].reshape(hf, wf // 2 + 1, g.c_in, g.c_out)
    np.fft.rfftn(kp, axes=(0, 1), out=spec, norm="ortho")
    return spec


def _spectrum(src: np.ndarray, padded: np.ndarray, spec: np.ndarray) -> np.ndarray:
    """Zero-pad src (N, C, h, w) into `padded` (H_f, W_f, N, C) and transform it into `spec`."""
    padded.fill(0)
    padded[:src.shape[2], :src.shape[3]] = src.transpose(2, 3, 0, 1)
    np.fft.rfftn(padded, axes=(0, 1), out=spec, norm="ortho")
    return spec


def _inverse(spec: np.ndarray, planes: np.ndarray, wf: int) -> np.ndarray:
    """Inverse 2-D real FFT of `spec` over axes (0, 1), in place on axis 0, into `planes`."""
    np.fft.ifft(spec, axis=0, out=spec, norm="ortho")
    np.fft.irfft(spec, n=wf, axis=1, out=planes, norm="ortho")
    return planes


def fft_forward(x: np.ndarray, w: np.ndarray, y: np.ndarray, g: ConvGeometry, ws: Workspace) -> None:
    b = ws.carve(workspace_buffers("fft", "forward", g))
    hf, wf = fft_size(g)
    n, wr = x.shape[0], wf // 2 + 1
    k = _kernel_spectrum(w, g, b, hf, wf)
    np.conjugate(k, out=k)
    xs = _spectrum(x, b["source_padded"].reshape(hf, wf, n, g.c_in), b["source_spectrum"].reshape(hf, wr, n, g.c_in))
    ys = b["result_spectrum"].reshape(hf, wr, n, g.c_out)
    np.matmul(xs, k, out=ys)
    planes = _inverse(ys, b["result_planes"].reshape(hf, wf, n, g.c_out), wf)
    np.copyto(y, planes[:g.h_out, :g.w_out].transpose(2, 3, 0, 1))


def fft_backward_data(dy: np.ndarray, w: np.ndarray, dx: np.ndarray, g: ConvGeometry, ws: Workspace) -> None:
    b = ws.carve(workspace_buffers("fft", "backward_data", g))
    hf, wf = fft_size(g)
    n, wr = dy.shape[0], wf // 2 + 1
    k = _kernel_spectrum(w, g, b, hf, wf)
    gs = _spectrum(dy, b["source_padded"].reshape(hf, wf, n, g.c_out), b["source_spectrum"].reshape(hf, wr, n, g.c_out))
    xs = b["result_spectrum"].reshape(hf, wr, n, g.c_in)
    np.matmul(gs, k.swapaxes(2, 3), out=xs)
    planes = _inverse(xs, b["result_planes"].reshape(hf, wf, n, g.c_in), wf)
    np.copyto(dx, planes[:g.h, :g.w].transpose(2, 3, 0, 1))


def fft_backward_weight(x: np.ndarray, dy: np.ndarray, dw: np.ndarray, g: ConvGeometry, ws: Workspace,
                        accumulate: bool = False) -> None:
    b = ws.carve(workspace_buffers("fft", "backward_weight", g))
    hf, wf = fft_size(g)
    n, wr = x.shape[0], wf // 2 + 1
    xs = _spectrum(x, b["input_padded"].reshape(hf, wf, n, g.c_in), b["input_spectrum"].reshape(hf, wr, n, g.c_in))
    gs = _spectrum(dy, b["grad_padded"].reshape(hf, wf, n, g.c_out), b["grad_spectrum"].reshape(hf, wr, n, g.c_out))
    np.conjugate(gs, out=gs)
    ks = b["kernel_grad_spectrum"].reshape(hf, wr, g.c_in, g.c_out)
    np.matmul(xs.swapaxes(2, 3), gs, out=ks)
    planes = _inverse(ks, b["kernel_grad_planes"].reshape(hf, wf, g.c_in, g.c_out), wf)
    rows, cols = _placement(g, hf, wf)
    grad = planes[rows[:, None], cols[None, :]].transpose(3, 2, 0, 1)
    grad *= np.float32(np.sqrt(hf * wf))
    if accumulate:
        dw += grad
    else:
        np.copyto(dw, grad)
