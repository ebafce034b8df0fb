"""GEMM lookup by local linear regression over the nearest measured shapes (dlsim.cost.gemm_local)."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from dlsim.cost.gemm_local import LocalGemmModel
from dlsim.cost.layers import Gemm
from dlsim.cost.lookup import GemmRow, MeasuredKernelTimes
from dlsim.results import Source

AXIS = [1, 4, 16, 64, 256, 1024]


def power_law(m: float, n: float, k: float) -> float:
    """log t linear in (log m, log n, log k): a local linear fit reproduces it exactly."""
    return 3e-9 * m ** 0.9 * n ** 0.8 * k ** 0.7


def rows(time_of=power_law, odd: int = 0, seed: int = 0) -> list[GemmRow]:
    out = [GemmRow("fp32", m, n, k, 1, time_of(m, n, k)) for m in AXIS for n in AXIS for k in AXIS]
    rng = random.Random(seed)
    for _ in range(odd):
        m, n, k = (int(math.exp(rng.uniform(0, math.log(1024)))) + 1 for _ in range(3))
        out.append(GemmRow("fp32", m, n, k, 1, time_of(m, n, k), set="odd"))
    return out


@pytest.mark.parametrize("shape", [(8, 30, 100), (3, 200, 7), (50, 2, 130), (700, 10, 600)])
def test_local_fit_is_exact_for_a_power_law(shape):
    e = MeasuredKernelTimes(rows(odd=50)).gemm(Gemm(*shape), "fp32")
    assert e.source == Source.INTERPOLATED and "local linear fit" in e.note
    assert e.seconds == pytest.approx(power_law(*shape), rel=1e-9)


def test_local_fit_averages_noise_better_than_the_cell():
    """Each row off by its own factor up to ±25% (seeded): the fit over 32 rows stays closer to the truth."""
    rng = random.Random(1)
    noise: dict[tuple[int, int, int], float] = {}
    def noisy(m: int, n: int, k: int) -> float:
        return power_law(m, n, k) * noise.setdefault((m, n, k), math.exp(rng.uniform(-0.25, 0.25)))
    table = rows(noisy, odd=300)
    qrng = random.Random(2)
    queries = [tuple(int(math.exp(qrng.uniform(0.5, math.log(1000)))) for _ in range(3)) for _ in range(60)]
    queries = [q for q in queries if q not in noise]
    def median_error(method: str) -> float:
        t = MeasuredKernelTimes(table, gemm_method=method)
        return statistics.median(abs(t.gemm(Gemm(*q), "fp32").seconds / power_law(*q) - 1) for q in queries)
    assert median_error("local") < 0.6 * median_error("multilinear")


def test_local_fit_sees_off_grid_rows_the_cell_ignores():
    """Off-grid shapes all 30% slower than the grid's law: the local fit moves toward them, the cell does not."""
    table = rows(odd=400)
    slow = [GemmRow(r.dtype, r.m, r.n, r.k, 1, r.time_s * 1.3, set=r.set) if r.set == "odd" else r for r in table]
    q = Gemm(100, 300, 50)
    local = MeasuredKernelTimes(slow).gemm(q, "fp32").seconds / power_law(100, 300, 50)
    cell = MeasuredKernelTimes(slow, gemm_method="multilinear").gemm(q, "fp32").seconds / power_law(100, 300, 50)
    assert cell == pytest.approx(1.0, rel=1e-9)
    assert 1.1 < local < 1.3


def test_outside_the_grid_and_exact_hits_are_unchanged():
    table = rows(odd=20)
    local, cell = MeasuredKernelTimes(table), MeasuredKernelTimes(table, gemm_method="multilinear")
    for q in (Gemm(4096, 16, 16), Gemm(64, 64, 64), Gemm(table[-1].m, table[-1].n, table[-1].k)):
        a, b = local.gemm(q, "fp32"), cell.gemm(q, "fp32")
        assert (a.seconds, a.source) == (b.seconds, b.source)
    assert local.gemm(Gemm(4096, 16, 16), "fp32").source == Source.EXTRAPOLATED


def test_model_with_few_or_collinear_rows_falls_back_to_a_weighted_mean():
    line = LocalGemmModel([(m, 8, 8, 1e-6 * m) for m in (2, 4, 8, 16, 32)], neighbours=32)
    t, reach = line.seconds(6, 8, 8)
    assert 2e-6 < t < 16e-6 and reach > 0
    with pytest.raises(ValueError):
        MeasuredKernelTimes(rows(), gemm_method="cubic")
