"""Fitting point-to-point parameters to measured tables: Hockney α-β, piecewise α-β, LogGP, γ.

* α-β as Hockney characterises a link (Hockney, Parallel Computing 20, 1994: r∞ and n½):
  β = 1/r∞ is the slope of the least-squares line through the one-way times of the large messages
  (≥ 1 MiB, or the largest quarter of the sizes), α the median over the small messages (≤ 1 KiB,
  or the smallest quarter) of T(m) − β·m. When timing noise makes that slope zero or negative (a
  quick run's few repetitions), β is the slope from the smallest to the largest message, or the
  largest message's time per byte: a finite, conservative bandwidth, never an infinite one. Large collectives depend on β, small ones and the
  crossover sizes on α; one global line would trade one for the other.
* α-β least squares on the *relative* error of T(m) = α + β·m, Σ ((α + β·m_i − T_i) / T_i)²,
  α, β ≥ 0 (non-negative least squares), reported for comparison and used per piece by the
* piecewise α-β (protocol ranges, `reference/algorithms.md` §2.1): the break points (at most two)
  that minimise the same relative residual, each piece at least three sizes.
* LogGP, PRTT method of Netgauge (`reference/algorithms.md` §2.2; Hoefler, Lichei, Rehm 2007):
  y(s) = (PRTT(n,0,s) − PRTT(1,0,s)) / (n−1) is fitted by g + (s−1)·G (points further than twice
  the median residual from the line dropped, at most twice); o(s) = (PRTT(n,d,s) − PRTT(1,0,s)) / (n−1) − d,
  o = its median over the sizes ≤ 4 KiB (at least 0); L = PRTT(1,0,s_min)/2 − 2o (at least 0).
* γ (reduction seconds per byte): slope of the least-squares line through the reduction times of
  vectors of at least 256 KiB.

* token bucket (`fit_burst`; the shaped port of `dlsim.cost.p2p`, T(s) = α + max(s/R, (s − b)/r)
  with r = 1/β): every ping-pong size s above the knee gives b_s = s − (T(s) − α)/β, the bytes that
  passed without paying the line rate. A size counts when the message clearly exceeded the bucket
  (s ≥ 2·b_s: at least half its bytes paid the line rate, and that time (s − b_s)·β is at least α,
  so start-up noise cannot fake it), when ping-pong refilled the bucket (the return trip T(s) ≥ β·b_s: each send starts with a
  full bucket), and when a timing noise of 1% of T(s) is at most 1/8 of b_s (s ≤ 8·b_s);
  b = the median of b_s over at least two such sizes, kept only when it exceeds twice their median
  absolute deviation (a link without a bucket gives b_s scattered around 0). The peak rate R is not
  fitted (left unlimited): below the burst a ping-pong message starts from a full bucket only when
  the return trip refilled it, T(s) ≥ β·s, which on a shaped link holds only for a few hundred bytes
  (on the emulated 200 Mbit/s link: s ≤ 256 B), where s/R is below the timing noise; 1 KiB and 2 KiB
  ping-pongs there take s/(2r), the refill-limited steady state, not α + s/R. Give
  `burst_peak_bandwidth_gbytes_per_s` in the profile when the peak is known.

`link_parameters` turns the fits into the LogGP tier dlsim stores: G = β and L + 2o = α of the
ping-pong fit (so the Hockney projection of the tier is the α-β fit), with the Netgauge o and g,
o capped at α/2 and g at α so that g ≤ L + 2o.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.optimize import nnls

from dlsim.units import KIB


@dataclass(frozen=True)
class AlphaBeta:
    alpha: float
    beta: float
    lo_bytes: float
    hi_bytes: float
    points: int
    median_abs_rel_error: float
    max_abs_rel_error: float
    note: str = ""


@dataclass(frozen=True)
class LogGP:
    L: float
    o: float
    g: float
    G: float
    points: int
    dropped: int
    o_by_size: dict
    note: str = ""


def fit_alpha_beta(sizes: Sequence[float], times: Sequence[float]) -> AlphaBeta:
    """Relative least squares of T = α + β·m (α, β ≥ 0)."""
    m = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    if len(m) < 2:
        raise ValueError("an alpha-beta fit needs at least two sizes")
    a = np.stack([1.0 / t, m / t], axis=1)
    (alpha, beta), _ = nnls(a, np.ones_like(t))
    err = (alpha + beta * m - t) / t
    return AlphaBeta(float(alpha), float(beta), float(m.min()), float(m.max()), len(m),
                     float(np.median(np.abs(err))), float(np.max(np.abs(err))))


def fit_hockney(sizes: Sequence[float], times: Sequence[float], large: float = 1024 * KIB,
                small: float = KIB) -> AlphaBeta:
    """β from the large messages, α from the small ones (module docstring)."""
    m = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    order = np.argsort(m)
    m, t = m[order], t[order]
    quarter = max(2, len(m) // 4)
    big = m >= large if (m >= large).sum() >= 2 else np.arange(len(m)) >= len(m) - quarter
    beta = float(np.polyfit(m[big], t[big], 1)[0]) if big.sum() >= 2 else 0.0
    note = ""
    if not beta > 0 and len(m) >= 2:
        # timing noise hides the slope of the large messages (a few quick repetitions): the slope over
        # the whole range, else the largest message's time per byte (no latency: a bandwidth that is
        # too low rather than an infinite one)
        span, rise = m[-1] - m[0], t[-1] - t[0]
        beta = rise / span if span > 0 and rise > 0 else t[-1] / m[-1]
        note = (f"the large messages' slope was not positive (timing noise); beta from "
                f"{'the whole size range' if span > 0 and rise > 0 else 'the largest message alone'}")
    tiny = m <= small if (m <= small).any() else np.arange(len(m)) < quarter
    alpha = max(0.0, float(np.median(t[tiny] - beta * m[tiny])))
    err = (alpha + beta * m - t) / t
    return AlphaBeta(alpha, float(beta), float(m.min()), float(m.max()), len(m), float(np.median(np.abs(err))),
                     float(np.max(np.abs(err))), note)


def _residual(fit: AlphaBeta, m: np.ndarray, t: np.ndarray) -> float:
    return float(np.sum(((fit.alpha + fit.beta * m - t) / t) ** 2))


def fit_piecewise(sizes: Sequence[float], times: Sequence[float], max_breaks: int = 2,
                  min_points: int = 3) -> list[AlphaBeta]:
    """α-β per size range with up to `max_breaks` breaks chosen to minimise the relative residual."""
    order = np.argsort(np.asarray(sizes, dtype=float))
    m = np.asarray(sizes, dtype=float)[order]
    t = np.asarray(times, dtype=float)[order]
    best = [fit_alpha_beta(m, t)]
    best_res = _residual(best[0], m, t)
    for k in range(1, max_breaks + 1):
        for cuts in itertools.combinations(range(min_points, len(m) - min_points + 1), k):
            bounds = [0, *cuts, len(m)]
            if any(b - a < min_points for a, b in zip(bounds, bounds[1:])):
                continue
            pieces = [fit_alpha_beta(m[a:b], t[a:b]) for a, b in zip(bounds, bounds[1:])]
            res = sum(_residual(p, m[a:b], t[a:b]) for p, (a, b) in zip(pieces, zip(bounds, bounds[1:])))
            # a break must halve the residual, and only while the fit is worse than 1 ppm rms
            if res < best_res * 0.5 and best_res > len(m) * 1e-12:
                best, best_res = pieces, res
    return best


def fit_loggp(prtt1: dict[float, float], prttn: dict[float, float], prttd: dict[float, float],
              delays: dict[float, float], n: int) -> LogGP:
    """Netgauge's LogGP from PRTT medians keyed by size (see the module docstring)."""
    sizes = sorted(set(prtt1) & set(prttn))
    if len(sizes) < 2:
        raise ValueError("a LogGP fit needs PRTT(1,0,s) and PRTT(n,0,s) at two sizes or more")
    s = np.asarray(sizes, dtype=float)
    y = np.asarray([(prttn[x] - prtt1[x]) / (n - 1) for x in sizes])
    keep = np.ones(len(s), dtype=bool)
    for _ in range(2):
        slope, intercept = np.polyfit(s[keep] - 1, y[keep], 1)
        resid = np.abs(intercept + slope * (s - 1) - y)
        # twice the median residual, never below 1 ppm of the typical value (exact data has no outliers)
        limit = max(2 * np.median(resid[keep]), 1e-6 * np.median(np.abs(y)))
        new = resid <= limit
        if new.sum() < 2 or np.array_equal(new, keep):
            break
        keep = new
    o_by_size = {x: (prttd[x] - prtt1[x]) / (n - 1) - delays.get(x, 0.0) for x in sizes if x in prttd}
    small = [v for x, v in o_by_size.items() if x <= 4 * KIB] or list(o_by_size.values()) or [0.0]
    o = max(0.0, statistics.median(small))
    L = max(0.0, prtt1[sizes[0]] / 2 - 2 * o)
    notes = []
    if slope <= 0:
        notes.append("non-positive G from PRTT; G comes from the ping-pong fit instead")
    return LogGP(L=L, o=o, g=max(0.0, float(intercept)), G=max(0.0, float(slope)), points=int(keep.sum()),
                 dropped=int((~keep).sum()), o_by_size={int(k): v for k, v in o_by_size.items()}, note="; ".join(notes))


