"""Failures and checkpoints in closed form: the job's mean time between interruptions, the
optimal checkpoint interval, the expected wall time, failures and lost work of a run.

Model (Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
Future Generation Computer Systems 22(3), 2006, §2-§4): failures arrive as a Poisson process of
mean time between failures M (exponential, memoryless; also during checkpoints and restarts);
the job computes `interval` τ seconds of work, then blocks for a checkpoint of δ seconds; a
failure loses everything since the last completed checkpoint and costs a restart of R seconds
(relaunch, read the checkpoint, warm up), itself interruptible. A segment of s = τ + δ seconds
then takes, in expectation,

    E[T_s] = M · e^{R/M} · (e^{s/M} − 1)                                   (Daly 2006, eq. 13)

and fails e^{s/M} − 1 times (a geometric number of attempts, each succeeding with e^{−s/M}),
each failure followed by e^{R/M} − 1 failed restarts on average. A run of W seconds of work is
⌊W/τ⌋ full segments and a last one of W − ⌊W/τ⌋·τ. The optimum interval:

    Young (1974):  τ = √(2 δ M)
    Daly (2006, eq. 37):  τ = √(2 δ M) · [1 + ⅓·√(δ / 2M) + (δ / 2M) / 9] − δ   for δ < 2M, else M

and, exactly for this model, the minimum of the expected wall time (`optimal_interval`).
`dlsim.sim.failures` runs the same process event by event (Monte Carlo) as the check.

The job's interruption rate is the sum over its parts (a series system): nodes × the rate per node
+ devices × the rate per device (`dlsim.spec.run.Reliability`), so that its mean time between
interruptions falls as 1 / size (Kokolis et al., "Revisiting Reliability in Large-Scale Machine
Learning Research Clusters", arXiv:2410.21680, 2024, §V: MTTF = 1 / (N_nodes · r_f)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.optimize import minimize_scalar


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum √(2 δ M)."""
    return math.sqrt(2 * checkpoint_s * mtbf_s)


def daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (2006, eq. 37); M when δ ≥ 2M."""
    d, m = checkpoint_s, mtbf_s
    if d >= 2 * m:
        return m
    x = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d


def _expm1_ratio(s: float, m: float) -> float:
    """e^{s/M} − 1 (0 for an infinite M)."""
    return 0.0 if math.isinf(m) else math.expm1(s / m)


def segments(work_s: float, interval_s: float) -> tuple[int, float]:
    """(full segments, work of the last partial one) of `work_s` seconds in `interval_s` chunks."""
    n = math.floor(work_s / interval_s + 1e-12)
    rest = work_s - n * interval_s
    return n, rest if rest > 1e-9 * interval_s else 0.0


@dataclass(frozen=True)
class RunTime:
    """The expected time of a run (seconds): its parts add up to `wall_s`."""

    work_s: float
    checkpoint_s: float
    lost_s: float
    restart_s: float
    failures: float
    checkpoints: int

    @property
    def wall_s(self) -> float:
        return self.work_s + self.checkpoint_s + self.lost_s + self.restart_s

    @property
    def goodput(self) -> float:
        """Useful work / wall time (the effective training time ratio)."""
        return self.work_s / self.wall_s if self.wall_s > 0 else 1.0

    def to_dict(self) -> dict[str, float]:
        return {"work_s": self.work_s, "checkpoint_s": self.checkpoint_s, "lost_work_s": self.lost_s,
                "restart_s": self.restart_s, "wall_s": self.wall_s, "failures": self.failures,
                "checkpoints": self.checkpoints, "goodput": self.goodput}


def expected_run(work_s: float, interval_s: float, checkpoint_s: float, restart_s: float,
                 mtbf_s: float) -> RunTime:
    """The expected wall time of `work_s` seconds of work, checkpointed every `interval_s` seconds of
    work at `checkpoint_s` each (also after the last segment), restarts of `restart_s`, failures of
    mean time `mtbf_s` (inf: none), split into work, checkpoints, lost work and restarts (module
    docstring). With no failures: work + checkpoints exactly."""
    if work_s <= 0:
        return RunTime(0.0, 0.0, 0.0, 0.0, 0.0, 0)
    n, rest = segments(work_s, interval_s)
    lengths = [interval_s + checkpoint_s] * n + ([rest + checkpoint_s] if rest else [])
    m, r = mtbf_s, restart_s
    work_failures = n * _expm1_ratio(interval_s + checkpoint_s, m) + (_expm1_ratio(rest + checkpoint_s, m) if rest else 0.0)
    ckpt = checkpoint_s * len(lengths)
    if math.isinf(m):
        return RunTime(work_s, ckpt, 0.0, 0.0, 0.0, len(lengths))
    lost = m * work_failures - work_s - ckpt                  # time in attempts a failure cut short
    restarts = work_failures * m * math.expm1(r / m)           # each failure's restart, itself interruptible
    failures = work_failures * math.exp(r / m)
    return RunTime(work_s, ckpt, max(lost, 0.0), restarts, failures, len(lengths))


def wall_time_rate(interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """Expected wall seconds per second of work with whole segments, M e^{R/M} (e^{(τ+δ)/M} − 1) / τ:
    what `optimal_interval` minimises."""
    if math.isinf(mtbf_s):
        return (interval_s + checkpoint_s) / interval_s
    m = mtbf_s
    return m * math.exp(restart_s / m) * math.expm1((interval_s + checkpoint_s) / m) / interval_s


def optimal_interval(checkpoint_s: float, restart_s: float, mtbf_s: float, minimum_s: float = 0.0) -> float:
    """The interval that minimises `wall_time_rate` (at least `minimum_s`); with no failures or a free
    checkpoint there is no interior optimum and the answer is inf (never checkpoint) or `minimum_s`."""
    if math.isinf(mtbf_s):
        return math.inf
    if checkpoint_s <= 0:
        return max(minimum_s, 0.0)
    guess = daly_interval(checkpoint_s, mtbf_s)
    lo, hi = max(minimum_s, guess / 50, 1e-6), max(minimum_s * 2, guess * 50, mtbf_s * 5)
    res = minimize_scalar(lambda t: wall_time_rate(t, checkpoint_s, restart_s, mtbf_s), bounds=(lo, hi),
                          method="bounded", options={"xatol": max(guess, lo) * 1e-6})
    return max(float(res.x), minimum_s)


def mtbf(rate_per_s: float) -> float:
    """Mean time between interruptions of a job interrupted at `rate_per_s` (inf at rate 0)."""
    return math.inf if rate_per_s <= 0 else 1.0 / rate_per_s
