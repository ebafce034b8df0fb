"""The softmax cross-entropy loss as each training stack computes it (strategy and stack key
`loss_kernel`, `dlsim.spec.ops.LOSS_KERNELS`), kernel by kernel.

E is the number of logits (a micro-batch's tokens times the vocabulary V), R = E / V the rows, b the
training dtype's bytes, fp32 four bytes. Each chain is written from the code that runs it; its time is
the memory roofline of the bytes every kernel reads and writes plus one launch per kernel (as the
eager chains of `dlsim.cost.eager`), never a measured curve of another kernel (`PassCost.chain`). The
FLOPs are the single kernel's (log-softmax and the pick ≈ 5 per logit forward, softmax − one-hot ≈ 4
backward), so FLOP counts do not depend on the stack. Kernels over one value per row (maxima, sums,
targets, masks, gathers: R-sized) are counted as launches with `ROW_BYTES` read and written per row
each, 1/V of the logits' traffic. Under tensor parallelism every rank runs the chain on its V/tp
logits (`dlsim.plan.tensorparallel`, role parallel_ce, with the loss's all-reduces).

* ``single_pass``: one kernel reading the logits in the training dtype forward (the loss, 4 bytes a
  row, written), one reading and writing them backward; keeps its input. A stack whose loss code is
  not named (a user's own training loop).
* ``megatron``: ``vocab_parallel_cross_entropy(output.float(), labels)``, Megatron-LM's
  _VocabParallelCrossEntropy (NVIDIA/Megatron-LM@e269e20 and @55ba1f7 megatron/mpu/cross_entropy.py,
  megatron/model/gpt_model.py post_language_model_processing without --fp16-lm-cross-entropy; the same
  code in bigscience-workshop/Megatron-DeepSpeed@e23393f, whose GPTModelPipe casts with
  float16_to_fp32 before its CrossEntropy; Megatron-Core 0.7's language_module.py, and 0.9's
  megatron/core/tensor_parallel/cross_entropy.py, which casts inside calculate_logits_max). Forward:
  the cast (reads b, writes 4; none in fp32), torch.max over the row (4, R), sub_ of the maximum
  (4, 4), exp in place (4, 4), sum over the row (4, R), div_ by the sum (4, 4): reads 20 + b, writes
  16 bytes per logit (38 in 16-bit, 6 kernels), and 14 row-sized kernels (the target mask: two
  compares and an or; clone and shift of the target; the masked fill's nonzero and index_put; arange,
  the gather of the target logits and its clone; the second masked fill's nonzero and index_put; log
  and the subtraction). Saves the fp32 softmax, the target mask (1 byte a row) and the masked target
  (8): 4·E + 9·R bytes; neither the b-byte logits (the cast's backward keeps nothing) nor its input.
  Backward: the one-hot subtraction (arange, the mask's float and 1 − it, the index, the subtraction
  and index_put: 6 row-sized kernels), mul_ by the incoming gradient (4, 4), the cast back to the
  logits' dtype (4, b; autograd casts a custom Function's fp32 gradient to its input's dtype, and
  Megatron-LM's .float() has ToCopyBackward): reads 8, writes 4 + b (14 in 16-bit, 2 kernels).
* ``megatron_fused``: Megatron-Core 0.9's cross_entropy_loss_fusion (NVIDIA/Megatron-LM@core_v0.9.0
  megatron/core/fusions/fused_cross_entropy.py): the same operations in three functions compiled by
  ``jit_fuser`` (megatron/core/jit.py: torch.compile from PyTorch 2.2) and one all-reduce fewer. Forward:
  the cast with the row maximum (reads b, writes the fp32 copy 4), the subtraction, exp in place and the
  row sum in one reduction (4, 4), div_ (4, 4): reads 8 + b, writes 12 (22 in bf16), and two row-sized
  kernels (masks with the target gather and its concatenation; the loss). Saves as ``megatron``.
  Backward: the one-hot subtraction (one row-sized kernel) and mul_ fused with calculate_gradients'
  ``grad_input.to(torch.bfloat16)`` (reads 4, writes the mutated fp32 input 4 and the bf16 gradient
  2), and a cast of that bf16 gradient to the logits' dtype where they are not bf16 (2, b).
* ``torch``: ``F.cross_entropy`` on fp32 logits (pytorch/torchtitan@7310abe train.py loss_fn
  ``cross_entropy(pred.flatten(0, 1).float(), ...)``; @157a12c casts in the model, ``self.output(h).float()``;
  PyTorch's CUDA autocast runs cross_entropy in fp32). PyTorch 2.5's ATen kernels
  (aten/src/ATen/native/cuda/SoftMax.cu, Loss.cu): the cast (b, 4), log_softmax (cunn_SoftMaxForward,
  a row wider than a block's 48 KiB of shared memory: the maximum, the sum of exponentials and the
  output each read the row: reads 12, writes 4), nll_loss (one row-sized kernel). Saves the fp32
  log-softmax (4·E) and the target (8·R). Backward: nll_loss_backward zero-fills its fp32 gradient
  (writes 4) and scatters the target rows (one row-sized kernel); _log_softmax_backward_data
  (cunn_SoftMaxBackward: the row sum of the gradient, then the gradient and the output read again:
  reads 12, writes 4); the cast back (4, b): reads 16, writes 8 + b (26 in 16-bit, 3 kernels).
"""

