"""Winograd minimal-filtering convolution F(m×m, r×r) in NumPy (Lavin & Gray, CVPR 2016; survey Appendix B.4).

Transform matrices come from the Toom-Cook construction at the points 0, ±1, ±2, ±1/2 and ∞:
with V_k the α×k evaluation matrix (row [1, a, a², …] per finite point a, [0, …, 0, 1] for ∞),
linear convolution of g (length r) and h (length m) is s = V_α⁻¹((V_r g) ∘ (V_m h)); correlation
is its transpose, so y = Aᵀ[(G g) ∘ (Bᵀ d)] with Aᵀ = V_mᵀ, G = V_r, Bᵀ = V_α⁻ᵀ, α = m + r − 1.
In 2-D: Y = Aᵀ[(G g Gᵀ) ∘ (Bᵀ d B)]A.

* forward: tiles of x (α×α, step m) → V = BᵀdB; kernels → U = GgGᵀ; M = U·V as α² GEMMs
  (C_out×C_in by C_in×P); Y = AᵀMA scattered into y.
* ∇x: the same on ∇y with the flipped, transposed kernel and padding r − 1 − P.
* ∇w: F(r×r, m×m) on the same α: x tiles (BᵀdB), ∇y tiles as the "filter" (V_m·g·V_mᵀ), α² GEMMs
  over N·tiles (C_out×P by P×C_in), output transform V_rᵀ·M·V_r.

Every stage is a matmul writing into its workspace buffer (`dlsim.cost.conv_methods.workspace_buffers`).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from dlsim.calibrate.conv_index import gather, out_range
from dlsim.calibrate.conv_workspace import Workspace
from dlsim.cost.conv_methods import WINOGRAD_M, ConvGeometry, winograd_alpha, workspace_buffers

POINTS = (0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5)


def _evaluation(points: tuple[float, ...], k: int) -> np.ndarray:
    """(len(points) + 1) × k: polynomial of degree < k evaluated at each point, last row its leading coefficient."""
    rows = [[p ** j for j in range(k)] for p in points]
    rows.append([0.0] * (k - 1) + [1.0])
    return np.array(rows, dtype=np.float64)


@lru_cache(maxsize=None)
def winograd_matrices(m: int, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Aᵀ m×α, G α×r, Bᵀ α×α) of F(m, r), in float64."""
    alpha = winograd_alpha(m, r)
    if alpha - 1 > len(POINTS):
        raise ValueError(f"F({m}, {r}) needs {alpha - 1} interpolation points, only {len(POINTS)} are defined")
    pts = POINTS[:alpha - 1]
    return _evaluation(pts, m).T.copy(), _evaluation(pts, r), np.linalg.inv(_evaluation(pts, alpha)).T.copy()


def _gather_tiles(tiles: np.ndarray, src: np.ndarray, pad_h: int, pad_w: int, m: int) -> None:
    """tiles[i, j, c, n, a, b] = src[n, c, a·m + i − pad_h, b·m + j − pad_w] (zero outside src)."""
    th, tw = tiles.shape[4], tiles.shape[5]
    for i in range(tiles.shape[0]):
        rows = out_range(th, src.shape[2], i - pad_h, m)
        for j in range(tiles.shape[1]):
            cols = out_range(tw, src.shape[3], j - pad_w, m)
            gather(tiles[i, j].transpose(1, 0, 2, 3), src, rows, cols, m, m)


def _transform_data(tiles: np.ndarray, half: np.ndarray, bt: np.ndarray) -> None:
    """In place: tiles (α, α, rest) ← Bᵀ·tiles·B, using `half` (α, α·rest) for Bᵀ·tiles."""
    a = bt.shape[0]
    np.matmul(bt, tiles.reshape(a, -1), out=half)
    np.matmul(bt, half.reshape(a, a, -1), out=tiles.reshape(a, a, -1))


def _two_sided(left: np.ndarray, src: np.ndarray, half: np.ndarray, out: np.ndarray) -> None:
    """out[s, t, :] = Σ_ij left[s, i]·src[i, j, :]·left[t, j] (src (k, k, rest) → out (l, l, rest))."""
    k, l = left.shape[1], left.shape[0]
    np.matmul(left, src.reshape(k, -1), out=half.reshape(l, -1))
    np.matmul(left, half.reshape(l, k, -1), out=out.reshape(l, l, -1))


