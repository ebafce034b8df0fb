"""Splitting a layer sequence into pipeline chunks: given counts, balanced by cost, or uniform.

Cuts are placed where exactly one tensor crosses (between transformer blocks, residual blocks),
so a stage boundary sends one activation, as Megatron-LM and GPipe cut; when there are too few
such places, any layer boundary is allowed. The balanced partition minimises the slowest chunk
(fwd + bwd time), the objective of the PipeDream planner's straight pipeline (Narayanan et al.,
SOSP 2019 §3.1, reference/algorithms.md §4.4, with one replica per stage): bisection on the
bottleneck value with a greedy feasibility test, which is exact for contiguous min-max partitions
(the greedy packing decides whether a bottleneck C is achievable). The uniform split
(`uniform_counts`) is Megatron-LM's: the same number of repeated blocks in every chunk, the layers
before the first block (embeddings) in the first chunk and those after the last (final norm, output,
loss) in the last, whatever they cost.
"""

from __future__ import annotations

import math
from typing import Sequence

from dlsim.errors import InfeasibleError, SpecError
from dlsim.plan.blocks import block_instance
from dlsim.spec.memo import derived
from dlsim.spec.model import INPUT, Model


def single_tensor_cuts(model: Model) -> list[int]:
    """Indices i (1..n−1) such that cutting before layer i leaves exactly one live tensor (once per
    model: `dlsim.spec.memo`)."""
    return derived(model, "single_tensor_cuts", lambda: _single_tensor_cuts(model))


def _single_tensor_cuts(model: Model) -> list[int]:
    layers = model.layers
    last_use: dict[str, int] = {}
    for i, layer in enumerate(layers):
        for src in layer.inputs:
            last_use[src] = i
    live: set[str] = {INPUT} if last_use.get(INPUT, -1) >= 0 else set()
    cuts = []
    for i in range(1, len(layers)):
        prev = layers[i - 1].name
        if last_use.get(prev, -1) >= i:
            live.add(prev)
        live = {t for t in live if last_use.get(t, -1) >= i}
        if len(live) == 1:
            cuts.append(i)
    return cuts


def _greedy(costs: Sequence[float], limit: float, most: int | None = None) -> list[int] | None:
    """Left-to-right packing under `limit`; the start index of each part, or None if a unit exceeds it
    or (given `most`) the packing needs more than `most` parts."""
    return _pack(costs, limit, most)[0]


def _pack(costs: Sequence[float], limit: float, most: int | None = None) -> tuple[list[int] | None, float]:
    """`_greedy`'s packing with what it proves about other limits, given finite non-negative costs:
    (the starts, the packing's peak part sum) where it packs, every limit from that peak up packing
    so too; (None, a sum over `limit` it met) where it does not, every limit below that sum failing
    too (the least such sum: below it the packing cuts at the same places)."""
    starts, acc, peak, over = [0], 0.0, 0.0, math.inf
    for i, c in enumerate(costs):
        if c > limit:
            return None, c
        total = acc + c
        if total > limit and i > 0:
            if total < over:
                over = total
            if most is not None and len(starts) == most:
                return None, over
            starts.append(i)
            if acc > peak:
                peak = acc
            acc = c
        else:
            acc = total
    return starts, max(peak, acc)


def balanced_starts(costs: Sequence[float], parts: int) -> list[int]:
    """Start index of each of `parts` contiguous groups of `costs` minimising the largest group sum.

    Bisection on the limit with `_greedy` as the feasibility test. With finite non-negative costs,
    feasibility is monotone in the limit even in floating point (a part's left-to-right sum grows with
    its end and shrinks with its start, IEEE addition being monotone), and a packing's decisions are
    the same for every limit below the least sum that made it cut: a packing found proves every limit
    from its peak part sum up feasible, one that fails every limit below that least sum infeasible
    (`_pack`), so the bisection packs only for a limit between what the packings so far prove (the
    same steps, the same result: tests/test_pipeline_split.py holds it to the plain bisection)."""
    n = len(costs)
    if parts > n:
        raise InfeasibleError(f"{parts} pipeline chunks need at least {parts} units, the model has {n}")
    if parts == 1:
        return [0]
    lo, hi = max(costs), sum(costs)
    exact = math.isfinite(hi) and all(c >= 0 for c in costs)
    floor, ceiling = -math.inf, math.inf  # limits below `floor` fail, those from `ceiling` up pack
    for _ in range(100):
        if hi - lo <= 1e-12 * max(hi, 1e-300):
            break
        mid = (lo + hi) / 2
        if mid >= ceiling:
            feasible = True
        elif mid < floor:
            feasible = False
        elif exact:
            found, bound = _pack(costs, mid, parts)
            feasible = found is not None
            if feasible:
                ceiling = bound
            else:
                floor = bound
        else:
            feasible = _greedy(costs, mid, parts) is not None  # a packing into more parts than that is not one
        if feasible:
            hi = mid
        else:
            lo = mid
    starts = list(_greedy(costs, hi) or [0])
    while len(starts) < parts:  # split off single units from the right (keeps the bottleneck)
        bounds = starts + [n]
        for j in range(len(starts) - 1, -1, -1):
            if bounds[j + 1] - bounds[j] >= 2:
                starts.insert(j + 1, bounds[j + 1] - 1)
                break
    return starts


