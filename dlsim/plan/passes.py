"""The passes of every model chunk of one iteration: the step lists (`dlsim.plan.templates`) its
forward, backward and recomputation run, split where gradient buckets complete and where ZeRO-3 /
FSDP parameter units or offloaded activation units change, and the activation bytes each
micro-batch keeps. `dlsim.plan.iteration` instantiates them once per micro-batch and device.

A chunk's plain passes are pure functions of its layer entries, the tensor-parallel degree, the
asynchronous backward flag and the buckets' completion points: a sweep or a search builds the same
ones for every strategy that shares a layer table and a partition (other dp, micro-batch counts,
ZeRO stages), so they are kept with the model (`_kept_steps`) and built once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from dlsim.plan.blocks import recompute_layers
from dlsim.plan.dataparallel import Bucket
from dlsim.plan.fsdp import last_block, unit_copies
from dlsim.plan.gradbuckets import gradient_buckets
from dlsim.plan.layertable import LayerEntry
from dlsim.plan.offload import offloads_activations, unit_offload_plan
from dlsim.plan.oprecompute import alternate_layers
from dlsim.plan.recompute import full_recompute_memory, op_recompute_memory, selective_recompute_memory
from dlsim.plan.taskgraph import COMPUTE, RECOMPUTE
from dlsim.plan.templates import Step, backward_steps, forward_steps, op_recompute_steps, selective_recompute_steps, units_of
from dlsim.plan.zero import gathers_in_forward
from dlsim.results import Estimate
from dlsim.spec.memo import derived
from dlsim.spec.model import Model
from dlsim.spec.strategy import Strategy


@dataclass
class ChunkPasses:
    """Per chunk k: `fwd[k]` / `bwd[k]` its plain passes; `buckets[k]` its gradient buckets and
    `ready[k]` (layer index → buckets its backward completes); `bwd_split[k]` the backward split
    where buckets complete; `fwd_units[k]` / `bwd_units[k]` the passes split by parameter units
    (ZeRO-3 / FSDP, or the first forward's gathers), `kept[k]` the FSDP2 units kept gathered;
    `unit_off[k]` (kept, forward, backward) of activation offload one unit at a time, or None;
    `recomp[k]` the recomputation's steps; `act[k]` activation bytes per micro-batch (kept from
    forward to backward, extra held while the forward runs, extra materialised by the
    recomputation). `last_block` names the model's last block (`dlsim.plan.fsdp.last_block`)."""

    fwd: list[list[Step]]
    bwd: list[list[Step]]
    buckets: list[list[Bucket]]
    ready: list[dict[int, tuple[int, ...]]]
    bwd_split: list[list[Step]]
    fwd_units: list[list[Step]]
    bwd_units: list[list[Step]]
    kept: list[frozenset[int]]
    last_block: str | None
    unit_off: list[tuple | None]
    recomp: list[list[Step]]
    act: list[tuple[float, float, float]]


KEPT_TABLES = 128
"""Layer tables whose step lists are kept per model (`_kept_steps`), the first kept dropped first."""


def _kept_steps(model: Model, entries: tuple[LayerEntry, ...], key: tuple, make: Callable[[], list[Step]]) -> list[Step]:
    """`make()`, a step list of layer table `entries` that depends on nothing but them and `key`,
    kept with `model` (`dlsim.spec.memo`) for the last KEPT_TABLES tables. The store holds
    `entries`, so that their id cannot be reused while kept, and a hit is checked by identity as
    well. Kept lists are shared: the builder reads them and never changes them."""
    store = derived(model, "chunk step lists", dict)
    got = store.get(id(entries))
    if got is None or got[0] is not entries:
        if got is None and len(store) >= KEPT_TABLES:
            store.pop(next(iter(store)))
        got = store[id(entries)] = (entries, {})
    steps = got[1].get(key)
    if steps is None:
        steps = got[1][key] = make()
    return steps


