"""Index helpers shared by the NumPy convolution algorithms (`conv_numpy`, `conv_winograd`).

A module of their own so that the algorithm modules import them, never each other: `conv_numpy`'s
registry imports `conv_winograd` and `conv_fft`, which therefore must not import `conv_numpy`.
"""

from __future__ import annotations

import numpy as np


def out_range(out_size: int, in_size: int, offset: int, stride: int) -> tuple[int, int, int]:
    """Output indices [lo, hi) whose input index i·stride + offset lies in [0, in_size), and that input's start."""
    lo = -(offset // stride) if offset < 0 else 0          # ceil(-offset / stride)
    hi = min(out_size, (in_size - 1 - offset) // stride + 1) if in_size - 1 - offset >= 0 else 0
    hi = max(hi, lo)
    return lo, hi, lo * stride + offset


def gather(dst: np.ndarray, src: np.ndarray, rows: tuple, cols: tuple, sh: int, sw: int) -> None:
    """dst[..., i, j] = src[..., i·sh + row offset, j·sw + col offset] over the valid range, zero elsewhere."""
    (i0, i1, r0), (j0, j1, c0) = rows, cols
    if (i0, i1, j0, j1) != (0, dst.shape[-2], 0, dst.shape[-1]):
        dst.fill(0)
    if i1 > i0 and j1 > j0:
        dst[..., i0:i1, j0:j1] = src[..., r0:r0 + (i1 - i0 - 1) * sh + 1:sh, c0:c0 + (j1 - j0 - 1) * sw + 1:sw]
