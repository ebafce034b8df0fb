"""WD (workspace division): μ-cuDNN's integer linear programme across kernels, with PuLP.

Oyama et al., CLUSTER 2018 (code: spcl/ucudnn src/ilpOptimizer.cpp; survey slide S003 L4434-4765), a
multiple-choice knapsack over each kernel's desirable set D_k:

    minimise    Σ_k Σ_{c ∈ D_k} t_{k,c} · x_{k,c}
    subject to  Σ_{c ∈ D_k} x_{k,c} = 1                 for every kernel k
                Σ_k Σ_{c ∈ D_k} m_{k,c} · x_{k,c} ≤ M
                x_{k,c} ∈ {0, 1}

CBC (bundled with PuLP) by default, HiGHS (``highspy``) on request; a time limit. PuLP reports
"Optimal" even when CBC stopped at its time limit with a merely feasible solution, so the solution
status (``prob.sol_status``) decides: optimal, feasible-but-unproven (kept and flagged), or none
(`SolverError`). The chosen configurations are re-checked in exact arithmetic: one per kernel, total
workspace within the budget (a solver's tolerance on byte-sized coefficients could overshoot).
Kernels with identical desirable sets are solved as one group with integer counts (an exact
reformulation that removes symmetry; see `wd_ilp`). This is the only module of dlsim that imports ``pulp``.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

from dlsim.errors import InfeasibleError, SolverError
from dlsim.plan.microbatch.configs import Config
from dlsim.units import US, format_bytes

SOLVERS = ("cbc", "highs")
_TIME_UNIT = US          # objective in microseconds: coefficients of order 1..1e6
GAP_REL = 1e-3
"""Default relative optimality gap: a plan within 0.1 % of the optimum counts as optimal. Measured kernel
times carry percent-level noise, and proving the last 0.01 % can take CBC minutes on near-symmetric
instances (many identical layers)."""


@dataclass(frozen=True)
class IlpResult:
    """The chosen configuration index per kernel and how sure the solver is."""

    choice: tuple[int, ...]
    time_s: float
    workspace_bytes: float
    optimal: bool
    solver: str
    status: str
    solve_s: float
    note: str = ""


def interpret_status(status: int, sol_status: int) -> str:
    """'optimal', 'feasible' (stopped early, e.g. at the time limit, with a solution), 'infeasible' or 'none'.

    PuLP status codes: LpStatus 1 Optimal, 0 Not Solved, −1 Infeasible, −2 Unbounded, −3 Undefined;
    LpSolution 1 Optimal Solution Found, 2 Solution Found, 0 No Solution Found, −1 No Solution
    Exists, −2 Unbounded. CBC at its time limit with an incumbent gives status 1 and sol_status 2.
    """
    if status == -1 or sol_status == -1:
        return "infeasible"
    if sol_status == 1 and status == 1:
        return "optimal"
    if sol_status == 2:
        return "feasible"
    return "none"


def make_solver(solver: str | Any, time_limit_s: float, gap_rel: float = GAP_REL) -> tuple[Any, str]:
    """A PuLP solver object: "cbc" (PuLP's bundled CBC, or a system CBC), "highs" (needs highspy), or an
    already-built PuLP solver object (used as is)."""
    import pulp
    if not isinstance(solver, str):
        return solver, type(solver).__name__
    if solver == "cbc":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)   # PuLP 3.3 deprecates the bundled CBC for 4.0
            for factory in ("PULP_CBC_CMD", "COIN_CMD"):
                cls = getattr(pulp, factory, None)
                if cls is None:
                    continue
                obj = cls(msg=False, timeLimit=time_limit_s, gapRel=gap_rel)
                if obj.available():
                    return obj, "cbc"
        raise SolverError("CBC is not available: install it with `pip install pulp[cbc]`, or use --solver highs")
    if solver == "highs":
        obj = pulp.HiGHS(msg=False, timeLimit=time_limit_s, gapRel=gap_rel)
        if not obj.available():
            raise SolverError("HiGHS needs the highspy package: `pip install highspy` (or dlsim[highs]), or use --solver cbc")
        return obj, "highs"
    raise SolverError(f"unknown ILP solver {solver!r} (use {', '.join(SOLVERS)})")


def smallest_budget(fronts: Sequence[Sequence[Config]]) -> float:
    """Σ_k min_c m_{k,c}: the smallest total workspace with which every kernel can run."""
    return sum(min(c.workspace_bytes for c in front) for front in fronts)


def _add_count(prob: Any, name: str, upper: int) -> Any:
    """A binary (upper 1) or bounded integer variable."""
    import pulp
    cat = "Binary" if upper == 1 else "Integer"
    if hasattr(prob, "add_variable"):
        return prob.add_variable(name, 0, upper, cat=cat)
    return pulp.LpVariable(name, 0, upper, cat=cat)


def _groups(fronts: Sequence[Sequence[Config]]) -> list[list[int]]:
    """Kernels with identical fronts (same (time, workspace) list), in first-appearance order."""
    index: dict[tuple, list[int]] = {}
    for k, f in enumerate(fronts):
        index.setdefault(tuple((c.time_s, c.workspace_bytes) for c in f), []).append(k)
    return list(index.values())


def wd_ilp(fronts: Sequence[Sequence[Config]], budget: float, *, solver: str | Any = "cbc",
           time_limit_s: float = 10.0, gap_rel: float = GAP_REL, names: Sequence[str] | None = None) -> IlpResult:
    """Choose one configuration per kernel (index into its front) minimising total time within `budget`.

    `optimal` in the result means proven optimal within the relative gap `gap_rel` (0: exactly).

    Kernels with identical fronts (identical layers) are solved as one group with integer counts
    n_{g,c} ∈ [0, |g|], Σ_c n_{g,c} = |g|, instead of |g| interchangeable binary rows: an exact
    reformulation (which member runs which configuration does not change time or workspace) that
    removes the symmetry branch-and-bound otherwise cannot close (CBC stalls on ResNet-sized
    instances whose many identical layers give many equivalent optima). Counts are handed out to the
    group's members in order.

    Raises `InfeasibleError` (naming the smallest feasible budget) when no choice fits, `SolverError`
    when the solver stops without a solution.
    """
    import pulp
    solver_obj, solver_name = make_solver(solver, time_limit_s, gap_rel)
    label = list(names) if names is not None else [f"kernel {i}" for i in range(len(fronts))]
    for name, front in zip(label, fronts):
        if not front:
            raise InfeasibleError(f"{name}: no configuration fits the workspace budget {format_bytes(budget)}")
    least = smallest_budget(fronts)
    if least > budget:
        raise InfeasibleError(f"workspace budget {format_bytes(budget)} is infeasible: the smallest feasible budget "
                              f"is {format_bytes(least)} ({least:.0f} bytes)")
    fastest = [min(range(len(f)), key=lambda i, f=f: (f[i].time_s, f[i].workspace_bytes)) for f in fronts]
    if sum(fronts[k][c].workspace_bytes for k, c in enumerate(fastest)) <= budget:
        return _result(fronts, tuple(fastest), True, "none", "trivial", 0.0,
                       "every kernel's fastest configuration fits: no ILP needed")
    groups = _groups(fronts)
    limit = budget
    for _attempt in range(3):
        prob = pulp.LpProblem("ucudnn_wd", pulp.LpMinimize)
        n = {(g, c): _add_count(prob, f"n_{g}_{c}", len(members))
             for g, members in enumerate(groups) for c in range(len(fronts[members[0]]))}
        prob += pulp.lpSum(fronts[groups[g][0]][c].time_s / _TIME_UNIT * v for (g, c), v in n.items())
        for g, members in enumerate(groups):
            prob += pulp.lpSum(n[g, c] for c in range(len(fronts[members[0]]))) == len(members)
        prob += pulp.lpSum(fronts[groups[g][0]][c].workspace_bytes * v for (g, c), v in n.items()) <= limit
        start = time.perf_counter()
        try:
            prob.solve(solver_obj)
        except pulp.PulpSolverError as exc:
            raise SolverError(f"{solver_name} failed: {exc}") from None
        elapsed = time.perf_counter() - start
        verdict = interpret_status(prob.status, prob.sol_status)
        if verdict == "infeasible":
            # the smallest-workspace choice fits (checked above): a claim of infeasibility means the solver
            # stopped early (seen with CBC at tiny time limits under load), not that no plan exists
            verdict = "none"
        if verdict == "none":
            raise SolverError(f"{solver_name} stopped ({pulp.LpStatus.get(prob.status, prob.status)}, "
                              f"{pulp.LpSolution.get(prob.sol_status, prob.sol_status)}) after {elapsed:.2f} s "
                              f"without a feasible solution (time limit {time_limit_s:g} s; raise the time limit)")
        choice = [0] * len(fronts)
        for g, members in enumerate(groups):
            counts = [int(round(n[g, c].value() or 0.0)) for c in range(len(fronts[members[0]]))]
            if sum(counts) != len(members) or min(counts) < 0:
                raise SolverError(f"{solver_name} returned {sum(counts)} configurations for {len(members)} "
                                  f"kernel(s) starting with {label[members[0]]}")
            picks = [c for c, cnt in enumerate(counts) for _ in range(cnt)]
            for k, c in zip(members, picks):
                choice[k] = c
        used = sum(fronts[k][c].workspace_bytes for k, c in enumerate(choice))
        if used <= budget:
            note = "" if verdict == "optimal" else (
                f"{solver_name} stopped at the time limit ({time_limit_s:g} s) with a feasible solution; "
                "it may not be optimal")
            return _result(fronts, tuple(choice), verdict == "optimal", solver_name,
                           pulp.LpSolution.get(prob.sol_status, str(prob.sol_status)), elapsed, note)
        limit -= used - budget          # solver tolerance overshoot: tighten and solve again
    raise SolverError(f"{solver_name} kept exceeding the workspace budget by solver tolerance")


def _result(fronts, choice, optimal, solver, status, elapsed, note) -> IlpResult:
    return IlpResult(choice, sum(fronts[k][c].time_s for k, c in enumerate(choice)),
                     sum(fronts[k][c].workspace_bytes for k, c in enumerate(choice)), optimal, solver, status,
                     elapsed, note)
