"""PyTorch FSDP2's parameter units and the copies around its collectives (strategy keys `fsdp_units`,
`fsdp_copies`; ZeRO-3 only, inert at other stages), the one place both clocks read them.

Units (`fsdp_units`):

* ``bucket``: ZeRO-3 units cut by the gradient bucket size (`dlsim.plan.dataparallel.make_buckets`),
  every unit gathered before each forward and each backward pass and freed after (DeepSpeed-like).
* ``block``: torchtitan's wrapping: ``fully_shard`` on every ``TransformerBlock``, then on the whole
  model, whose own unit (the root) holds what no block holds: embeddings, final norm, output
  (pytorch/torchtitan@157a12c torchtitan/parallelisms/parallelize_llama.py, the same in @7310abe
  apply_fsdp). One unit per repeated-block instance (`dlsim.plan.blocks.recompute_layers`: "h.3" for
  "h.3.attn"), the root unit last in reduction order (its gradients are complete only after the
  embedding's backward). Kept gathered from its forward to its backward, so not gathered again for
  the backward (`kept_units`): the root (pytorch/pytorch@32f585d, v2.5.0,
  torch/distributed/_composable/fsdp/_fsdp_state.py ``_lazy_init``: "For the root, do not reshard
  after forward", ``post_forward_mesh_info = None``) and the model's last block (torchtitan:
  ``reshard_after_forward = layer_id < len(model.layers) - 1``, "FSDP would prefetch it
  immediately"). Each unit's gradients are reduce-scattered as one collective when its backward
  ends (``foreach_reduce``): the unit is the bucket. Per pass a rank all-gathers
  Σ_units P_u·b minus, in the backward, the kept units' (b the parameter dtype's bytes).

Copies (`fsdp_copies`), each priced as one memory-bound kernel by the device's roofline
(`dlsim.cost.roofline`, its measured memory-bandwidth curve):

* all-gather copy-out, on the compute stream after each unit's all-gather and before its first
  kernel (pytorch/pytorch@32f585d torch/distributed/_composable/fsdp/_fsdp_collectives.py
  ``foreach_all_gather_copy_out``: ``torch.split_with_sizes_copy`` from the flat all-gather output into
  each parameter's unsharded tensor, on ``torch.cuda.current_stream()``): reads and writes the unit's
  gathered parameters, 2·P_u·b bytes, once per gather (so not for a kept unit's backward);
* reduce-scatter copy-in, on the reduce-scatter stream before the unit's reduce-scatter
  (``foreach_reduce``: ``foreach_reduce_scatter_copy_in``, ``torch._chunk_cat`` of the unsharded
  gradients into the ``reduce_dtype`` input buffer): reads the gradients in the training dtype and
  writes them in the reduce dtype, P_u·(b + b_r) bytes. The gradient's division by the world size
  runs inside the collective (``_get_gradient_divide_factors`` returns no pre- or post-divide factor
  for an fp32 or bf16 ``reduce_dtype``: ``ReduceOp.AVG``), so no divide kernel is priced.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from dlsim.plan.blocks import block_instance
from dlsim.plan.dataparallel import Bucket
from dlsim.spec.strategy import FSDP_UNITS
from dlsim.units import DTYPE_BYTES

__all__ = ["FSDP_UNITS", "block_buckets", "copy_in_bytes", "copy_out_bytes", "copy_out_times", "fsdp_block_units",
           "fsdp_copies", "kept_units", "last_block"]


def fsdp_block_units(s: Any) -> bool:
    """Whether strategy `s` shards ZeRO-3 units of one transformer block each (`fsdp_units` block)."""
    return s.zero == 3 and s.fsdp_units == "block"


def fsdp_copies(s: Any) -> bool:
    """Whether strategy `s` runs FSDP2's all-gather copy-out and reduce-scatter copy-in (ZeRO-3 only)."""
    return s.zero == 3 and s.fsdp_copies