def chunk_passes(model: Model, s: Strategy, dtype: str, elementwise_time: Callable[[float, float], Estimate],
                 entries: tuple[LayerEntry, ...], ranges: Sequence[tuple[int, int]],
                 boundary: Sequence[float], dp_synced: Callable[[LayerEntry], bool]) -> ChunkPasses:
    """The passes of the chunks `ranges` of layer table `entries` under `s` (see `ChunkPasses`);
    `boundary[k]` the bytes chunk k sends to chunk k+1, `dp_synced` whether a layer's parameters are
    reduced over dp."""
    tp = s.tp
    overlap = s.tp_async_backward
    chunk_entries = [entries[a:b] for a, b in ranges]
    fwd = [_kept_steps(model, entries, ("F", tuple(r), tp), lambda es=es: forward_steps(es, tp))
           for r, es in zip(ranges, chunk_entries)]
    bwd = [_kept_steps(model, entries, ("B", tuple(r), tp, overlap), lambda es=es: backward_steps(es, tp, overlap=overlap))
           for r, es in zip(ranges, chunk_entries)]
    all_buckets: list[list[Bucket]] = []
    bwd_split: list[list[Step]] = []
    fwd_units: list[list[Step]] = []
    bwd_units: list[list[Step]] = []
    all_ready: list[dict[int, tuple[int, ...]]] = []
    all_kept: list[frozenset[int]] = [frozenset()] * len(chunk_entries)  # FSDP2 units kept gathered
    last = last_block([layer.name for layer in model.layers])
    for k, es in enumerate(chunk_entries):
        buckets = gradient_buckets(es, s, dtype, dp_synced) if s.dp_cp > 1 or s.zero else []
        ready: dict[int, tuple[int, ...]] = {}
        for j, b in enumerate(buckets):
            ready[b.ready_after] = ready.get(b.ready_after, ()) + (j,)
        all_buckets.append(buckets)
        all_ready.append(ready)
        bwd_split.append(_kept_steps(model, entries, ("B split", tuple(ranges[k]), tp, overlap, tuple(ready.items())),
                                     lambda: backward_steps(es, tp, ready, overlap=overlap)))
        if s.zero == 3 and s.dp_cp > 1 and buckets:
            units = units_of(es, buckets)
            kept, copy_f, copy_b = unit_copies(es, buckets, s, elementwise_time, last)
            all_kept[k] = kept
            fwd_units.append(forward_steps(es, tp, COMPUTE, units, copy_f))
            bwd_units.append(backward_steps(es, tp, ready, units, overlap=overlap, unit_lead=copy_b))
        elif gathers_in_forward(s) and buckets:  # the first forward waits for each bucket's gather
            fwd_units.append(forward_steps(es, tp, COMPUTE, units_of(es, buckets)))
            bwd_units.append(bwd_split[k])
        else:
            fwd_units.append(fwd[k])
            bwd_units.append(bwd_split[k])
    # activation offload one unit at a time, for forward passes followed directly by their backward
    unit_off: list[tuple | None] = [None] * len(chunk_entries)
    if offloads_activations(s.offload) and s.recompute in ("none", "selective"):
        instance = recompute_layers(model)
        for k, es in enumerate(chunk_entries):
            by_bucket = all_buckets[k] and (s.zero == 3 and s.dp_cp > 1 or gathers_in_forward(s))
            units, kept = unit_offload_plan(es, instance, s.recompute == "selective",
                                            units_of(es, all_buckets[k]) if by_bucket else None)
            unit_off[k] = (kept, forward_steps(es, tp, COMPUTE, units),
                           backward_steps(es, tp, all_ready[k], units, overlap=overlap))
    if s.recompute in ("full", "selective_layer"):
        inside = recompute_layers(model) if s.recompute == "full" else alternate_layers(model)
        recomp = [forward_steps([e for e in es if inside[e.name]], tp, RECOMPUTE) for es in chunk_entries]
    elif s.recompute == "selective":
        recomp = [selective_recompute_steps(es) for es in chunk_entries]
    elif s.recompute == "selective_op":
        inside = recompute_layers(model)
        recomp = [op_recompute_steps(es, inside) for es in chunk_entries]
    else:
        recomp = [[] for _ in chunk_entries]
    # activation bytes per micro-batch and chunk: (kept from forward to backward, extra held while
    # the forward runs, extra materialised by the recomputation before the backward)
    act: list[tuple[float, float, float]] = []
    for k, es in enumerate(chunk_entries):
        incoming = boundary[k - 1] if k > 0 else 0.0
        if s.recompute in ("full", "selective_layer"):
            every = s.recompute_layers if s.recompute == "full" else 1
            act.append(full_recompute_memory(model, es, every, incoming, inside))
        elif s.recompute == "selective_op":
            act.append(op_recompute_memory(model, es, incoming, inside))
        elif s.recompute == "selective" and recomp[k]:
            act.append(selective_recompute_memory(es))
        else:
            act.append((sum(e.saved_bytes for e in es), 0.0, 0.0))
    return ChunkPasses(fwd, bwd, all_buckets, all_ready, bwd_split, fwd_units, bwd_units, all_kept, last, unit_off,
                       recomp, act)
