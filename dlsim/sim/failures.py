"""A run of failures, event by event (Monte Carlo, seeded): the check of the closed form in
`dlsim.cost.reliability` and the distribution of a run's wall time and goodput.

Each trial walks the run as segments of `interval` seconds of work followed by a checkpoint
(the last segment holds what is left of the work), drawing the time to the next failure from an
exponential distribution of mean `mtbf` for every attempt (memoryless, so a fresh draw per
attempt is exact). A failure during a segment loses it; the job then restarts for `restart`
seconds, and a failure during the restart starts the restart again. With asynchronous
checkpointing the job blocks only `checkpoint` seconds (the snapshot) and the checkpoint becomes
durable `lag` seconds later, while the next segment runs: a failure before then rolls back one
segment further. Trials advance together as numpy arrays, one attempt per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlsim.cost.reliability import segments

MAX_TRIALS = 100_000
MAX_STEPS = 50_000_000
"""Bounds on one call: trials, and trials × attempts (a run of millions of segments is refused)."""


@dataclass(frozen=True)
class FailureRuns:
    """Per trial: wall time, failures, time lost to failures, time in restarts (seconds)."""

    wall_s: np.ndarray
    failures: np.ndarray
    lost_s: np.ndarray
    restart_s: np.ndarray
    work_s: float

    @property
    def goodput(self) -> np.ndarray:
        return self.work_s / self.wall_s

    def summary(self) -> dict[str, float]:
        g, w = self.goodput, self.wall_s
        n = len(w)
        return {"trials": n, "wall_s_mean": float(w.mean()), "wall_s_stderr": float(w.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0,
                "wall_s_p5": float(np.percentile(w, 5)), "wall_s_p50": float(np.percentile(w, 50)),
                "wall_s_p95": float(np.percentile(w, 95)), "goodput_mean": float(g.mean()),
                "goodput_p5": float(np.percentile(g, 5)), "goodput_p50": float(np.percentile(g, 50)),
                "goodput_p95": float(np.percentile(g, 95)), "failures_mean": float(self.failures.mean()),
                "lost_work_s_mean": float(self.lost_s.mean()), "restart_s_mean": float(self.restart_s.mean())}


def simulate_failures(work_s: float, interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float,
                      trials: int = 200, seed: int = 0, lag_s: float = 0.0) -> FailureRuns:
    """`trials` runs of `work_s` seconds of work (module docstring); the same arguments and seed
    give the same draws."""
    if not 1 <= trials <= MAX_TRIALS:
        raise ValueError(f"trials must be in [1, {MAX_TRIALS}], got {trials}")
    n_full, rest = segments(work_s, interval_s)
    n_seg = n_full + (1 if rest else 0)
    expected_steps = trials * n_seg * (1 + (interval_s + checkpoint_s + restart_s) / mtbf_s * 2 if np.isfinite(mtbf_s) else 1)
    if expected_steps > MAX_STEPS:
        raise ValueError(f"a Monte Carlo of {trials} trials x about {expected_steps / trials:.3g} attempts is beyond "
                         f"{MAX_STEPS:.0e} steps; use fewer trials or a longer interval")
    rng = np.random.default_rng(seed)
    done = np.zeros(trials, dtype=np.int64)            # segments completed (checkpointed)
    wall = np.zeros(trials)
    lost = np.zeros(trials)
    restart = np.zeros(trials)
    failures = np.zeros(trials, dtype=np.int64)
    in_restart = np.zeros(trials, dtype=bool)
    pending = np.zeros(trials, dtype=bool)             # the last checkpoint is not durable yet (async)
    active = np.ones(trials, dtype=bool) if n_seg else np.zeros(trials, dtype=bool)
    while active.any():
        idx = np.flatnonzero(active)
        x = rng.exponential(mtbf_s, idx.size) if np.isfinite(mtbf_s) else np.full(idx.size, np.inf)
        rs = in_restart[idx]
        # restarting trials
        r_idx, r_x = idx[rs], x[rs]
        ok = r_x >= restart_s
        restart[r_idx] += np.where(ok, restart_s, r_x)
        wall[r_idx] += np.where(ok, restart_s, r_x)
        failures[r_idx[~ok]] += 1
        in_restart[r_idx[ok]] = False
        # working trials
        w_idx, w_x = idx[~rs], x[~rs]
        last = done[w_idx] == n_seg - 1
        seg = np.where(last & (rest > 0), rest, interval_s) + checkpoint_s
        ok = w_x >= seg
        wall[w_idx] += np.where(ok, seg, w_x)
        good = w_idx[ok]
        done[good] += 1
        pending[good] = lag_s > 0
        bad, bad_x = w_idx[~ok], w_x[~ok]
        lost[bad] += bad_x
        failures[bad] += 1
        in_restart[bad] = True
        if lag_s > 0:  # the previous checkpoint was not durable yet: roll back one more segment
            back = bad[pending[bad] & (bad_x < lag_s) & (done[bad] > 0)]
            done[back] -= 1
            lost[back] += interval_s + checkpoint_s
            pending[bad] = False
            pending[good[done[good] == n_seg]] = False
        active[good[done[good] >= n_seg]] = False
    return FailureRuns(wall, failures, lost, restart, work_s)


def interval_scan(work_s: float, intervals: np.ndarray, checkpoint_s: float, restart_s: float, mtbf_s: float,
                  trials: int, seed: int = 0, lag_s: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Mean wall time and its standard error at each interval of `intervals` (the same seed for
    every interval: common random numbers)."""
    means, errs = [], []
    for t in intervals:
        runs = simulate_failures(work_s, float(t), checkpoint_s, restart_s, mtbf_s, trials, seed, lag_s)
        means.append(runs.wall_s.mean())
        errs.append(runs.wall_s.std(ddof=1) / np.sqrt(trials))
    return np.array(means), np.array(errs)