def block_buckets(layer_bytes: Sequence[tuple[int, str, float]], param_scale: float = 1.0) -> list[Bucket]:
    """The FSDP2 units of a chunk's layers (model index, name, gradient bytes; forward order), in
    reduction order: the blocks from last to first, then the root unit (the layers outside every
    block), as `Bucket`s reduced over "dp". A layer without gradients joins none. A model without
    repeated blocks has one unit per layer (as `dlsim.plan.blocks.recompute_layers` makes each layer
    its own "layer")."""
    named = [(i, block_instance(name), nbytes) for i, name, nbytes in layer_bytes if nbytes > 0]
    if not any(block for _, block, _ in named):
        named = [(i, str(i), nbytes) for i, _, nbytes in named]
    blocks: dict[str, list[tuple[int, float]]] = {}
    root: list[tuple[int, float]] = []
    for i, block, nbytes in named:
        (blocks.setdefault(block, []) if block else root).append((i, nbytes))
    out = [_unit(layers, param_scale) for layers in reversed(list(blocks.values()))]
    if root:
        out.append(_unit(root, param_scale))
    return out


def _unit(layers: list[tuple[int, float]], param_scale: float) -> Bucket:
    nbytes = sum(n for _, n in layers)
    return Bucket(tuple(i for i, _ in layers), nbytes, "dp", -1.0 if param_scale == 1.0 else nbytes * param_scale)


def kept_units(buckets: Sequence[Bucket], names: dict[int, str], last_block: str | None) -> frozenset[int]:
    """The units of `buckets` (`block_buckets`) kept gathered from their forward to their backward: the
    root unit (layers outside every block) and the unit of the model's last block `last_block`
    (`names`: model index → layer name)."""
    kept = set()
    for j, b in enumerate(buckets):
        blocks = {block_instance(names[i]) for i in b.layers}
        if blocks == {None} or (last_block is not None and last_block in blocks):
            kept.add(j)
    return frozenset(kept)


def last_block(layer_names: Sequence[str]) -> str | None:
    """The model's last repeated-block instance (None without blocks)."""
    for name in reversed(layer_names):
        block = block_instance(name)
        if block is not None:
            return block
    return None


def copy_out_bytes(gather_nbytes: float) -> float:
    """Bytes the all-gather copy-out of a unit of `gather_nbytes` gathered parameters moves: 2·P_u·b."""
    return 2.0 * gather_nbytes


def copy_in_bytes(reduce_nbytes: float, dtype: str, reduce_element: int) -> float:
    """Bytes the reduce-scatter copy-in of a unit with `reduce_nbytes` of gradients in the reduce
    dtype (`reduce_element` bytes each) moves: P_u·(b + b_r), the training dtype's b read."""
    return reduce_nbytes / reduce_element * (DTYPE_BYTES[dtype] + reduce_element)


def copy_out_times(buckets: Sequence[Bucket], skip: frozenset[int],
                   time: Callable[[float, float], Any]) -> dict[int, float]:
    """Per unit (but those in `skip`: kept units in a backward pass) the seconds of its copy-out, from
    `time(flops, bytes)` (`dlsim.plan.steptime.elementwise_timer`: the device's memory roofline)."""
    return {j: time(0.0, copy_out_bytes(b.gather_nbytes)).seconds for j, b in enumerate(buckets) if j not in skip}


def unit_copies(entries: Sequence[Any], buckets: Sequence[Bucket], s: Any, time: Callable[[float, float], Any],
                model_last_block: str | None) -> tuple[frozenset[int], dict[int, float] | None, dict[int, float] | None]:
    """For a chunk's ZeRO-3 units `buckets` of `entries` under strategy `s`: (the units kept gathered
    from forward to backward, the copy-out seconds each forward pass adds at each unit's first step,
    the same for a backward pass: None without `fsdp_copies`). Both clocks build their step lists from
    it (`dlsim.plan.templates.forward_steps` / `backward_steps` ``unit_lead``)."""
    kept = kept_units(buckets, {e.index: e.name for e in entries}, model_last_block) if fsdp_block_units(s) \
        else frozenset()
    if not fsdp_copies(s):
        return kept, None, None
    return kept, copy_out_times(buckets, frozenset(), time), copy_out_times(buckets, kept, time)
