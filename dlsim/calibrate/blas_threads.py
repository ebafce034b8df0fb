"""Setting the number of BLAS threads NumPy uses, at run time.

Kernel timings on a shared machine are steadier with one thread per process (another process's
burst then takes a core from the OS scheduler rather than stalling a team of spinning BLAS
threads). Uses threadpoolctl when it is installed, otherwise the ``*_set_num_threads`` entry
point of the OpenBLAS library NumPy has loaded (found in /proc/self/maps); if neither works the
count is left alone and `set_blas_threads` says so by returning None.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

_NAMES = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
          "openblas_set_num_threads")


def _openblas() -> ctypes.CDLL | None:
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    for path in sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and line.split()[-1].startswith("/")}):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def set_blas_threads(threads: int) -> int | None:
    """Use `threads` BLAS threads from now on; the count set, or None when it could not be set."""
    import numpy  # noqa: F401  (loads the BLAS library first)
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(limits=threads, user_api="blas")
        return threads
    except ImportError:
        pass
    lib = _openblas()
    if lib is None:
        return None
    for name in _NAMES:
        fn = getattr(lib, name, None)
        if fn is not None:
            fn(ctypes.c_int(threads))
            return threads
    return None
