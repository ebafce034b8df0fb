"""WD ILP against brute force, infeasible budgets, solver time-outs (real CBC and PuLP's reporting reproduced)."""

from __future__ import annotations

import itertools
import random

import pulp
import pytest

from dlsim.errors import InfeasibleError, SolverError
from dlsim.plan.microbatch import BenchTable, Config, Kernel, KernelTable, plan_wd, plan_wr, wd_ilp
from dlsim.plan.microbatch.ilp import interpret_status, smallest_budget

SOLVERS = ["cbc"] + (["highs"] if pulp.HiGHS(msg=False).available() else [])


def _fronts(seed: int, kernels: int, configs: int) -> list[list[Config]]:
    rng = random.Random(seed)
    out = []
    for _ in range(kernels):
        ws = sorted(rng.sample(range(0, 50), configs))
        ts = sorted((round(rng.uniform(1, 20), 3) for _ in range(configs)), reverse=True)
        out.append([Config((Kernel("a", 1, t, float(w)),), t, float(w)) for t, w in zip(ts, ws)])
    return out


def _brute(fronts, budget):
    best = None
    for choice in itertools.product(*(range(len(f)) for f in fronts)):
        ws = sum(fronts[k][c].workspace_bytes for k, c in enumerate(choice))
        if ws <= budget:
            t = sum(fronts[k][c].time_s for k, c in enumerate(choice))
            best = t if best is None or t < best else best
    return best


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("seed", range(8))
def test_ilp_matches_brute_force(seed, solver):
    fronts = _fronts(seed, kernels=4, configs=4)
    least = smallest_budget(fronts)
    most = sum(f[-1].workspace_bytes for f in fronts)
    for budget in (least, (least + most) / 2, least + (most - least) / 4, most):
        res = wd_ilp(fronts, budget, solver=solver, gap_rel=0.0)
        assert res.optimal and res.workspace_bytes <= budget
        assert res.time_s == pytest.approx(_brute(fronts, budget), abs=1e-9)


@pytest.mark.parametrize("solver", SOLVERS)
def test_identical_kernels_are_grouped_exactly(solver):
    """Three identical kernels (one group with integer counts) and a different one, against brute force."""
    same = _fronts(11, kernels=1, configs=4)[0]
    fronts = [same, list(same), list(same)] + _fronts(12, kernels=1, configs=3)
    least = smallest_budget(fronts)
    for budget in (least, least + 20, least + 45, least + 80):
        res = wd_ilp(fronts, budget, solver=solver, gap_rel=0.0)
        assert res.time_s == pytest.approx(_brute(fronts, budget), abs=1e-9) and res.workspace_bytes <= budget
        assert list(res.choice[:3]) == sorted(res.choice[:3])          # counts handed out in order


def test_infeasible_budget_reports_the_smallest_feasible_one():
    fronts = [[Config((), 5.0, 10.0), Config((), 2.0, 30.0)], [Config((), 4.0, 7.0)]]
    with pytest.raises(InfeasibleError, match=r"smallest feasible budget is .*\(17 bytes\)"):
        wd_ilp(fronts, 16.0)
    assert wd_ilp(fronts, 17.0).choice == (0, 0)
    assert wd_ilp(fronts, 37.0).choice == (1, 0)


def test_interpret_status_covers_pulp_codes():
    assert interpret_status(1, 1) == "optimal"
    assert interpret_status(1, 2) == "feasible"      # CBC at its time limit: "Optimal" status, "Solution Found"
    assert interpret_status(0, 0) == "none"
    assert interpret_status(-1, -1) == "infeasible"
    assert interpret_status(-3, 0) == "none"


class _StoppedSolver(pulp.LpSolver):
    """Reproduces what PuLP reports when CBC stops at its time limit: status 1 ("Optimal") with sol_status 2
    ("Solution Found") and a feasible incumbent, or status 0 with no solution at all."""

    def __init__(self, with_solution: bool):
        super().__init__(msg=False)
        self.with_solution = with_solution

    def actualSolve(self, lp, **kwargs):
        if not self.with_solution:
            lp.assignStatus(0, 0)
            return 0
        for v in lp.variables():         # the all-first-choice incumbent: x_k_0 = 1
            v.varValue = 1.0 if v.name.endswith("_0") else 0.0
        lp.assignStatus(1, 2)
        return 1


