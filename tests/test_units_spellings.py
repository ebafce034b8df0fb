"""Every accepted spelling of a size, a bandwidth and a time, and the ambiguous ones refused (issue 16).

Case means something: B byte, b bit; M mega, m milli (refused in sizes and rates); Gbps bits, GBps bytes.
"""

import math

import pytest

from dlsim import units
from dlsim.errors import UnitError

K, M, G, T = 1e3, 1e6, 1e9, 1e12
KI, MI, GI, TI = 2**10, 2**20, 2**30, 2**40

SIZES = [
    ("0", 0), ("4096", 4096), (4096, 4096), (1.5, 1.5), ("12 B", 12), ("12B", 12), ("12 bytes", 12), ("1 byte", 1),
    ("1kB", K), ("1KB", K), ("1 MB", M), ("1.5GB", 1.5 * G), ("2TB", 2 * T), ("1PB", 1e15),
    ("2KiB", 2 * KI), ("64MiB", 64 * MI), ("4 GiB", 4 * GI), ("1TiB", TI), ("1PiB", 2**50),
    ("8b", 1), ("8 bits", 1), ("8bit", 1), ("1kb", K / 8), ("1Kb", K / 8), ("100Mb", 100 * M / 8),
    ("8Gb", G), ("8 Gbit", G), ("1Tb", T / 8), ("1Mib", MI / 8), ("1Gib", GI / 8), ("1e3 MB", G), (".5kB", 500),
]

RATES = [
    (1000, 1000), (1e9, 1e9), ("10GB/s", 10 * G), ("10 GB/s", 10 * G), ("12.5GBps", 12.5 * G),
    ("100Gb/s", 12.5 * G), ("100Gbps", 12.5 * G), ("100 Gbit/s", 12.5 * G), ("100Gbits/s", 12.5 * G),
    ("25Gbps", 25 * G / 8), ("1GiB/s", GI), ("1GiBps", GI), ("8Gib/s", GI), ("1MB/s", M), ("1MBps", M),
    ("100Mb/s", 12.5 * M), ("100 Mbps", 12.5 * M), ("100 Mbit/s", 12.5 * M), ("1kB/s", K), ("1KB/s", K),
    ("8kbps", K), ("8Kbps", K), ("1KiB/s", KI), ("1MiB/s", MI), ("1TB/s", T), ("8Tbps", T), ("1B/s", 1),
    ("8b/s", 1), ("8bps", 1), ("1Bps", 1), ("8 bit/s", 1), ("1 byte/s", 1), ("1 bytes/s", 1),
]

TIMES = [
    ("3", 3.0), (3, 3.0), ("3s", 3.0), ("3 sec", 3.0), ("1.2ms", 1.2e-3), ("5us", 5e-6), ("5\u00b5s", 5e-6),
    ("5\u03bcs", 5e-6), ("10ns", 1e-8), ("2ps", 2e-12), ("2min", 120.0), ("1h", 3600.0),
]


@pytest.mark.parametrize("text,expected", SIZES)
def test_size_spellings(text, expected):
    assert units.parse_size(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("text,expected", RATES)
def test_bandwidth_spellings(text, expected):
    assert units.parse_bandwidth(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("text,expected", TIMES)
def test_time_spellings(text, expected):
    assert units.parse_time(text) == pytest.approx(expected, rel=1e-12)


def test_bits_and_bytes_differ_by_eight():
    assert units.parse_bandwidth("100GB/s") == 8 * units.parse_bandwidth("100Gb/s")
    assert units.parse_bandwidth("12.5GBps") == units.parse_bandwidth("100Gbps") == 12.5e9
    assert units.parse_size("1MB") == 8 * units.parse_size("1Mb")


@pytest.mark.parametrize("bad", ["1mb", "1mB", "1mib", "1gb", "1GIB", "1kib", "64M", "64k", "1 MBB", "1 parsec",
                                 "ten MB", "-3MB", "nan", "inf", "1e400GB", "", "MB", True, None, [1], {"a": 1}])
def test_bad_sizes_refused(bad):
    with pytest.raises(UnitError):
        units.parse_size(bad)


@pytest.mark.parametrize("bad", ["10gbps", "10gb/s", "10mb/s", "10mbps", "10mbit/s", "10 GB", "10Gb", "10 G/s",
                                 "10GB/S", "10 gigabytes", "0", "1000", "10", "0GB/s", "1e-308GB/s", "-1GB/s", "1e999GB/s", "nan",
                                 10**400, False, [10]])
def test_bad_bandwidths_refused(bad):
    with pytest.raises(UnitError):
        units.parse_bandwidth(bad)


@pytest.mark.parametrize("bad", ["5MS", "5Ms", "5US", "5S", "5 seconds", "5 mins", "-1s", "inf", "5 m", True])
def test_bad_times_refused(bad):
    with pytest.raises(UnitError):
        units.parse_time(bad)


def test_errors_suggest_the_case_they_meant():
    with pytest.raises(UnitError, match="GBps or Gbps"):
        units.parse_bandwidth("10gbps")
    with pytest.raises(UnitError, match="MiB"):
        units.parse_size("64mib")
    with pytest.raises(UnitError, match="add /s"):
        units.parse_bandwidth("10GB")
    with pytest.raises(UnitError, match="needs a unit .*GB/s.*Gbps"):  # issue 29: "10" was taken as 10 B/s
        units.parse_bandwidth("10")


def test_error_lines_stay_short():
    for call, arg in ((units.parse_size, "7" * 10**6 + "MB"), (units.parse_bandwidth, "x" * 10**6),
                      (units.parse_time, 10**5000), (units.parse_size, list(range(10**5)))):
        with pytest.raises(UnitError) as info:
            call(arg)
        assert len(str(info.value)) <= 300


def test_results_are_finite():
    for text, _ in SIZES:
        assert math.isfinite(units.parse_size(text))
