"""SI units: the constants, and the one place where user-facing quantities are converted.

Inside dlsim every quantity is SI: seconds, bytes, FLOP, bytes/s, FLOP/s. Files and command
lines carry units (a key suffix such as ``_us`` or a string such as ``"10GB/s"``); they are
converted here and nowhere else.

Case means something: ``B`` is a byte and ``b`` a bit (``100Gb/s`` = 12.5 GB/s,
``100GB/s`` = 100 GB/s, ``Gbps`` bits, ``GBps`` bytes); ``k``/``K``, ``M``, ``G``, ``T``, ``P``
are decimal prefixes, ``Ki``, ``Mi``, ``Gi``, ``Ti``, ``Pi`` binary ones. A spelling that could be
read two ways (a lower-case ``m``, which is milli, ``mb``, ``MS``) is refused with the spellings
that are accepted, never guessed.
"""

from __future__ import annotations

import math
import re

from dlsim.errors import UnitError, excerpt

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

_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": KIB, "Mi": MIB, "Gi": GIB, "Ti": TIB, "Pi": 2.0**50}
_BASE = {"B": 1.0, "byte": 1.0, "bytes": 1.0, "Byte": 1.0, "Bytes": 1.0,
         "b": BIT, "bit": BIT, "bits": BIT, "Bit": BIT, "Bits": BIT}
_SIZE = {p + b: _PREFIX[p] * _BASE[b] for p in _PREFIX for b in _BASE}
_RATE = {}
for _unit, _factor in _SIZE.items():
    _RATE[_unit + "/s"] = _factor
for _p in _PREFIX:
    _RATE[_p + "Bps"] = _PREFIX[_p]          # GBps: gigabytes per second
    _RATE[_p + "bps"] = _PREFIX[_p] * BIT    # Gbps: gigabits per second
_SIZE[""] = 1.0                              # a plain number of bytes
_TIME = {"s": S, "sec": S, "ms": MS, "us": US, "\u00b5s": US, "\u03bcs": US, "ns": NS, "ps": 1e-12,
         "min": 60.0, "h": 3600.0}

_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(\S*)\s*$")
_MAX_TEXT = 200


def _split(text: object, what: str) -> tuple[float, str]:
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise UnitError(f"expected a {what}, got {excerpt(text)}")
    if isinstance(text, int):
        if abs(text) > 10**30:
            raise UnitError(f"{what} {excerpt(text)} is out of range")
        return float(text), ""
    if isinstance(text, float):
        return text, ""
    match = _NUMBER.match(text) if len(text) <= _MAX_TEXT else None
    if not match:
        raise UnitError(f"cannot read {excerpt(text)} as a {what}")
    return float(match.group(1)), match.group(2)


