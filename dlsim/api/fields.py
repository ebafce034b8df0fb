"""Typed keyword arguments of the API: the strategy fields `simulate()` and friends accept.

`StrategyFields` names every field of `dlsim.spec.strategy.Strategy` (a test keeps the two equal)
plus ``global_batch``, which sets ``num_microbatches`` from the batch; a type checker then checks
``simulate("gpt2", "dgx-h100", dp=2, microbatch_size=4)`` like any keyword call (PEP 692).
"""

from __future__ import annotations

from typing import TypedDict

from dlsim.spec.strategy import Compression, LayerGroup, Variability


class StrategyFields(TypedDict, total=False):
    dp: int
    tp: int
    pp: int
    microbatch_size: int
    num_microbatches: int
    global_batch: int
    schedule: str
    virtual_stages: int
    sync: str
    staleness: int
    ps_shards: int
    fetch_every: int
    push_every: int
    iterations: int
    collective: str
    bucket_size: float
    first_bucket_size: float
    overlap: bool
    recompute: str
    zero: int
    compression: Compression
    variability: Variability
    stage_partition: tuple[int, ...] | None
    layer_groups: tuple[LayerGroup, ...]
    optimizer: str
    dtype: str | None
    sequence_parallel: bool
    tp_async_backward: bool
    p2p_overlap: bool
    p2p_scatter_gather: bool
    fused_kernels: tuple[str, ...]
    loss_kernel: str
    recompute_layers: int
    grad_accumulation: str
    ep: int
    ep_overlap: bool
    cp: int
    hybrid_shard: bool
    offload: str
    optimizer_impl: str
    grad_reduce_dtype: str
    zero_grad_reduce: str
    fsdp_units: str
    fsdp_copies: bool
    param_gather_overlap: bool
    tp_comm_overlap: bool
    spatial: int
    spatial_w: int
    halo_overlap: bool
    stack: str