def simulated_optimum(work_s: float, intervals: np.ndarray, checkpoint_s: float, restart_s: float, mtbf_s: float,
                      trials: int, seed: int = 0, boot: int = 200, lag_s: float = 0.0) -> dict[str, float]:
    """The interval that minimises the simulated mean wall time and its Monte Carlo standard error.

    The means over `intervals` (a bracket of the optimum) are fitted by least squares with
    T(τ) = a/τ + b + c·τ + d·τ² (the expected wall time's expansion in τ/M: checkpoints cost W·δ/τ,
    lost work grows as τ/2M and beyond), and the simulated optimum is the fitted curve's minimum in
    the bracket; the error is its spread over `boot` bootstrap resamples of the trials (every
    interval resampled with the same trials)."""
    taus = np.asarray(intervals, dtype=float)
    walls = np.stack([simulate_failures(work_s, float(t), checkpoint_s, restart_s, mtbf_s, trials, seed,
                                        lag_s).wall_s for t in taus])
    basis = np.stack([1 / taus, np.ones_like(taus), taus, taus ** 2], axis=1)
    fine = np.geomspace(taus.min(), taus.max(), 2001)
    fine_basis = np.stack([1 / fine, np.ones_like(fine), fine, fine ** 2], axis=1)
    rng = np.random.default_rng(seed + 1)

    def vertex(means: np.ndarray) -> float:
        coef, *_ = np.linalg.lstsq(basis, means, rcond=None)
        return float(fine[int(np.argmin(fine_basis @ coef))])

    best = vertex(walls.mean(axis=1))
    picks = [vertex(walls[:, rng.integers(0, trials, trials)].mean(axis=1)) for _ in range(boot)]
    return {"interval_s": best, "stderr_s": float(np.std(picks, ddof=1)),
            "wall_s": walls.mean(axis=1).tolist(), "intervals_s": taus.tolist()}