def fit_gamma(sizes: Sequence[float], times: Sequence[float], min_bytes: float = 256 * KIB) -> float:
    """Reduction seconds per byte: slope of the line through the times of vectors ≥ `min_bytes`."""
    pairs = [(m, t) for m, t in zip(sizes, times) if m >= min_bytes] or list(zip(sizes, times))
    if len(pairs) == 1:
        return pairs[0][1] / pairs[0][0]
    m, t = np.asarray(pairs, dtype=float).T
    slope = float(np.polyfit(m, t, 1)[0])
    return slope if slope > 0 else float(np.median(t / m))


@dataclass(frozen=True)
class Burst:
    """A fitted token bucket: `burst_bytes` b, `peak_bytes_per_s` R (inf: no peak-rate term)."""

    burst_bytes: float
    peak_bytes_per_s: float
    points: dict
    mad_bytes: float


def fit_burst(sizes: Sequence[float], times: Sequence[float], alpha: float, beta: float) -> Burst | None:
    """The token bucket of the module docstring from ping-pong one-way `times` at `sizes`; None
    when the data shows none (fewer than two usable sizes, or b within twice its scatter)."""
    if beta <= 0:
        return None
    points = {}
    for m, t in sorted(zip(sizes, times)):
        excess = t - alpha
        b = m - excess / beta
        if 0 < b and 2 * b <= m <= 8 * b and excess >= alpha and t >= beta * b:
            points[int(m)] = float(b)
    if len(points) < 2:
        return None
    values = list(points.values())
    b = statistics.median(values)
    mad = statistics.median(abs(v - b) for v in values)
    if b <= 2 * mad:
        return None
    return Burst(float(b), float("inf"), points, float(mad))


