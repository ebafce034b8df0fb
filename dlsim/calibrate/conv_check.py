"""Correctness of the NumPy convolution algorithms on given layer shapes: each against direct and against PyTorch.

For every layer, pass and applicable algorithm, run the pass on random fp32 operands in a workspace of
exactly the declared size, and compare with (a) the NumPy direct algorithm (the same operands, fp32)
and (b) PyTorch's ``conv2d`` and its autograd gradients in fp64 (a reference with negligible rounding
error). The error is normwise-relative, max|out − ref| / max|ref|: fp32 kernels that sum K = C_in·K_y·K_x
products are expected near 1e-6·√K, FFT a little above (Lavin & Gray, CVPR 2016, §5, and cuDNN's own
tolerances differ per algorithm the same way).

PyTorch is imported lazily; without it only the cross-check against direct runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dlsim.calibrate.conv_numpy import numpy_applicable, run_pass, workspace_size
from dlsim.calibrate.conv_workspace import Workspace
from dlsim.cost.conv_methods import METHODS, PASSES, ConvGeometry

TOLERANCE = 1e-4
"""Largest accepted normwise-relative error of an fp32 algorithm (the tests use the same bound)."""


@dataclass(frozen=True)
class CheckRow:
    """One (layer, pass, algorithm): relative error against direct and against PyTorch (None without torch)."""

    layer: str
    pass_name: str
    algorithm: str
    vs_direct: float
    vs_torch: float | None

    @property
    def ok(self) -> bool:
        return self.vs_direct <= TOLERANCE and (self.vs_torch is None or self.vs_torch <= TOLERANCE)


def operands(g: ConvGeometry, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random normal fp32 x, w, ∇y for the batch g.n."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((g.n, g.c_in, g.h, g.w), dtype=np.float32)
    w = rng.standard_normal((g.c_out, g.c_in, g.k_h, g.k_w), dtype=np.float32)
    dy = rng.standard_normal((g.n, g.c_out, g.h_out, g.w_out), dtype=np.float32)
    return x, w, dy


def run_all(g: ConvGeometry, x: np.ndarray, w: np.ndarray, dy: np.ndarray,
            methods: Sequence[str] = METHODS) -> dict[tuple[str, str], np.ndarray]:
    """Every applicable (algorithm, pass) result, each in a workspace of exactly its declared size."""
    out = {}
    for method in methods:
        if numpy_applicable(method, g):
            continue
        for p in PASSES:
            shape = {"forward": dy.shape, "backward_data": x.shape, "backward_weight": w.shape}[p]
            res = np.empty(shape, np.float32)
            run_pass(method, p, g, Workspace(workspace_size(method, p, g)), x=x, w=w, dy=dy, out=res)
            out[method, p] = res
    return out


def torch_reference(g: ConvGeometry, x: np.ndarray, w: np.ndarray, dy: np.ndarray) -> dict[str, np.ndarray] | None:
    """y, ∇x, ∇w from PyTorch in fp64; None when torch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.conv2d(xt, wt, stride=(g.stride_h, g.stride_w), padding=(g.pad_h, g.pad_w),
                                   dilation=(g.dil_h, g.dil_w), groups=g.groups)
    y.backward(torch.tensor(dy, dtype=torch.float64))
    return {"forward": y.detach().numpy(), "backward_data": xt.grad.numpy(), "backward_weight": wt.grad.numpy()}


def relative_error(res: np.ndarray, ref: np.ndarray) -> float:
    """max|res − ref| / max(1, max|ref|)."""
    return float(np.abs(res.astype(np.float64) - ref).max() / max(1.0, float(np.abs(ref).max())))


def check_layers(layers: Sequence[tuple[str, ConvGeometry]], batch: int = 2, seed: int = 0,
                 use_torch: bool = True) -> list[CheckRow]:
    """Every algorithm against direct and PyTorch for each (name, per-sample geometry) at `batch` samples."""
    rows = []
    for name, g1 in layers:
        g = g1.with_batch(batch)
        x, w, dy = operands(g, seed)
        results = run_all(g, x, w, dy)
        refs = torch_reference(g, x, w, dy) if use_torch else None
        for (method, p), res in results.items():
            rows.append(CheckRow(name, p, method, relative_error(res, results["direct", p]),
                                 relative_error(res, refs[p]) if refs is not None else None))
    return rows
