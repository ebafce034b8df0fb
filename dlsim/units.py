"""SI units: the constants, and the one place where user-facing quantities are converted.

Inside dlsim every quantity is SI: seconds, bytes, FLOP, bytes/s, FLOP/s. Files and command
lines carry units (a key suffix such as ``_us`` or a string such as ``"10GB/s"``); they are
converted here and nowhere else.
"""

from __future__ import annotations

import math
import re

from dlsim.errors import UnitError

# time
S = 1.0
MS = 1e-3
US = 1e-6
NS = 1e-9
# bytes (decimal and binary)
B = 1
KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12
KIB, MIB, GIB, TIB = 2.0**10, 2.0**20, 2.0**30, 2.0**40
BIT = 1 / 8
# rates
GFLOPS = 1e9
TFLOPS = 1e12
GBYTE_PER_S = 1e9
GBIT_PER_S = 1e9 / 8

DTYPE_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int64": 8}

_SIZE = {
    "": 1, "b": 1, "kb": KB, "mb": MB, "gb": GB, "tb": TB,
    "kib": KIB, "mib": MIB, "gib": GIB, "tib": TIB,
    "k": KB, "m": MB, "g": GB, "t": TB,
}
_TIME = {"s": S, "ms": MS, "us": US, "µs": US, "ns": NS, "min": 60.0, "h": 3600.0}
_RATE_BYTES = {"b/s": 1, "kb/s": KB, "mb/s": MB, "gb/s": GB, "tb/s": TB,
               "kib/s": KIB, "mib/s": MIB, "gib/s": GIB}
_RATE_BITS = {"bps": BIT, "kbps": KB * BIT, "mbps": MB * BIT, "gbps": GB * BIT, "tbps": TB * BIT,
              "bit/s": BIT, "kbit/s": KB * BIT, "mbit/s": MB * BIT, "gbit/s": GB * BIT}

_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([^\s]*)\s*$")


def _split(text: str | int | float, what: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise UnitError(f"expected a {what}, got {text!r}")
    if isinstance(text, (int, float)):
        return float(text), ""
    match = _NUMBER.match(str(text))
    if not match:
        raise UnitError(f"cannot read {text!r} as a {what}")
    return float(match.group(1)), match.group(2)


def _finite_nonnegative(value: float, text: object, what: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise UnitError(f"{what} {text!r} must be a finite non-negative number")
    return value


def parse_size(text: str | int | float) -> float:
    """Bytes from ``"100MB"``, ``"64MiB"``, ``"1.5GB"`` or a plain number of bytes."""
    value, unit = _split(text, "size")
    key = unit.lower()
    if key not in _SIZE:
        raise UnitError(f"unknown size unit {unit!r} in {text!r} (use B, KB, MB, GB, KiB, MiB, GiB)")
    return _finite_nonnegative(value * _SIZE[key], text, "size")


def parse_time(text: str | int | float) -> float:
    """Seconds from ``"5us"``, ``"1.2ms"``, ``"3s"`` or a plain number of seconds."""
    value, unit = _split(text, "time")
    key = unit.lower() or "s"
    if key not in _TIME:
        raise UnitError(f"unknown time unit {unit!r} in {text!r} (use s, ms, us, ns)")
    return _finite_nonnegative(value * _TIME[key], text, "time")


def parse_bandwidth(text: str | int | float) -> float:
    """Bytes/s from ``"10GB/s"``, ``"25Gbps"`` (bits), ``"12GiB/s"`` or a plain number of bytes/s."""
    value, unit = _split(text, "bandwidth")
    if unit == "":
        return _finite_nonnegative(value, text, "bandwidth")
    key = unit.lower()
    if key in _RATE_BYTES and not unit.endswith("bps"):
        factor = _RATE_BYTES[key]
    elif key in _RATE_BITS:
        factor = _RATE_BITS[key]
    else:
        raise UnitError(f"unknown bandwidth unit {unit!r} in {text!r} (use GB/s, MB/s, Gbps)")
    return _finite_nonnegative(value * factor, text, "bandwidth")


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a data type name (fp32, fp16, bf16, ...)."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise UnitError(f"unknown data type {dtype!r} (use one of {', '.join(DTYPE_BYTES)})") from None


def format_time(seconds: float) -> str:
    """Human-readable time with a unit chosen for 3-4 significant digits."""
    if seconds == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", MS), ("us", US), ("ns", NS)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / NS:.3g} ns"


def format_bytes(n: float) -> str:
    """Human-readable binary size (KiB, MiB, GiB)."""
    for unit, scale in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.0f} B"


def format_count(n: float) -> str:
    """Human-readable count with SI prefixes (k, M, G, T)."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g}{unit}"
    return f"{n:.0f}"
