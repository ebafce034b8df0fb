"""A workspace arena: one preallocated block that convolution algorithms carve their temporaries from.

Like cuDNN's ``workspace`` argument: the caller owns the memory and its size; an algorithm that needs
more than it is given refuses to run (`WorkspaceTooSmall`). The buffers an algorithm carves are
listed by `dlsim.cost.conv_methods.workspace_buffers`, so the bytes a benchmark table records are the
bytes the algorithm really uses. Each buffer starts on a 64-byte boundary.
"""

from __future__ import annotations

import numpy as np

from dlsim.cost.conv_methods import Buffer
from dlsim.errors import InfeasibleError
from dlsim.units import format_bytes

ALIGN = 64
_REAL = {4: np.float32, 8: np.float64}
_COMPLEX = {4: np.complex64, 8: np.complex128}


class WorkspaceTooSmall(InfeasibleError):
    """An algorithm needs more workspace than the arena it was given."""


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def arena_bytes(buffers: tuple[Buffer, ...], dtype_bytes: int = 4) -> int:
    """Bytes of an arena holding `buffers` back to back, each rounded up to 64 bytes."""
    return sum(_aligned(b.nbytes(dtype_bytes)) for b in buffers)


class Workspace:
    """`nbytes` of memory; `carve` hands out typed views of it, one per buffer, without copying."""

    def __init__(self, nbytes: int, block: np.ndarray | None = None):
        self.nbytes = int(nbytes)
        self.block = np.empty(max(self.nbytes, 1), dtype=np.uint8) if block is None else block

    def segment(self, offset: int, nbytes: int) -> "Workspace":
        """A private part of this arena (WD: each kernel its own segment), sharing its memory."""
        if offset % ALIGN or offset < 0 or offset + nbytes > self.nbytes:
            raise WorkspaceTooSmall(f"segment [{offset}, {offset + nbytes}) does not fit an arena of "
                                    f"{format_bytes(self.nbytes)}")
        return Workspace(nbytes, self.block[offset:offset + max(nbytes, 1)])

    def carve(self, buffers: tuple[Buffer, ...], dtype_bytes: int = 4, offset: int = 0) -> dict[str, np.ndarray]:
        """Flat views named like the buffers, starting at byte `offset` (a segment of a shared arena)."""
        need = arena_bytes(buffers, dtype_bytes)
        if offset + need > self.nbytes:
            raise WorkspaceTooSmall(f"needs {format_bytes(need)} of workspace, the arena has "
                                    f"{format_bytes(self.nbytes - offset)}")
        views, at = {}, offset
        for b in buffers:
            dtype = _COMPLEX[dtype_bytes] if b.complex else _REAL[dtype_bytes]
            views[b.name] = np.ndarray((b.elements,), dtype=dtype, buffer=self.block, offset=at)
            at += _aligned(b.nbytes(dtype_bytes))
        return views