@dataclass(frozen=True)
class LinkParameters:
    """The LogGP tier written into a profile (SI units)."""

    latency: float
    overhead: float
    gap: float
    bandwidth: float
    notes: tuple[str, ...]


def link_parameters(ab: AlphaBeta, loggp: LogGP | None) -> LinkParameters:
    """L, o, g and bandwidth for the profile: Hockney projection = the α-β fit (module docstring)."""
    notes = []
    o = loggp.o if loggp else 0.0
    g = loggp.g if loggp else 0.0
    if 2 * o > ab.alpha:
        notes.append(f"o capped from {o:.3g} s to alpha/2 = {ab.alpha / 2:.3g} s")
        o = ab.alpha / 2
    if g > ab.alpha:
        notes.append(f"g capped from {g:.3g} s to alpha = {ab.alpha:.3g} s (g <= L + 2o)")
        g = ab.alpha
    if ab.note:
        notes.append(ab.note)
    if not ab.beta > 0:  # fit_hockney never gives one; a fit without a slope has no bandwidth to store
        raise ValueError("no per-byte time to fit a bandwidth from (every message took the same time)")
    bandwidth = 1.0 / ab.beta
    return LinkParameters(latency=ab.alpha - 2 * o, overhead=o, gap=g, bandwidth=bandwidth, notes=tuple(notes))