def _forward_core(src: np.ndarray, kernel_rr: np.ndarray, dst: np.ndarray, pad_h: int, pad_w: int, b: dict,
                  m: int, r: int) -> None:
    """dst = correlation of src (N, Cs, ·, ·) with kernel_rr (r, r, Cd, Cs) at padding (pad_h, pad_w)."""
    at, g_mat, bt = (x.astype(np.float32) for x in winograd_matrices(m, r))
    a = winograd_alpha(m, r)
    n, cs = src.shape[0], src.shape[1]
    cd, ho, wo = dst.shape[1], dst.shape[2], dst.shape[3]
    th, tw = -(-ho // m), -(-wo // m)
    p = n * th * tw
    layout = b["kernel_layout"].reshape(r, r, cd, cs)
    np.copyto(layout, kernel_rr)
    u = b["kernel_transformed"].reshape(a, a, cd, cs)
    _two_sided(g_mat, layout, b["kernel_half"], u)
    tiles = b["tiles"].reshape(a, a, cs, n, th, tw)
    _gather_tiles(tiles, src, pad_h, pad_w, m)
    _transform_data(tiles, b["tiles_half"].reshape(a, -1), bt)
    prod = b["products"].reshape(a * a, cd, p)
    np.matmul(u.reshape(a * a, cd, cs), tiles.reshape(a * a, cs, p), out=prod)
    out = b["output_tiles"].reshape(m, m, cd, n, th, tw)
    _two_sided(at, prod.reshape(a, a, -1), b["output_half"], out)
    for i in range(m):
        for j in range(m):
            view = dst[:, :, i::m, j::m]
            np.copyto(view, out[i, j, :, :, :view.shape[2], :view.shape[3]].transpose(1, 0, 2, 3))


def winograd_forward(x: np.ndarray, w: np.ndarray, y: np.ndarray, g: ConvGeometry, ws: Workspace,
                     m: int = WINOGRAD_M) -> None:
    b = ws.carve(workspace_buffers("winograd", "forward", g, m))
    _forward_core(x, w.transpose(2, 3, 0, 1), y, g.pad_h, g.pad_w, b, m, g.k_h)


def winograd_backward_data(dy: np.ndarray, w: np.ndarray, dx: np.ndarray, g: ConvGeometry, ws: Workspace,
                           m: int = WINOGRAD_M) -> None:
    b = ws.carve(workspace_buffers("winograd", "backward_data", g, m))
    r = g.k_h
    _forward_core(dy, w[:, :, ::-1, ::-1].transpose(2, 3, 1, 0), dx, r - 1 - g.pad_h, r - 1 - g.pad_w, b, m, r)


def winograd_backward_weight(x: np.ndarray, dy: np.ndarray, dw: np.ndarray, g: ConvGeometry, ws: Workspace,
                             accumulate: bool = False, m: int = WINOGRAD_M) -> None:
    """∇w by F(r×r, m×m): Aᵀ' = G(m, r)ᵀ (r×α), G' = A(m, r) (α×m), Bᵀ' = Bᵀ (same α, same points)."""
    b = ws.carve(workspace_buffers("winograd", "backward_weight", g, m))
    r, a = g.k_h, winograd_alpha(m, g.k_h)
    at, g_mat, bt = (x_.astype(np.float32) for x_ in winograd_matrices(m, r))
    n, ci, co = x.shape[0], g.c_in, g.c_out
    th, tw = -(-g.h_out // m), -(-g.w_out // m)
    p = n * th * tw
    tiles = b["input_tiles"].reshape(a, a, ci, n, th, tw)
    _gather_tiles(tiles, x, g.pad_h, g.pad_w, m)
    _transform_data(tiles, b["input_tiles_half"].reshape(a, -1), bt)
    grads = b["grad_tiles"].reshape(m, m, co, n, th, tw)
    _gather_tiles(grads, dy, 0, 0, m)
    gt = b["grad_tiles_transformed"].reshape(a, a, co * p)
    _two_sided(at.T.copy(), grads, b["grad_tiles_half"], gt)
    prod = b["products"].reshape(a * a, co, ci)
    np.matmul(gt.reshape(a * a, co, p), tiles.reshape(a * a, ci, p).swapaxes(1, 2), out=prod)
    grad = b["weight_grad_tiles"].reshape(r, r, co, ci)
    _two_sided(g_mat.T.copy(), prod.reshape(a, a, -1), b["products_half"], grad)
    if accumulate:
        dw += grad.transpose(2, 3, 0, 1)
    else:
        np.copyto(dw, grad.transpose(2, 3, 0, 1))
