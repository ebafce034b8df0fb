"""Activation memory of one model chunk under recomputation, per micro-batch.

Returns (kept, forward_extra, recompute_extra) in bytes: what stays alive from the chunk's forward
pass until its backward pass, what is alive in addition while the forward runs, and what the
recomputation materialises in addition before the backward pass consumes it.

* none: every layer keeps what its backward needs (`LayerEntry.saved_bytes`).
* full (Chen et al. 2016, "Training deep nets with sublinear memory cost"; Megatron-LM's
  `--recompute-granularity full --recompute-method uniform`): the transformer layers (instances
  of a repeated block, named ``<block>.<index>.<layer>``) are grouped `every` at a time, and only
  the input of each group is kept (a checkpoint: 2·s·b·h bytes per transformer layer in 16-bit,
  Korthikanti et al. 2022 §5, or 1/tp of it under sequence parallelism); the forward runs one
  group at a time without keeping its activations, and the backward recomputes one group at a
  time, so at most one group's activations are alive beside the checkpoints. Layers outside the
  repeated blocks (embedding, final norm, output layer, loss) keep theirs, as in Megatron-LM.
* selective (Korthikanti et al. 2022 §4.2): the attention cores (softmax output, dropout mask and
  output) are dropped after each layer's forward and recomputed one layer at a time.
* selective_layer (torchtitan): full recomputation of every second block, one block a group
  (`dlsim.plan.oprecompute.alternate_layers` as the instance map of `full_recompute_memory`).
* selective_op (torchtitan): each block keeps its input and the outputs its policy saves
  (`LayerEntry.op_kept`); the recomputation materialises the rest of one block at a time
  (`op_recompute_memory`).
"""

from __future__ import annotations

from typing import Sequence

from dlsim.plan.blocks import recompute_layers
from dlsim.plan.layertable import LayerEntry
from dlsim.spec.model import INPUT, Model


def full_recompute_memory(model: Model, entries: Sequence[LayerEntry], every: int,
                          incoming: float, instance: dict[str, str | None] | None = None) -> tuple[float, float, float]:
    """(kept, forward_extra, recompute_extra) of a chunk under full recomputation, a checkpoint
    every `every` transformer layers (see the module docstring). `incoming` is the bytes that
    arrive from the previous pipeline chunk (kept once when a group reads them); `instance` is
    `recompute_layers(model)` when the caller has it (one per model, not per chunk)."""
    if instance is None:
        instance = recompute_layers(model)
    order: list[str] = []
    for e in entries:
        inst = instance[e.name]
        if inst is not None and inst not in order:
            order.append(inst)
    group_of = {inst: i // every for i, inst in enumerate(order)}
    unit = {e.name: group_of.get(instance[e.name] or "", -1) for e in entries}
    out_bytes = {e.name: e.out_bytes for e in entries}
    kept, groups = 0.0, {}
    checkpointed: set[tuple[int, str]] = set()
    arrived = False
    for e in entries:
        g = unit[e.name]
        if g < 0:
            kept += e.saved_bytes
            continue
        groups[g] = groups.get(g, 0.0) + e.saved_bytes
        for src in model.layers[e.index].inputs:
            if src == INPUT or unit.get(src) == g or (g, src) in checkpointed:
                continue
            checkpointed.add((g, src))
            if src in out_bytes:
                kept += out_bytes[src]
            elif not arrived:
                kept, arrived = kept + incoming, True
    largest = max(groups.values(), default=0.0)
    return kept, largest, largest


def selective_recompute_memory(entries: Sequence[LayerEntry]) -> tuple[float, float, float]:
    """(kept, forward_extra, recompute_extra) under selective recomputation."""
    full = sum(e.saved_bytes for e in entries)
    core = max((e.core_bytes for e in entries), default=0.0)
    return full - sum(e.core_bytes for e in entries), core, core


def op_recompute_memory(model: Model, entries: Sequence[LayerEntry], incoming: float,
                        instance: dict[str, str | None]) -> tuple[float, float, float]:
    """(kept, forward_extra, recompute_extra) of a chunk under torchtitan's selective_op policy: the
    checkpoints (each block's input) and the layers outside blocks as under full recomputation of one
    block a group, plus each block layer's saved outputs (`LayerEntry.op_kept`); the largest block's
    dropped bytes (saved − kept) are alive while its forward runs and once recomputed."""
    kept, _, _ = full_recompute_memory(model, entries, 1, incoming, instance)
    dropped: dict[str, float] = {}
    for e in entries:
        inst = instance[e.name]
        if inst is not None:
            kept += e.op_kept
            dropped[inst] = dropped.get(inst, 0.0) + e.saved_bytes - e.op_kept
    largest = max(max(dropped.values(), default=0.0), 0.0)
    return kept, largest, largest
