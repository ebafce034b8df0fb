"""The values strategy fields take (`dlsim.spec.strategy.Strategy`): schedules, recomputation,
fused kernels, gradient accumulation and the other choices, each documented with what it means and
where it is priced."""

from __future__ import annotations

from dlsim.units import MIB

SCHEDULES = ("gpipe", "1f1b", "interleaved")
SYNCS = ("allreduce", "ps", "async", "ssp")
RECOMPUTE = ("none", "full", "selective", "selective_layer", "selective_op")
"""Activation recomputation (strategy key `recompute`, `dlsim.plan.recompute`): none; full (every
transformer layer's input checkpointed, Megatron-LM's full granularity); selective (Megatron-LM's:
the attention core, Korthikanti et al. 2022 §4.2); selective_layer and selective_op (torchtitan's:
every second block checkpointed in full; every block with its per-operator save list,
`dlsim.plan.oprecompute`)."""
COMPRESSIONS = ("none", "fp16", "qsgd", "topk", "1bit")
VALUE_BITS = (1, 2, 4, 8, 16, 32)
"""Bits per value of a top-k payload (`Compression.value_bits`): 32 plain, fewer quantised."""
JITTERS = ("none", "normal", "lognormal", "exponential", "uniform")
PARALLEL_MODES = ("data", "model", "channel", "filter")
"""How a layer group runs over the dp devices (`LayerGroup`): data (sample) parallel, or split over
them at the gathered batch: model (tensor parallelism's column/row alternation), channel (every
convolution and fully connected layer split by input channels) or filter (by output channels)."""
OPTIMIZERS = ("sgd", "momentum", "adam")
OPTIMIZER_IMPLS = ("fused", "foreach", "for_loop")
"""How the optimizer step runs (strategy key `optimizer_impl`): one fused kernel per group of
tensors (apex / Transformer Engine FusedAdam, torch ``fused=True``), PyTorch's multi-tensor
``_foreach`` ops (one pass over the state per op), or one kernel per op and tensor; the traffic of
each is counted in `dlsim.cost.memory.optimizer_step_traffic`."""
PIPELINE_SPLITS = ("balanced", "uniform")
"""How a pipeline's layers are cut into chunks when the strategy gives no `stage_partition` (strategy
and stack key `pipeline_split`, `dlsim.plan.partition`): balanced on the layers' costs (the slowest
chunk as fast as it can be, PipeDream's planner), or the same number of repeated blocks in every
chunk with the layers before the first block in the first chunk and those after the last in the last
(Megatron-LM's and Megatron-Core's split, which needs the blocks divisible by pp x virtual_stages)."""
FSDP_UNITS = ("bucket", "block")
"""`fsdp_units`: ZeRO-3's parameter units cut by the gradient bucket size, or PyTorch FSDP2's units of
one transformer block each as torchtitan wraps them (`dlsim.plan.fsdp`)."""
ZERO_GRAD_REDUCES = ("reduce_scatter", "allreduce")
"""`zero_grad_reduce`: how ZeRO-1 reduces the gradients before each rank steps on its shard
(`dlsim.plan.zero.gradient_collective`)."""
GRAD_ACCUMULATIONS = ("autograd", "main_grad", "main_grad_fp32", "cast_add_fp32", "fused", "fused_fp32", "none")
"""How each micro-batch's weight gradient reaches the gradient buffer (strategy key
`grad_accumulation`; bytes per parameter in `dlsim.cost.memory.grad_accumulation_bytes`):

* autograd: PyTorch's AccumulateGrad: the first micro-batch's gradient is kept as it is, each
  later one is added in place by a separate kernel;
* main_grad: Megatron-LM's local DDP with a contiguous gradient buffer in the training dtype
  (its default for fp16 at commit 55ba1f7): a backward hook adds every micro-batch's gradient into
  `main_grad` (megatron/model/distributed.py, `param.main_grad.add_(param.grad.data)`);
* main_grad_fp32: the same buffer in fp32 (`--accumulate-allreduce-grads-in-fp32` without
  gradient-accumulation fusion);
* cast_add_fp32: DeepSpeed's BF16_Optimizer (`update_hp_grads` after every micro-batch's backward,
  microsoft/DeepSpeed@8164ea9 deepspeed/runtime/bf16_optimizer.py): per parameter tensor
  ``hp_grad.add_(lp.grad.to(fp32))``, a cast into a temporary fp32 tensor, then the add into the
  fp32 buffer;
* fused: Transformer Engine's gradient-accumulation fusion into a buffer in the training dtype
  (or `grad_reduce_dtype`): the weight-gradient GEMM accumulates in its epilogue, no kernel of its
  own (NeMo's distributed Adam with a bf16 gradient buffer);
* fused_fp32: Megatron-LM / Transformer Engine's gradient-accumulation fusion: the weight-gradient
  GEMM accumulates into the fp32 buffer in its epilogue (no kernel of its own; bf16 default);
* none: not charged.
"""

