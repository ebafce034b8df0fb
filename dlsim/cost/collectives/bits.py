"""Integer helpers on rank counts, exact for scalars and NumPy arrays."""

from __future__ import annotations

from typing import Union

import numpy as np

Ranks = Union[int, np.ndarray]


def ceil_log2(p: Ranks) -> Ranks:
    """⌈lg p⌉ for p ≥ 1 (0 for p = 1), exact (no floating-point log)."""
    if isinstance(p, (int, np.integer)):
        return int(p - 1).bit_length() if p > 1 else 0
    mant, exp = np.frexp(np.asarray(p, dtype=float))
    return np.where(mant == 0.5, exp - 1, exp).astype(np.int64)


def floor_log2(p: Ranks) -> Ranks:
    """⌊lg p⌋ for p ≥ 1."""
    if isinstance(p, (int, np.integer)):
        return int(p).bit_length() - 1
    _, exp = np.frexp(np.asarray(p, dtype=float))
    return (exp - 1).astype(np.int64)


def pof2_floor(p: Ranks) -> Ranks:
    """The largest power of two ≤ p."""
    if isinstance(p, (int, np.integer)):
        return 1 << floor_log2(p)
    return np.left_shift(1, floor_log2(p)).astype(np.int64)


def is_pof2(p: Ranks) -> Union[bool, np.ndarray]:
    return pof2_floor(p) == p


def lowbit(r: int) -> int:
    """The lowest set bit of r > 0."""
    return r & -r


def bmtree_children(v: int, p: int) -> list[int]:
    """Children of v in Open MPI's bmtree rooted at 0 (`coll_base_topo.c`), in its order (mask increasing)."""
    j = v.bit_length()
    out = []
    while v + (1 << j) < p:
        out.append(v + (1 << j))
        j += 1
    return out


def per_rank_count(time_at, n, p) -> np.ndarray:
    """Evaluate a scalar-p closed form `time_at(n, int p)` over arrays: once per distinct rank count."""
    n_b, p_b = np.broadcast_arrays(np.asarray(n, dtype=float), np.asarray(p))
    out = np.zeros(n_b.shape)
    for value in np.unique(p_b):
        mask = p_b == value
        out[mask] = time_at(n_b[mask], int(value))
    return out
