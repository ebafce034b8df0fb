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

from bisect import bisect_left, bisect_right
from itertools import accumulate
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


EXACT_BYTES = 2.0 ** 53
"""Byte counts below this that are whole numbers add up exactly in any order (IEEE doubles)."""


class ChunkActivations:
    """The plain kept bytes (recompute none), `selective_recompute_memory` and `full_recompute_memory`
    with a checkpoint every layer (`every` = 1) of any chunk a..b of one layer table, the same numbers
    in O(blocks in the chunk) instead of O(layers): prefix sums over the table and, per block instance,
    its saved bytes and the layers outside it that it reads (its checkpoints). The prefix sums change
    the order of the additions, so this serves only a table whose byte counts (saved, output and
    attention-core bytes) are whole numbers adding up below 2^53, where every order gives the same sum
    (`exact`), and `full` only a model whose block instances are contiguous runs of layers
    (`contiguous`); elsewhere the functions above are called."""

    def __init__(self, model: Model, entries: Sequence[LayerEntry], instance: dict[str, str | None]):
        self.model, self.entries, self.instance = model, entries, instance
        saved = [e.saved_bytes for e in entries]
        out = [e.out_bytes for e in entries]
        core = [e.core_bytes for e in entries]
        self.exact = all(float(x).is_integer() and 0 <= x for x in saved + out + core) and \
            sum(saved) + sum(out) + sum(core) < EXACT_BYTES
        # prefix sums, each added left to right from 0 (`accumulate`)
        self.saved_pre = list(accumulate(saved, initial=0.0))
        self.core_pre = list(accumulate(core, initial=0.0))
        self.plain_pre = list(accumulate([x if instance[e.name] is None else 0.0 for x, e in zip(saved, entries)],
                                         initial=0.0))
        self.cored_pre = list(accumulate([e.core.seconds > 0 for e in entries], initial=0))
        self.cores = [i for i, x in enumerate(core) if x != 0]
        # block instances in layer order: span (first, last), saved bytes summed as the function does,
        # and the positions of the layers outside the instance its layers read, once each
        position = self._positions = {e.name: i for i, e in enumerate(entries)}
        self.contiguous = True
        spans: dict[str, list] = {}
        for i, e in enumerate(entries):
            inst = instance[e.name]
            if inst is None:
                continue
            got = spans.get(inst)
            if got is None:
                got = spans[inst] = [i, i, 0.0, []]
            elif got[1] != i - 1:
                self.contiguous = False
            got[1] = i
            got[2] += e.saved_bytes
            for src in model.layers[e.index].inputs:
                if src == INPUT:
                    continue
                j = position[src]
                if instance[entries[j].name] != inst and j not in got[3]:
                    got[3].append(j)
        self.blocks = list(spans.values())
        self.firsts = [x[0] for x in self.blocks]

    def plain(self, a: int, b: int) -> tuple[float, float, float]:
        """(kept, 0, 0) without recomputation: the saved bytes of entries a..b."""
        return self.saved_pre[b] - self.saved_pre[a], 0.0, 0.0

    def selective(self, a: int, b: int) -> tuple[float, float, float]:
        """`selective_recompute_memory` of entries a..b where one of them has an attention core that
        takes time, else `plain` (as `dlsim.plan.evaluate` asks)."""
        if self.cored_pre[b] == self.cored_pre[a]:
            return self.plain(a, b)
        lo, hi = bisect_left(self.cores, a), bisect_left(self.cores, b)
        core = max((self.entries[i].core_bytes for i in self.cores[lo:hi]), default=0.0)
        if hi - lo < b - a:
            core = max(core, 0.0)
        full = self.saved_pre[b] - self.saved_pre[a]
        return full - (self.core_pre[b] - self.core_pre[a]), core, core

    def full(self, a: int, b: int, incoming: float) -> tuple[float, float, float]:
        """`full_recompute_memory` of entries a..b with a checkpoint every layer."""
        kept = self.plain_pre[b] - self.plain_pre[a]
        arrived = False
        largest = None
        entries, instance, layers = self.entries, self.instance, self.model.layers
        for first, last, group, reads in self.blocks[max(bisect_right(self.firsts, a) - 1, 0):
                                                     bisect_left(self.firsts, b)]:
            if last < a:
                continue
            if first < a or last >= b:  # cut by the chunk: its layers inside, as the function walks them
                inst = instance[entries[first].name]
                group, seen = 0.0, set()
                for i in range(max(first, a), min(last + 1, b)):
                    e = entries[i]
                    group += e.saved_bytes
                    for src in layers[e.index].inputs:
                        if src == INPUT or src in seen:
                            continue
                        j = self._positions[src]
                        if a <= j < b and instance[entries[j].name] == inst:
                            continue
                        seen.add(src)
                        if a <= j:
                            kept += entries[j].out_bytes
                        else:
                            arrived = True
            else:
                for j in reads:
                    if j >= a:
                        kept += entries[j].out_bytes
                    else:
                        arrived = True
            if largest is None or group > largest:
                largest = group
        if arrived:
            kept += incoming
        largest = 0.0 if largest is None else largest
        return kept, largest, largest