FUSIONS = ("scale_mask_softmax", "strided_attention", "flash_attention", "cudnn_attention", "xformers_attention",
           "bias_dropout_add", "rmsnorm", "glu", "rope")
"""Fused kernels a software stack may have (strategy key `fused_kernels`; priced by
`dlsim.cost.layers`); none is assumed:

* scale_mask_softmax: attention's scaling, causal mask and softmax in one kernel (Megatron-LM's
  FusedScaleMaskSoftmax), forward and backward;
* strided_attention: QKᵀ and PV read Q, K, V as strided views of the projection's output
  (Megatron-LM's baddbmm/bmm on transposed views): only the context is made contiguous;
* flash_attention: the whole attention core in one tiled kernel (Dao et al. 2022, 2023:
  FlashAttention-2): the L×L scores never reach memory, a causal mask skips the tiles above the
  diagonal, the backward recomputes QKᵀ;
* cudnn_attention: the same algorithm as cuDNN's fused attention (Transformer Engine's
  FusedAttention backend), priced from its own measured throughput where the profile has one;
* xformers_attention: the same algorithm as xformers' memory_efficient_attention (Rabe & Staats
  2021, "Self-attention Does Not Need O(n²) Memory"; the kernel LLaMA trained with), priced from its
  own measured throughput where the profile has one;
* bias_dropout_add: a dropout and the residual add that consumes it in one kernel (Megatron-LM);
* rmsnorm: RMSNorm in one kernel each way (Transformer Engine's and apex's fused RMSNorm, torchtitan's
  Triton fused_rmsnorm); without it the eager chain of casts, pow, mean, rsqrt and products
  (`dlsim.cost.eager.rmsnorm_chain`);
* glu: a gated linear unit's activation and product in one kernel each way (Megatron-Core's
  bias_swiglu); without it the activation and the product as two kernels (`dlsim.cost.eager.glu_chain`);
* rope: rotary embeddings in one kernel each way (Transformer Engine's fused_apply_rotary_pos_emb);
  without it the fp32 casts and complex product of the Llama reference code (`dlsim.cost.eager.rope_chain`).
"""

FLASH_KERNELS = ("cudnn_attention", "flash_attention", "xformers_attention")
"""The fused kernels that run an attention core as one flash kernel (no score kept), in the order
a stack naming both would use them (Transformer Engine prefers cuDNN's where both are enabled)."""


def flash_kernel(fused) -> str | None:
    """The flash kernel among `fused` kernel names (`FLASH_KERNELS`), or None."""
    return next((k for k in FLASH_KERNELS if k in fused), None)


OFFLOADS = ("none", "activations", "optimizer", "both")
"""What goes to host memory over the device's host link (strategy key `offload`, `dlsim.plan.offload`)."""

DEFAULT_BUCKET_BYTES, DEFAULT_FIRST_BUCKET_BYTES = 25 * MIB, 1 * MIB
"""PyTorch DDP's `bucket_cap_mb = 25` and its first bucket's kDefaultFirstBucketBytes (torch/csrc/distributed/c10d/reducer.hpp)."""
