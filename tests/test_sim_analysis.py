"""The breakdown's interval arithmetic (dlsim.sim.analysis): the communication union merged with numpy
is the plain merge's, bound for bound, and the gaps' coverage summed across gaps at once is the scan's,
bit for bit (intervals sharing ends, empty ones, gaps touching the union's bounds)."""

from __future__ import annotations

import random

import numpy as np

from dlsim.sim.analysis import _covered, _device_union, _union, _union_arrays


def _intervals(rng: random.Random, n: int) -> list[tuple[float, float]]:
    grid = [k * 0.125 for k in range(40)] + [rng.uniform(0, 5) for _ in range(10)]  # shared ends and odd ones
    out = []
    for _ in range(n):
        a = rng.choice(grid)
        out.append((a, a + rng.choice([0.0, 0.125, 0.3, rng.uniform(0, 1)])))
    return out


def _gaps(rng: random.Random) -> list[tuple[float, float]]:
    cuts = sorted({rng.choice([k * 0.125 for k in range(48)]) for _ in range(12)})
    return [(a, b) for a, b in zip(cuts[::2], cuts[1::2])]


def test_union_and_coverage_with_arrays_are_the_scans():
    rng = random.Random(7)
    for _ in range(200):
        spans = _intervals(rng, rng.randint(0, 120))
        gaps = _gaps(rng)
        merged = _union(spans)
        a = np.array([x for x, _ in spans], dtype=float)
        b = np.array([y for _, y in spans], dtype=float)
        us, ue = _union_arrays(a, b)
        assert list(zip(us.tolist(), ue.tolist())) == merged
        lists = ([x for x, _ in merged], [y for _, y in merged])
        assert _covered(gaps, us, ue) == _covered(gaps, *lists)


def test_device_union_small_and_large_agree():
    """A device's pieces (arrays of port spans, lists of stream tasks) and extra intervals: merged in
    plain Python up to SMALL intervals and with numpy above, the same union."""
    rng = random.Random(3)
    for n in (5, 60, 300):
        spans = _intervals(rng, n)
        half = len(spans) // 2
        starts = [np.array([x for x, _ in spans[:half]], dtype=float), [x for x, _ in spans[half:-3]]]
        ends = [np.array([y for _, y in spans[:half]], dtype=float), [y for _, y in spans[half:-3]]]
        us, ue = _device_union(starts, ends, spans[-3:])
        assert list(zip(np.asarray(us).tolist(), np.asarray(ue).tolist())) == _union(spans)
