"""Pipeline schedules: the order in which each stage runs its forward and backward passes.

Per-stage op order as Megatron-LM generates it (megatron/core/pipeline_parallel/schedules.py;
reference/algorithms.md §4.2), for p stages, m micro-batches and v model chunks per stage:

* GPipe (Huang et al., NeurIPS 2019): F(0..m−1), then B(m−1..0), then the flush.
* 1F1B (`forward_backward_pipelining_without_interleaving`): stage r runs
  warmup = min(p − r − 1, m) forwards, then m − warmup pairs (F, B), then warmup backwards.
* Interleaved 1F1B (`..._with_interleaving`), total = m·v virtual micro-batches: warmup = total when
  m == p, else min(2(p − r − 1) + (v − 1)·p, total); virtual micro-batch k runs chunk
  (k mod pv) // p (backward: v − 1 − that) of micro-batch (k // pv)·p + (k mod p).

Chunk c of stage r holds the global model chunk c·p + r. Closed forms with uniform stages and free
communication (§4.1): (m + p − 1)(t_f + t_b) for GPipe and 1F1B, (m + (p − 1)/v)(t_f + t_b) interleaved.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

FORWARD, BACKWARD = "F", "B"


class Op(NamedTuple):
    """One pass of one micro-batch through one model chunk of a stage (`chunk` is local, 0..v−1)."""

    kind: str
    microbatch: int
    chunk: int


def gpipe(p: int, m: int, r: int) -> list[Op]:
    """All forwards, then all backwards in reverse micro-batch order."""
    forwards, backwards = _passes(1, m, 1)
    return forwards + backwards[::-1]


def one_f_one_b(p: int, m: int, r: int) -> list[Op]:
    """PipeDream-Flush / Megatron non-interleaved 1F1B."""
    warmup = min(p - r - 1, m)
    forwards, backwards = _passes(1, m, 1)
    return _one_f_one_b(forwards, backwards, warmup)


def interleaved_warmup(p: int, m: int, v: int, r: int) -> int:
    """Warm-up forwards of stage r in Megatron's interleaved schedule."""
    total = m * v
    if m == p:
        return total
    return min(2 * (p - r - 1) + (v - 1) * p, total)


def _virtual(k: int, p: int, v: int, forward: bool) -> tuple[int, int]:
    """(micro-batch, local chunk) of the k-th virtual micro-batch."""
    in_group = k % (p * v)
    chunk = in_group // p
    if not forward:
        chunk = v - 1 - chunk
    return (k // (p * v)) * p + (k % p), chunk


def interleaved(p: int, m: int, v: int, r: int) -> list[Op]:
    """Megatron's interleaved 1F1B (requires m divisible by p)."""
    forwards, backwards = _passes(p, m, v)
    return _one_f_one_b(forwards, backwards, interleaved_warmup(p, m, v, r))


def _one_f_one_b(forwards: list[Op], backwards: list[Op], warmup: int) -> list[Op]:
    """`warmup` forwards, then pairs (the next forward, the next backward), then the rest of the
    backwards."""
    total = len(forwards)
    pairs: list = [None] * (2 * (total - warmup))
    pairs[0::2] = forwards[warmup:]
    pairs[1::2] = backwards[:total - warmup]
    return forwards[:warmup] + pairs + backwards[total - warmup:]


@lru_cache(maxsize=1024)
def _passes(p: int, m: int, v: int) -> tuple[list[Op], list[Op]]:
    """The ops of the virtual micro-batches k = 0 .. m·v − 1 in order (`_virtual`; v = 1: the
    micro-batches), forwards and backwards: every stage's op order is a merge of the two (kept, read
    only: the stages and the schedules of a search share them)."""
    return ([Op(FORWARD, *_virtual(k, p, v, True)) for k in range(m * v)],
            [Op(BACKWARD, *_virtual(k, p, v, False)) for k in range(m * v)])


def stage_ops(schedule: str, p: int, m: int, v: int, r: int) -> list[Op]:
    """The op order of stage `r` (0-based) under `schedule`."""
    if schedule == "gpipe":
        return gpipe(p, m, r)
    if schedule == "1f1b":
        return one_f_one_b(p, m, r)
    if schedule == "interleaved":
        return interleaved(p, m, v, r)
    raise ValueError(f"unknown schedule {schedule!r}")


def closed_form_iteration(schedule: str, p: int, m: int, v: int, t_f: float, t_b: float) -> float:
    """Iteration time with uniform stages and free communication (reference/algorithms.md §4.1);
    t_f, t_b are one stage's forward and backward time for one micro-batch (all its chunks)."""
    if schedule == "interleaved":
        return (m + (p - 1) / v) * (t_f + t_b)
    return (m + p - 1) * (t_f + t_b)


def peak_inflight(schedule: str, p: int, m: int, v: int, r: int) -> int:
    """Chunk-micro-batches whose activations stage r holds at its peak (reference/algorithms.md §4.3):
    GPipe m; 1F1B min(p − r, m); interleaved warmup + 1 (capped at m·v)."""
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(p - r, m)
    return min(interleaved_warmup(p, m, v, r) + 1, m * v)


def scatter_gather(s) -> bool:
    """Whether stage boundaries travel as 1/tp slices re-gathered over the receiver's tensor-parallel
    group (Megatron-LM's scatter_gather_tensors_in_pipeline, on where the boundary tensor is replicated
    across the tp ranks, i.e. without sequence parallelism) for strategy `s`."""
    return s.p2p_scatter_gather and s.tp > 1 and not s.sequence_parallel
