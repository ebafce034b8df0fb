"""Per-layer-group parallelism: data-parallel groups and model-parallel groups over the same devices.

Krizhevsky, "One weird trick for parallelizing convolutional neural networks" (arXiv:1404.5997,
2014) §4: K workers run the convolutional layers data-parallel (each on its own b samples) and the
fully connected layers model-parallel (each holds 1/K of every FC layer and processes all K·b
samples). At the switch each worker's last convolutional activities go to every other worker (his
"broadcast" scheme: an all-gather of K·b samples), and in the backward pass each worker gets back
the gradient of its own b samples, summed over the K model slices (a reduce-scatter). The FC layers
of a model group are split as tensor parallelism does (`dlsim.plan.tensorparallel`), over the K
data-parallel ranks; their weights need no data-parallel gradient reduction.

Leaving a model group for a data group takes each worker's own b samples of a replicated tensor
(no forward traffic) and all-gathers the gradient in the backward pass; a feature-sharded tensor
is exchanged all-to-all both ways.

Channel and filter groups (Dryden et al. SC'19) are model groups whose convolutions and fully
connected layers are all split by input channels or by filters (`dlsim.plan.tensorparallel.
_forced_split`) instead of alternating; a channel-split layer entered from a data group returns
each worker its samples' input gradient by one all-to-all. With tp > 1 they split inside the
tensor-parallel groups instead (dp x tp: the sample x channel/filter hybrid), each split layer's
gradients all-reduced over the dp ranks holding the same shard (Dryden's segmented allreduces).
"""

from __future__ import annotations

from dataclasses import replace

from dlsim.errors import SpecError
from dlsim.plan.layertable import LayerEntry
from dlsim.plan.tensorparallel import Collective
from dlsim.spec.model import INPUT, Model
from dlsim.spec.strategy import LayerGroup
from dlsim.units import DTYPE_BYTES


def group_modes(model: Model, groups: tuple[LayerGroup, ...]) -> list[str]:
    """The parallel mode (data or model) of every layer; layers outside all groups are data-parallel."""
    index = {layer.name: i for i, layer in enumerate(model.layers)}
    modes = ["data"] * len(model.layers)
    for n, g in enumerate(groups):
        for end in (g.first, g.last):
            if end not in index:
                raise SpecError(f"no layer named {end!r} in {model.name}", field=f"layer_groups[{n}]")
        a, b = index[g.first], index[g.last]
        if b < a:
            raise SpecError(f"{g.last!r} comes before {g.first!r} in {model.name}", field=f"layer_groups[{n}]")
        for i in range(a, b + 1):
            modes[i] = g.parallel
    return modes


def batches_and_degrees(modes: list[str], dp: int, microbatch_size: int, tp: int) -> tuple[list[int], list[int]]:
    """Per layer (batch, tensor-parallel degree): data layers (b, tp), model, channel and filter
    layers (dp·b, dp); with tp > 1 every layer (b, tp): channel and filter groups split inside the
    tensor-parallel groups (the sample x channel/filter hybrid)."""
    if tp > 1:
        return [microbatch_size] * len(modes), [tp] * len(modes)
    batches = [microbatch_size if m == "data" else microbatch_size * dp for m in modes]
    degrees = [tp if m == "data" else dp for m in modes]
    return batches, degrees


def forced_splits(modes: list[str]) -> list[str]:
    """Per layer the split a channel or filter group forces on its convolutions and fully connected
    layers ("" elsewhere: the tensor-parallel rules; `dlsim.plan.tensorparallel.classify`)."""
    return [m if m in ("channel", "filter") else "" for m in modes]


def add_transitions(model: Model, entries: tuple[LayerEntry, ...], modes: list[str], dp: int,
                    microbatch_size: int, dtype: str, tp: int = 1) -> tuple[LayerEntry, ...]:
    """Attach the collectives at every data↔model switch to the consuming layer (none with tp > 1:
    every group then splits inside the tensor-parallel groups, at the same batch)."""
    if tp > 1:
        return entries
    b = DTYPE_BYTES[dtype]
    modes = ["data" if m == "data" else "model" for m in modes]  # channel and filter groups are model-split
    mode_of = {layer.name: modes[i] for i, layer in enumerate(model.layers)}
    mode_of[INPUT] = "data"
    by_name = {e.name: e for e in entries}
    out = list(entries)
    for i, layer in enumerate(model.layers):
        mine = modes[i]
        extra_before, extra_bwd = [], []
        for src in layer.inputs:
            if mode_of[src] == mine:
                continue
            shape = model.input_shape if src == INPUT else model.layer(src).out_shape
            elements = 1
            for d in shape:
                elements *= d
            gathered = elements * microbatch_size * dp * b
            if mine == "model":
                extra_before.append(Collective("allgather", gathered, f"gather {src} samples for {layer.name}", "dp"))
                if src != INPUT:
                    extra_bwd.append(Collective("reduce_scatter", gathered, f"scatter gradient of {src}", "dp"))
            elif by_name[src].tp.out_sharded:
                extra_before.append(Collective("alltoall", gathered, f"regroup {src} by samples for {layer.name}", "dp"))
                extra_bwd.append(Collective("alltoall", gathered, f"regroup gradient of {src}", "dp"))
            else:
                extra_bwd.append(Collective("allgather", gathered, f"gather gradient of {src}", "dp"))
        if extra_before or extra_bwd:
            e = out[i]
            kept_bwd = e.tp.after_bwd
            if mine == "model" and e.tp.role == "row":
                # a channel-split consumer holds its channels' slice of every sample's input gradient:
                # one all-to-all returns each worker its own samples' (instead of gathering, then scattering)
                extra_bwd = [Collective("alltoall", c.nbytes, c.why.replace("scatter", "regroup"), "dp")
                             if c.op == "reduce_scatter" else c for c in extra_bwd]
                regrouped = {c.nbytes for c in extra_bwd if c.op == "alltoall"}
                kept_bwd = tuple(c for c in kept_bwd if not (c.op == "allgather" and c.nbytes in regrouped))
            elif mine == "model":
                # a column-parallel consumer's input-gradient all-reduce (Megatron's f) is subsumed by
                # the reduce-scatter that returns each worker its own samples' gradient
                scattered = {c.nbytes for c in extra_bwd if c.op == "reduce_scatter"}
                kept_bwd = tuple(c for c in kept_bwd if not (c.op == "allreduce" and c.nbytes in scattered))
            role = replace(e.tp, before=tuple(extra_before) + e.tp.before, after_bwd=kept_bwd + tuple(extra_bwd))
            out[i] = replace(e, tp=role)
    return tuple(out)
