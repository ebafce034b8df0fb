import pytest

from dlsim import units
from dlsim.errors import UnitError


@pytest.mark.parametrize("text,expected", [("100MB", 100e6), ("64MiB", 64 * 2**20), ("1.5 GB", 1.5e9), (4096, 4096),
                                           ("2KiB", 2048), ("0", 0)])
def test_parse_size(text, expected):
    assert units.parse_size(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [("5us", 5e-6), ("1.2ms", 1.2e-3), ("3", 3.0), ("10ns", 1e-8)])
def test_parse_time(text, expected):
    assert units.parse_time(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [("10GB/s", 10e9), ("25Gbps", 25e9 / 8), ("100 Mbit/s", 12.5e6),
                                           ("1GiB/s", 2**30)])
def test_parse_bandwidth(text, expected):
    assert units.parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["ten MB", "5 parsecs", "-3MB", "nan", True])
def test_bad_sizes_raise_unit_error(bad):
    with pytest.raises(UnitError):
        units.parse_size(bad)


def test_dtype_bytes():
    assert units.dtype_bytes("bf16") == 2 and units.dtype_bytes("fp32") == 4
    with pytest.raises(UnitError):
        units.dtype_bytes("fp13")
