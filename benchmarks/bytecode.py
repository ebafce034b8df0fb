"""Timing benchmarks run dlsim as an installed package has it: compiled to bytecode (pip compiles
every module when it installs a package). Where PYTHONDONTWRITEBYTECODE is set (as on the
development machine) a fresh checkout would otherwise compile every module from source in every
process and every forked worker, seconds no user pays, and two checkouts compared side by side
would differ by which of them had bytecode left over."""

from __future__ import annotations

import compileall
from pathlib import Path

import dlsim


def compile_package() -> bool:
    """Write the bytecode of every dlsim module whose bytecode is missing or stale; whether all compiled
    (False where the package's folders cannot be written: then modules compile as they load)."""
    return bool(compileall.compile_dir(str(Path(dlsim.__file__).parent), quiet=1))