def uniform_counts(model: Model, chunks: int) -> list[int]:
    """Layers per chunk of the uniform split: k = B / chunks of the model's B repeated blocks (layers
    named ``<name>.<index>.*``, `dlsim.plan.blocks`) in every chunk, in model order, the layers before
    the first block added to the first chunk and those after the last block to the last (as
    Megatron-LM builds its stages: NVIDIA/Megatron-LM@55ba1f7 megatron/model/transformer.py
    _get_num_layers, num_layers // pipeline size with the embedding on the first stage and the output
    layer and loss on the last; Megatron-Core 0.9's get_num_layers_to_build the same per virtual
    stage). A model without repeated blocks splits its layers so. Megatron-LM refuses a block count
    that pp x virtual_stages does not divide, and so does this (once per model and chunk count)."""
    return list(derived(model, ("uniform_counts", chunks), lambda: _uniform_counts(model, chunks)))


def _uniform_counts(model: Model, chunks: int) -> tuple[int, ...]:
    names = [layer.name for layer in model.layers]
    owner = [block_instance(n) for n in names]
    inside = [i for i, o in enumerate(owner) if o is not None]
    if not inside:
        owner, inside = list(names), list(range(len(names)))
    order = list(dict.fromkeys(owner[i] for i in inside))
    if len(order) % chunks:
        raise InfeasibleError(f"the uniform pipeline split needs the {len(order)} blocks of {model.name} divisible "
                              f"by pp x virtual_stages = {chunks} (Megatron-LM's rule); stage_partition gives the "
                              f"layers per chunk, or pipeline_split balanced cuts by cost")
    per = len(order) // chunks
    index = {b: k // per for k, b in enumerate(order)}
    chunk_of = [0 if i < inside[0] else chunks - 1 if i > inside[-1] else index.get(o, -1) for i, o in enumerate(owner)]
    if any(b < a for a, b in zip(chunk_of, chunk_of[1:])):
        raise SpecError(f"{model.name} has layers between or across its repeated blocks: the uniform split needs "
                        "each block's layers contiguous", field="pipeline_split")
    return tuple(chunk_of.count(c) for c in range(chunks))


def partition(model: Model, layer_costs: Sequence[float], chunks: int,
              counts: Sequence[int] | None = None, cuts: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """(first, end) layer index ranges of each chunk, end exclusive.

    `counts` (layers per chunk) is used as given; otherwise the chunks are balanced by
    `layer_costs` (seconds per layer: forward + backward), cutting only where one tensor crosses if
    that leaves enough places (`cuts`: the model's `single_tensor_cuts`, when the caller has them).
    """
    n = len(model.layers)
    if counts is not None:
        if sum(counts) != n:
            raise SpecError(f"layer counts add up to {sum(counts)}, the model has {n} layers",
                            field="stage_partition")
        out, first = [], 0
        for c in counts:
            out.append((first, first + c))
            first += c
        return out
    if chunks > n:
        raise InfeasibleError(f"pp x virtual_stages = {chunks} chunks but {model.name} has only {n} layers "
                              f"({chunks - n} too many)")
    cuts = single_tensor_cuts(model) if cuts is None else cuts
    if len(cuts) + 1 < chunks:
        cuts = list(range(1, n))
    bounds = [0] + cuts + [n]
    unit_costs = [sum(layer_costs[bounds[u]:bounds[u + 1]]) for u in range(len(bounds) - 1)]
    starts = balanced_starts(unit_costs, chunks)
    edges = [bounds[s] for s in starts] + [n]
    return [(edges[i], edges[i + 1]) for i in range(chunks)]