def test_time_limit_with_incumbent_is_flagged_not_optimal():
    fronts = _fronts(3, kernels=3, configs=3)
    budget = smallest_budget(fronts) + 5
    res = wd_ilp(fronts, budget, solver=_StoppedSolver(True), time_limit_s=1.0)
    assert not res.optimal and res.choice == (0, 0, 0)
    assert "time limit" in res.note and "may not be optimal" in res.note


def test_time_limit_without_solution_raises_solver_error():
    fronts = _fronts(3, kernels=3, configs=3)
    with pytest.raises(SolverError, match="without a feasible solution"):
        wd_ilp(fronts, smallest_budget(fronts) + 5, solver=_StoppedSolver(False), time_limit_s=1.0)


def test_real_cbc_time_out_is_handled():
    """A 100 x 20 instance that CBC needs ~0.2 s for, with a 0.01 s limit: either no incumbent (SolverError)
    or an incumbent reported as not optimal, never a silent "optimal"."""
    rng = random.Random(1)
    fronts = []
    for _ in range(100):
        ws = sorted(rng.sample(range(1, 10 ** 6), 20))
        ts = sorted((rng.uniform(1e-3, 1e-1) for _ in range(20)), reverse=True)
        fronts.append([Config((), t, float(w)) for t, w in zip(ts, ws)])
    budget = sum(f[10].workspace_bytes for f in fronts)
    try:
        res = wd_ilp(fronts, budget, time_limit_s=0.01)
    except SolverError as exc:
        assert "time limit 0.01 s" in str(exc)
    else:
        assert res.workspace_bytes <= budget and (not res.optimal) == bool(res.note)


def test_unknown_or_missing_solver():
    with pytest.raises(SolverError, match="unknown ILP solver"):
        wd_ilp(_fronts(0, 2, 2), 1e9 * 0 + 40, solver="gurobi-please")


def _net() -> BenchTable:
    """Two layers; a fast algorithm needs 10 bytes per sample, a slow one none."""
    kernels = []
    for name, speed in (("c1", 1.0), ("c2", 2.0)):
        rows = [Kernel("slow", b, speed * b, 0.0) for b in (1, 2, 4)] + [Kernel("fast", b, 0.25 * speed * b, 10.0 * b)
                                                                        for b in (1, 2, 4)]
        kernels.append(KernelTable(name, "forward", tuple(rows)))
    return BenchTable(tuple(kernels))


def test_wd_divides_the_budget_where_it_pays_most():
    # 10 bytes: one kernel can run "fast" in micro-batches of 1; it goes to c2 (twice as slow, saves twice as much)
    plan = plan_wd(_net(), 4, 10.0, "powerOfTwo")
    assert plan.mode == "wd" and plan.optimal and plan.workspace_bytes == 10.0
    assert [k.algorithm for k in plan.layer("c2").passes[0].microbatches] == ["fast"] * 4
    assert plan.layer("c1").passes[0].microbatches[0].algorithm == "slow"
    assert plan.time_s == pytest.approx(4.0 + 2.0)
    assert plan.undivided_time_s == pytest.approx(4.0 + 8.0) and plan.speedup == pytest.approx(2.0)
    both = plan_wd(_net(), 4, 20.0, "powerOfTwo")
    assert both.time_s == pytest.approx(1.0 + 2.0) and both.speedup == pytest.approx(4.0)
    roomy = plan_wd(_net(), 4, 40.0, "powerOfTwo")   # undivided "fast" at 4 (40 bytes) now fits for one kernel
    assert roomy.undivided_time_s == pytest.approx(4.0 + 2.0) and roomy.time_s == pytest.approx(3.0)
    wr = plan_wr(_net(), 4, 10.0, "powerOfTwo")      # WR: every kernel gets the 10 bytes, reused
    assert wr.time_s == pytest.approx(1.0 + 2.0) and wr.workspace_bytes == 10.0


def test_wd_infeasible_budget_names_smallest_feasible():
    rows = (Kernel("x", 2, 1.0, 8.0), Kernel("x", 1, 0.6, 5.0))
    table = BenchTable((KernelTable("a", "forward", rows), KernelTable("b", "forward", rows)))
    with pytest.raises(InfeasibleError, match=r"smallest feasible budget is .*\(10 bytes\)"):
        plan_wd(table, 2, 9.0, "powerOfTwo")
    assert plan_wd(table, 2, 10.0, "powerOfTwo").time_s == pytest.approx(2.4)
