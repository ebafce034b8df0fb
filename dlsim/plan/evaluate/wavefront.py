"""A pipeline schedule's ops as a dependency structure, built once per (schedule, p, m, v) and walked
in one pass: what `dlsim.plan.evaluate.pipeline.pipeline_walk` computes op by op, without searching
for the next op that can run.

Each op ends at E = max(E(previous op on its stage), E(its input) + c) + d: its input the previous
chunk's forward (a forward) or the next chunk's backward (a backward) of the same micro-batch, c the
transfer across that chunk boundary, d the op's forward or backward time. The ops are put in an order
where every op comes after both (`Structure`); an op without one refers to a slot that stays 0 with
c = 0 (times are never negative, so max(t, 0) = t and the sums are the op-by-op walk's, to the bit).
A deep pipeline's ops fall into few levels of mutually independent ops (each after the level before),
which `walk` runs as numpy vectors, one level at a time, once the structure has been walked often
enough to pay for building them (`VECTOR_AFTER`); a shallow one is walked op by op.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Sequence

import numpy as np

from dlsim.plan.pipeline import FORWARD, stage_ops

@lru_cache(maxsize=4096)
def cached_stage_ops(schedule: str, p: int, m: int, v: int, r: int) -> tuple:
    """`stage_ops`, kept: the search asks for the same schedules again and again."""
    return tuple(stage_ops(schedule, p, m, v, r))


@lru_cache(maxsize=4096)
def cached_stage_steps(schedule: str, p: int, m: int, v: int, r: int) -> tuple[tuple[bool, int], ...]:
    """`cached_stage_ops` as (is a forward, local chunk) pairs, what `activation_peak` reads of each op."""
    return tuple((op.kind == FORWARD, op.chunk) for op in cached_stage_ops(schedule, p, m, v, r))


REUSED_AFTER = 1
"""Requests for a schedule's walk before its structure is built (`reused_structure`): building one costs
a few op-by-op walks, each walk of it a fraction of one; a one-off prediction walks op by op."""
_REQUESTS: dict[tuple, int] = {}
VECTOR_OPS_PER_LEVEL = 64
"""Ops per level at which a level-by-level numpy walk beats an op-by-op one (measured on Python 3.11:
about 6 µs per level against 0.09 µs per op)."""
VECTOR_AFTER = 16
"""Op-by-op walks of a structure before its levels are built (`Structure.levels`: building them costs
about as many walks, so a schedule walked a few times, as most of a search's are, never pays it)."""


@dataclass(frozen=True)
class Structure:
    """The ops of every stage (stage r's are ids offsets[r] .. offsets[r+1]−1, in its op order), in an
    order that puts every op after its predecessor on the stage and its input (`ops`: per op (id,
    predecessor, input, transfer index, stage, slot); N, the id of the slot that stays 0, stands for a
    missing one; transfer index K − 1 is the zero transfer; the slot names the op's kind and global
    chunk k: 2k for a backward, 2k + 1 for a forward, 2K + k for micro-batch 0's forward, `chunk_of`), and
    the ids of each stage's last backward of each local chunk (`last`). Derived on first use, for the
    walks that time the pipeline alone (`walk`): `steps`, per op (id, predecessor, input, transfer index,
    duration index; durations are f[0..K−1] then b[0..K−1]), and the same steps grouped into levels of
    independent ops (`levels`: numpy arrays id, predecessor, input, transfer, duration per level; empty
    where the ops are too few per level to pay for vectors)."""

    n: int
    offsets: tuple[int, ...]
    last: tuple[tuple[int, ...], ...]
    ops: tuple[tuple, ...] = ()
    K: int = 0
    walks: list[int] = field(default_factory=lambda: [0], compare=False)
    """How many times `walk` has walked it op by op (`VECTOR_AFTER`)."""

    @cached_property
    def steps(self) -> tuple[tuple[int, int, int, int, int], ...]:
        K = self.K
        return tuple([(j, prev, dep, trans, chunk_of(slot, K) if slot & 1 or slot >= 2 * K else K + (slot >> 1))
                      for j, prev, dep, trans, _, slot in self.ops])

    @cached_property
    def levels(self) -> tuple[tuple[np.ndarray, ...], ...]:
        level = [-1] * (self.n + 1)  # the zero slot n: level -1
        for j, prev, dep, _, _ in self.steps:
            a, b = level[prev], level[dep]
            level[j] = (a if a > b else b) + 1
        depth = max(level[:self.n], default=-1) + 1
        if self.n < VECTOR_OPS_PER_LEVEL * depth:
            return ()
        rows = np.array([(level[s[0]],) + s for s in self.steps], dtype=np.int64).reshape(-1, 6)
        rows = rows[np.argsort(rows[:, 0], kind="stable")]
        cuts = np.flatnonzero(np.diff(rows[:, 0])) + 1
        return tuple(tuple(np.ascontiguousarray(part[:, c]) for c in range(1, 6)) for part in np.split(rows, cuts))

    @property
    def vectorised(self) -> bool:
        """Whether to walk level by level: `levels` is there (deep pipelines, with many ops per level),
        built once the structure has been walked `VECTOR_AFTER` times op by op."""
        if "levels" not in self.__dict__ and self.walks[0] < VECTOR_AFTER:
            self.walks[0] += 1
            return False
        return bool(self.levels)


def chunk_of(slot: int, K: int) -> int:
    """The global chunk of an op's slot (`Structure.ops`)."""
    return slot - 2 * K if slot >= 2 * K else slot >> 1


def reused_structure(schedule: str, p: int, m: int, v: int) -> Structure | None:
    """`structure` of a schedule asked for more than `REUSED_AFTER` times in this process, else None
    (the caller walks op by op)."""
    key = (schedule, p, m, v)
    seen = _REQUESTS.get(key, 0)
    if seen < REUSED_AFTER:
        if len(_REQUESTS) > 4096:
            _REQUESTS.clear()
        _REQUESTS[key] = seen + 1
        return None
    return structure(schedule, p, m, v)


@lru_cache(maxsize=256)
def structure(schedule: str, p: int, m: int, v: int) -> Structure:
    """The dependency structure of `schedule` with p stages, m micro-batches, v chunks per stage: the
    stages' op orders run round-robin as far as each op's input is placed (the op-by-op walk's order)."""
    K = p * v
    ops = [cached_stage_ops(schedule, p, m, v, r) for r in range(p)]
    offsets = [0]
    for o in ops:
        offsets.append(offsets[-1] + len(o))
    n = offsets[-1]
    # the id of the forward / backward of global chunk k and micro-batch mb: fid[k][mb] (−1: not placed)
    fid = [[-1] * m for _ in range(K)]
    bid = [[-1] * m for _ in range(K)]
    op_rows: list[tuple] = []
    last = [[n] * v for _ in range(p)]
    pos = [0] * p
    while len(op_rows) < n:
        before = len(op_rows)
        for r in range(p):
            order, i, base = ops[r], pos[r], offsets[r]
            end = len(order)
            while i < end:
                kind, mb, chunk = order[i]
                k = chunk * p + r
                j = base + i
                if kind == FORWARD:
                    if k > 0:
                        dep = fid[k - 1][mb]
                        if dep < 0:
                            break
                        trans = k - 1
                    else:
                        dep, trans = n, K - 1
                    fid[k][mb] = j
                    op_rows.append((j, j - 1 if i else n, dep, trans, r, 2 * k + 1 if mb else 2 * K + k))
                else:
                    if k < K - 1:
                        dep = bid[k + 1][mb]
                        if dep < 0:
                            break
                        trans = k
                    else:
                        dep, trans = n, K - 1
                    bid[k][mb] = j
                    last[r][chunk] = j
                    op_rows.append((j, j - 1 if i else n, dep, trans, r, 2 * k))
                i += 1
            pos[r] = i
        if len(op_rows) == before:  # pragma: no cover  (the schedules are deadlock-free)
            raise RuntimeError(f"pipeline schedule {schedule} deadlocked")
    return Structure(n, tuple(offsets), tuple(tuple(x) for x in last), tuple(op_rows), K)


def walk(st: Structure, f: Sequence[float], b: Sequence[float], c: Sequence[float]) -> list[float]:
    """End of every op (by id; the last slot is the zero one) with forward and backward times f[k],
    b[k] of global chunk k and transfers c[k] across boundary k → k+1."""
    durations = list(f) + list(b)
    transfers = list(c) + [0.0]
    if st.vectorised:
        E = np.zeros(st.n + 1)
        d, t = np.asarray(durations, dtype=float), np.asarray(transfers, dtype=float)
        for ids, prev, dep, trans, dur in st.levels:
            E[ids] = np.maximum(E[prev], E[dep] + t[trans]) + d[dur]
        return E.tolist()
    ends = [0.0] * (st.n + 1)
    for j, prev, dep, trans, dur in st.steps:
        t, x = ends[prev], ends[dep] + transfers[trans]
        ends[j] = (t if t >= x else x) + durations[dur]
    return ends


def op_steps(schedule: str, p: int, m: int, v: int) -> tuple[Structure, tuple[tuple, ...]]:
    """`structure` with every step's op (`Structure.ops`: each stage's ops in its op order, as
    `dlsim.plan.evaluate.pipeline.walk_ops` runs them), for walks whose ops are timed by a caller
    (`dlsim.plan.evaluate.stream.StreamWalk._programs`)."""
    st = structure(schedule, p, m, v)
    return st, st.ops
