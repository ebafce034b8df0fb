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
    """Per layer (batch, tensor-parallel degree): data layers (b, tp), model layers (dp·b, dp)."""
    batches = [microbatch_size * dp if m == "model" else microbatch_size for m in modes]
    degrees = [dp if m == "model" else tp for m in modes]
    return batches, degrees


def add_transitions(model: Model, entries: tuple[LayerEntry, ...], modes: list[str], dp: int,
                    microbatch_size: int, dtype: str) -> tuple[LayerEntry, ...]:
    """Attach the collectives at every data↔model switch to the consuming layer."""
    b = DTYPE_BYTES[dtype]
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
            if mine == "model":
                # a column-parallel consumer's input-gradient all-reduce (Megatron's f) is subsumed by
                # the reduce-scatter that returns each worker its own samples' gradient
                scattered = {c.nbytes for c in extra_bwd if c.op == "reduce_scatter"}
                kept_bwd = tuple(c for c in kept_bwd if not (c.op == "allreduce" and c.nbytes in scattered))
            role = replace(e.tp, before=tuple(extra_before) + e.tp.before, after_bwd=kept_bwd + tuple(extra_bwd))
            out[i] = replace(e, tp=role)
    return tuple(out)