from __future__ import annotations

from dlsim.cost.layercost import PassCost
from dlsim.cost.workdepth import clog2
from dlsim.units import DTYPE_BYTES

FP32 = 4
ROW_BYTES = 8
"""Bytes read and written per row by each row-sized kernel of a chain (an int64 target, a pair of
fp32 values): an allowance, 1/V of the logits' traffic."""
MASK_TARGET = 1 + 8
"""Bytes per row the Megatron chains keep for the backward: the target mask (bool) and the masked target (int64)."""


def _chain(kernels: list[tuple[float, float]], row_kernels: int, elements: int, rows: int) -> tuple[float, float, int]:
    """(bytes read, bytes written, launches) of element kernels (reads, writes per logit) and row-sized kernels."""
    reads = sum(r for r, _ in kernels) * elements + ROW_BYTES * rows * row_kernels
    writes = sum(w for _, w in kernels) * elements + ROW_BYTES * rows * row_kernels
    return reads, writes, len(kernels) + row_kernels


def loss_chain(kernel: str, elements: int, rows: int, dtype: str) -> tuple[PassCost, PassCost, float | None]:
    """(forward, backward, bytes kept for the backward) of the cross-entropy over `elements` logits in
    `rows` rows of `dtype` as `kernel` computes it (see the module doc); the kept bytes are None for
    ``single_pass``, which keeps its input."""
    b = DTYPE_BYTES[dtype]
    vocab = max(elements // max(rows, 1), 1)
    depth = 2 * clog2(vocab)
    fwd_flops, bwd_flops = 5 * elements, 4 * elements
    if kernel == "single_pass":
        return (PassCost(fwd_flops, fwd_flops, depth, elements * b, rows * FP32),
                PassCost(bwd_flops, bwd_flops, depth, elements * b, elements * b), None)
    cast = [(b, FP32)] if b != FP32 else []
    back = [(FP32, b)] if b != FP32 else []
    if kernel == "megatron":
        fwd = _chain(cast + [(FP32, 0), (FP32, FP32), (FP32, FP32), (FP32, 0), (FP32, FP32)], 14, elements, rows)
        bwd = _chain([(FP32, FP32)] + back, 6, elements, rows)
        kept = FP32 * elements + MASK_TARGET * rows
    elif kernel == "megatron_fused":
        first = (b, FP32) if b != FP32 else (FP32, 0)  # .float() of fp32 logits is the tensor itself
        fwd = _chain([first, (FP32, FP32), (FP32, FP32)], 2, elements, rows)
        bwd = _chain([(FP32, FP32 + 2)] + ([(2, b)] if dtype != "bf16" else []), 1, elements, rows)
        kept = FP32 * elements + MASK_TARGET * rows
    elif kernel == "torch":
        fwd = _chain(cast + [(3 * FP32, FP32)], 1, elements, rows)
        bwd = _chain([(0, FP32), (3 * FP32, FP32)] + back, 1, elements, rows)
        kept = FP32 * elements + 8 * rows
    else:
        raise ValueError(f"unknown loss kernel {kernel!r}")
    return (PassCost(fwd_flops, fwd_flops, depth, fwd[0], fwd[1], kernels=fwd[2], chain=kernel),
            PassCost(bwd_flops, bwd_flops, depth, bwd[0], bwd[1], kernels=bwd[2], chain=kernel), kept)
