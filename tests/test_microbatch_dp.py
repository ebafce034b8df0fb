"""WR dynamic programme and desirable sets against brute-force enumeration of every split."""

from __future__ import annotations

import itertools
import random

import pytest

from dlsim.errors import InfeasibleError, SpecError
from dlsim.plan.microbatch import (BenchTable, Config, Kernel, KernelTable, batch_sizes, min_feasible_limit,
                                   pareto_front, plan_wr, undivided, wr_best, wr_desirable)
from dlsim.plan.microbatch.configs import dominates


def test_policies():
    assert batch_sizes("undivided", 12) == (12,)
    assert batch_sizes("powerOfTwo", 12) == (1, 2, 4, 8, 12)
    assert batch_sizes("powerOfTwo", 16) == (1, 2, 4, 8, 16)
    assert batch_sizes("all", 5) == (1, 2, 3, 4, 5)
    with pytest.raises(SpecError, match="unknown micro-batch policy"):
        batch_sizes("some", 4)


def _table(seed: int, batch: int, algos=("a", "b", "c"), missing: float = 0.2) -> KernelTable:
    rng = random.Random(seed)
    rows = []
    for b in range(1, batch + 1):
        for a in algos:
            if rng.random() < missing and b != 1:
                continue
            rows.append(Kernel(a, b, round(rng.uniform(0.5, 2.0) * b ** rng.uniform(0.7, 1.1), 3),
                               float(rng.choice([0, 1, 2, 3, 5, 8]) * b + rng.randint(0, 4))))
    return KernelTable("L", "forward", tuple(rows))


def _partitions(total: int, parts: tuple[int, ...], smallest: int = 0):
    """Multisets of `parts` (ascending) summing to `total`."""
    if total == 0:
        yield ()
        return
    for i, p in enumerate(parts):
        if p < smallest or p > total:
            continue
        for rest in _partitions(total - p, parts, p):
            yield (p,) + rest


def _all_configs(table: KernelTable, batch: int, limit: float, policy: str) -> list[tuple[float, float, tuple]]:
    sizes = batch_sizes(policy, batch)
    out = []
    for split in _partitions(batch, sizes):
        choices = [[r for r in table.at(b) if r.workspace_bytes <= limit] for b in split]
        for combo in itertools.product(*choices):
            out.append((sum(k.time_s for k in combo), max(k.workspace_bytes for k in combo), combo))
    return out


CASES = [(seed, batch, policy, limit) for seed in range(6) for batch in (5, 6, 8) for policy in ("powerOfTwo", "all")
         for limit in (4, 12, 1e9)]


@pytest.mark.parametrize("seed,batch,policy,limit", CASES)
def test_wr_best_matches_brute_force(seed, batch, policy, limit):
    table = _table(seed, batch)
    brute = _all_configs(table, batch, limit, policy)
    got = wr_best(table, batch, limit, policy)
    if not brute:
        assert got is None
        assert min_feasible_limit(table, batch, policy) > limit
        return
    assert got is not None
    assert got.time_s == pytest.approx(min(c[0] for c in brute), abs=1e-12)
    assert got.batch == batch and all(s in batch_sizes(policy, batch) for s in got.sizes)
    assert got.workspace_bytes <= limit and got.workspace_bytes == max(k.workspace_bytes for k in got.kernels)
    assert min_feasible_limit(table, batch, policy) == min(c[1] for c in _all_configs(table, batch, 1e18, policy))


@pytest.mark.parametrize("seed,batch,policy,limit", CASES[::3])
def test_desirable_set_is_the_pareto_front_of_all_splits(seed, batch, policy, limit):
    table = _table(seed, batch)
    brute = _all_configs(table, batch, limit, policy)
    front = {(ws, round(t, 9)) for t, ws, _ in brute
             if not any(w2 <= ws and t2 < t - 1e-12 or (w2 < ws and t2 <= t + 1e-12) for t2, w2, _ in brute)}
    got = wr_desirable(table, batch, limit, policy)
    assert {(c.workspace_bytes, round(c.time_s, 9)) for c in got} == front
    assert [c.workspace_bytes for c in got] == sorted(c.workspace_bytes for c in got)
    for c in got:
        assert c.batch == batch and c.time_s == pytest.approx(sum(k.time_s for k in c.kernels))


def test_pareto_front_is_exactly_the_non_dominated_set():
    rng = random.Random(7)
    for _ in range(200):
        items = [Kernel(f"k{i}", 1, float(rng.randint(1, 12)), float(rng.randint(0, 12))) for i in range(rng.randint(1, 25))]
        front = pareto_front(items)
        kept = {(k.workspace_bytes, k.time_s) for k in front}
        expected = {(k.workspace_bytes, k.time_s) for k in items if not any(dominates(o, k) for o in items)}
        assert kept == expected
        assert len(front) == len(kept)                           # equal (ws, t) collapse to one
        assert all(a.time_s > b.time_s for a, b in zip(front, front[1:]))


def test_pareto_front_desirable_set_example_by_hand():
    ks = [Kernel("a", 1, 10, 0), Kernel("b", 1, 8, 5), Kernel("c", 1, 9, 6), Kernel("d", 1, 8, 5), Kernel("e", 1, 3, 9)]
    assert [k.algorithm for k in pareto_front(ks)] == ["a", "b", "e"]


def test_microbatching_beats_undivided_under_a_limit_hand_example():
    # fast algorithm "f" needs 10 bytes per sample; "s" is slow and needs none
    rows = tuple([Kernel("s", b, 1.0 * b, 0.0) for b in (1, 2, 4, 8)] + [Kernel("f", b, 0.4 * b, 10.0 * b) for b in (1, 2, 4, 8)])
    table = KernelTable("conv", "forward", rows)
    best = wr_best(table, 8, 40.0, "powerOfTwo")
    # every split into parts <= 4 through "f" takes 3.2; among equal times the smallest workspace wins
    assert best.time_s == pytest.approx(3.2) and {k.algorithm for k in best.kernels} == {"f"}
    assert best.sizes == (1,) * 8 and best.workspace_bytes == 10.0
    assert undivided(table, 8, 40.0).algorithm == "s"
    plan = plan_wr(BenchTable((table,)), 8, 40.0, "powerOfTwo")
    assert plan.speedup == pytest.approx(8.0 / 3.2) and plan.workspace_bytes == 10.0
    faster_big = KernelTable("conv", "forward", rows + (Kernel("f", 4, 1.5, 40.0),))
    assert wr_best(faster_big, 8, 40.0, "powerOfTwo").sizes == (4, 4)
    assert wr_best(table, 8, 40.0, "undivided").time_s == 8.0


def test_wr_infeasible_limit_names_the_smallest_feasible_one():
    rows = tuple(Kernel("x", b, b, 100.0 + b) for b in (1, 2, 4))
    table = BenchTable((KernelTable("conv1", "forward", rows),))
    with pytest.raises(InfeasibleError, match=r"conv1 forward: .*smallest limit every kernel fits is .*101 bytes"):
        plan_wr(table, 4, 50.0)


def test_config_orders_microbatches_largest_first():
    c = Config.of([Kernel("a", 1, 1, 1), Kernel("b", 4, 1, 9), Kernel("a", 2, 1, 3)])
    assert c.sizes == (4, 2, 1) and c.workspace_bytes == 9 and c.time_s == 3