def _finite_nonnegative(value: float, text: object, what: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise UnitError(f"{what} {excerpt(text)} must be a finite non-negative number")
    return value


def _positive_rate(value: float, text: object) -> float:
    """A bandwidth: finite and at least one bit per second (a zero or vanishing rate means infinite time)."""
    if not math.isfinite(value) or value < BIT:
        raise UnitError(f"bandwidth {excerpt(text)} must be a finite rate of at least 1 bit/s")
    return value


def _hint(unit: str, table: dict[str, float], examples: str) -> str:
    """Accepted spellings that differ from `unit` only in case, else the usual examples."""
    near = sorted(k for k in table if k.lower() == unit.lower() and k != unit)
    if near:
        return f"did you mean {' or '.join(near[:4])}? case matters: B byte, b bit, M mega, m milli"
    return f"use {examples}"


def parse_size(text: str | int | float) -> float:
    """Bytes from ``"100MB"``, ``"64MiB"``, ``"1.5GB"``, ``"100Mb"`` (bits) or a plain number of bytes."""
    value, unit = _split(text, "size")
    if unit not in _SIZE:
        raise UnitError(f"unknown size unit {excerpt(unit)} in {excerpt(text)} "
                        f"({_hint(unit, _SIZE, 'B, kB, MB, GB, KiB, MiB, GiB, or b, Mb, Gb for bits')})")
    return _finite_nonnegative(value * _SIZE[unit], text, "size")


def parse_time(text: str | int | float) -> float:
    """Seconds from ``"5us"``, ``"1.2ms"``, ``"3s"`` or a plain number of seconds."""
    value, unit = _split(text, "time")
    unit = unit or "s"
    if unit not in _TIME:
        raise UnitError(f"unknown time unit {excerpt(unit)} in {excerpt(text)} "
                        f"({_hint(unit, _TIME, 's, ms, us, ns, min, h')})")
    return _finite_nonnegative(value * _TIME[unit], text, "time")


_RATE_EXAMPLES = "GB/s, GBps, GiB/s (bytes) or Gb/s, Gbps, Gbit/s (bits)"


def parse_bandwidth(text: str | int | float) -> float:
    """Bytes/s from ``"10GB/s"``, ``"10GBps"``, ``"25Gb/s"`` or ``"25Gbps"`` (bits), ``"12GiB/s"``, or a
    Python number of bytes/s (SI, as the API passes it). A string needs its unit: ``"10"`` could be
    bytes, bits or gigabytes per second, so it is refused with the spellings accepted."""
    value, unit = _split(text, "bandwidth")
    if unit == "":
        if isinstance(text, str):
            raise UnitError(f"bandwidth {excerpt(text)} needs a unit (use {_RATE_EXAMPLES})")
        return _positive_rate(value, text)
    if unit in _SIZE:
        raise UnitError(f"{excerpt(text)} is a size, not a bandwidth (add /s: {excerpt(unit + '/s')})")
    if unit not in _RATE:
        raise UnitError(f"unknown bandwidth unit {excerpt(unit)} in {excerpt(text)} "
                        f"({_hint(unit, _RATE, _RATE_EXAMPLES)})")
    return _positive_rate(value * _RATE[unit], text)


_COUNT = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}


def parse_count(text: str | int | float) -> float:
    """A count from ``"15T"``, ``"2.87T"``, ``"252M"``, ``"1.5B"`` (billion) or a plain number
    (decimal prefixes: k/K thousand, M million, B/G billion, T trillion, P quadrillion)."""
    value, unit = _split(text, "count")
    if unit not in _COUNT:
        raise UnitError(f"unknown count suffix {excerpt(unit)} in {excerpt(text)} (use k, M, B or G, T, P: 15T, 252M)")
    return _finite_nonnegative(value * _COUNT[unit], text, "count")


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a data type name (fp32, fp16, bf16, ...)."""
    if isinstance(dtype, str) and dtype in DTYPE_BYTES:
        return DTYPE_BYTES[dtype]
    raise UnitError(f"unknown data type {excerpt(dtype)} (use one of {', '.join(DTYPE_BYTES)})")


def format_time(seconds: float) -> str:
    """Human-readable time with a unit chosen for 3-4 significant digits."""
    if seconds == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", MS), ("us", US), ("ns", NS)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / NS:.3g} ns"


def format_bytes(n: float, decimal: bool = False) -> str:
    """Human-readable size: binary (KiB, MiB, GiB, TiB), or decimal (kB, MB, GB, TB) for a size that was
    given in decimal units (`size_is_decimal`: decimal in, decimal out)."""
    scales = (("TB", TB), ("GB", GB), ("MB", MB), ("kB", KB)) if decimal else \
        (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB))
    for unit, scale in scales:
        if abs(n) >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.0f} B"


def size_is_decimal(text: str | int | float) -> bool:
    """Whether a size was written with a decimal prefix (``1GB``, ``100Mb``, ``3kB``), so that it is printed back
    in decimal units; binary prefixes (``64MiB``) and plain byte counts print in binary units."""
    if not isinstance(text, str):
        return False
    match = _NUMBER.match(text) if len(text) <= _MAX_TEXT else None
    unit = match.group(2) if match else ""
    return unit in _SIZE and unit[:1] in ("k", "K", "M", "G", "T", "P") and unit[1:2] != "i"


def format_params(n: float) -> str:
    """A parameter count as model cards write it, three significant digits: ``70.6B``, ``124M``, ``8.19K``
    (K thousand, M million, B billion, T trillion)."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def format_count(n: float) -> str:
    """Human-readable count with SI prefixes (k, M, G, T)."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g}{unit}"
    return f"{n:.0f}"
