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

from typing import NamedTuple

FORWARD, BACKWARD = "F", "B"


class Op(NamedTuple):
    """One pass of one micro-batch through one model chunk of a stage (`chunk` is local, 0..v−1)."""

    kind: str
    microbatch: int
    chunk: int


def gpipe(p: int, m: int, r: int) -> list[Op]:
    """All forwards, then all backwards in reverse micro-batch order."""
    return [Op(FORWARD, i, 0) for i in range(m)] + [Op(BACKWARD, i, 0) for i in reversed(range(m))]


def one_f_one_b(p: int, m: int, r: int) -> list[Op]:
    """PipeDream-Flush / Megatron non-interleaved 1F1B."""
    warmup = min(p - r - 1, m)
    ops = [Op(FORWARD, i, 0) for i in range(warmup)]
    for k in range(m - warmup):
        ops.append(Op(FORWARD, warmup + k, 0))
        ops.append(Op(BACKWARD, k, 0))
    ops += [Op(BACKWARD, i, 0) for i in range(m - warmup, m)]
    return ops


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
    total = m * v
    warmup = interleaved_warmup(p, m, v, r)
    ops = [Op(FORWARD, *_virtual(k, p, v, True)) for k in range(warmup)]
    for k in range(total - warmup):
        ops.append(Op(FORWARD, *_virtual(warmup + k, p, v, True)))
        ops.append(Op(BACKWARD, *_virtual(k, p, v, False)))
    ops += [Op(BACKWARD, *_virtual(k, p, v, False)) for k in range(total - warmup, total)]
    return ops


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
