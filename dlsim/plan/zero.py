"""ZeRO / FSDP sharding: model-state memory per device and the collectives each stage needs.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC'20,
§5 and Fig. 1 (reference/algorithms.md §5.2), Ψ parameters, N_d data-parallel ranks, K bytes of
optimizer state per parameter (mixed-precision Adam: K = 12):

| stage | memory per device            | collectives per iteration                                  |
|-------|------------------------------|------------------------------------------------------------|
| 0     | (2 + 2 + K)·Ψ                | all-reduce gradients                                         |
| 1     | 4Ψ + K·Ψ/N_d                 | reduce-scatter gradients, all-gather updated parameters      |
| 2     | 2Ψ + (2 + K)·Ψ/N_d           | reduce-scatter each bucket every micro-batch, all-gather      |
| 3     | (2 + 2 + K)·Ψ/N_d            | all-gather parameters before each forward and backward (per   |
|       |                              | unit, per micro-batch), reduce-scatter gradients (1.5× DP)    |

Bytes per parameter come from `dlsim.cost.memory.state_bytes_per_param` (weights and gradients
in the training data type; optimizer state and fp32 master weights in fp32).
"""

from __future__ import annotations

from dlsim.cost.memory import state_bytes_per_param


def model_state_bytes(params: float, dtype: str, optimizer: str, zero: int, dp: int,
                      grad_bytes: float | None = None) -> dict[str, float]:
    """Weights, gradients and optimizer state one device holds for `params` parameters (gradients of
    `grad_bytes` each when the buffer is not in `dtype`)."""
    per = state_bytes_per_param(dtype, optimizer, grad_bytes)
    weights, grads, opt = params * per.weights, params * per.gradients, params * per.optimizer
    if zero >= 1:
        opt /= dp
    if zero >= 2:
        grads /= dp
    if zero >= 3:
        weights /= dp
    return {"weights": weights, "gradients": grads, "optimizer": opt}


def gradient_collective(s) -> str:
    """The collective that synchronises strategy `s`'s gradient buckets: all-reduce unsharded (zero
    0), reduce-scatter when sharded, but an all-reduce of the whole buffer for ZeRO-1 with
    `zero_grad_reduce` ``allreduce``: DeepSpeed 0.6.5's pipeline engine with its BF16_Optimizer
    reduces the full fp32 gradient buffer (cast to bf16 buckets) on every rank before each rank
    steps on its shard (microsoft/DeepSpeed@8164ea9 deepspeed/runtime/pipe/engine.py
    `_bf16_reduce_grads` -> engine.py `buffered_allreduce_fallback`), 2·(N−1)/N·B per rank instead
    of the reduce-scatter's (N−1)/N·B. The one place both clocks read (the simulation's
    `dlsim.plan.syncplan`, the evaluator's timing and bounds)."""
    if s.zero == 0 or (s.zero == 1 and s.zero_grad_reduce == "allreduce"):
        return "allreduce"
    return "reduce_scatter"


def reduces_every_microbatch(zero: int) -> bool:
    """ZeRO-2/3 keep only their gradient shard, so every micro-batch's gradients are reduce-scattered
    (DeepSpeed reduces at each micro-step); DDP and ZeRO-1 accumulate locally and reduce once."""
    return zero >= 2


def gathers_updated_params(zero: int) -> bool:
    """ZeRO-1/2 all-gather the updated parameter shards after the optimizer step."""
    return zero in (1, 2)


GATHER_PREFETCH = 1
"""Parameter units whose all-gathers are issued ahead of the unit that runs (ZeRO-3 / FSDP, and the
updated parameters' gathers of `gathers_in_forward`): one, as FSDP2's implicit forward prefetch and
explicit backward prefetch (torch/distributed/_composable/fsdp/_fsdp_state.py: a unit's pre-forward
issues the next unit's all-gather; at most two gathered outputs alive) and apex DistributedFusedAdam's
pre-forward hook (the next bucket's all-gather launched when a bucket is waited for) do."""


def gathers_in_forward(s) -> bool:
    """Whether ZeRO-1/2's all-gather of the updated parameters runs beside the next iteration's first
    forward pass, bucket by bucket (`Strategy.param_gather_overlap`), instead of after the optimizer
    step. In the periodic steady state the gathers the step launched run from the start of the next
    iteration, dispatched at once in the order the device's chunks run (NeMo's distributed Adam
    launches a chunk's bucket group ahead of it; the parameters stay resident, so nothing bounds how
    many are in flight); each bucket's first layer in the first micro-batch's forward waits for its
    gather. Routed experts' gathers (ep > 1) stay after the step."""
    return s.param_gather_overlap and gathers_updated_params(s.zero) and s.dp_cp > 1 and s.ep == 1


def optimizer_share(zero: int, dp: int) -> float:
    """Fraction of the device's parameters its optimizer step updates."""
    return 1.0 / dp if zero >= 1 else 1.0


def sharded_sync(s, nbytes: float, shard: int, replicas: int) -> list[tuple[str, float, str]]:
    """The gradient synchronisation of one bucket of `nbytes` under strategy `s` as (collective,
    bytes, group) steps.

    Unsharded (zero 0) or ZeRO-1 all-reducing (`gradient_collective`): one all-reduce over the dp x cp
    group. Sharded: a reduce-scatter over the shard group (all of dp x cp, or with `s.hybrid_shard`
    the node's `shard` ranks); hybrid sharding then all-reduces the 1/shard slice across the
    `replicas` shard groups (PyTorch FSDP HYBRID_SHARD, Zhao et al., "PyTorch FSDP", VLDB 2023,
    §3.2.2; DeepSpeed's MiCS).
    Per rank this moves 2·(N−1)/N·B for the all-reduce and (S−1)/S·B + 2·(R−1)/R·B/S for hybrid.
    """
    base = gradient_collective(s)
    if base == "allreduce":
        return [("allreduce", nbytes, "dp")]
    if not s.hybrid_shard:
        return [("reduce_scatter", nbytes, "dp")]
    steps = [("reduce_scatter", nbytes, "shard")] if shard > 1 else []
    if replicas > 1:
        steps.append(("allreduce", nbytes / shard, "replica"))
    return steps
