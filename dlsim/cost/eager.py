"""Eager PyTorch kernel chains: the element-wise operators a fused kernel replaces, as autograd runs
them one ATen kernel at a time (strategy key `fused_kernels`, `dlsim.spec.strategy.FUSIONS`: a stack
without ``rmsnorm``, ``glu`` or ``rope`` runs these chains).

Each chain is written from the model code that runs it, kernel by kernel; its time is the memory
roofline of the bytes every kernel reads and writes (`dlsim.cost.roofline`, as every memory-bound
kernel), plus one launch per kernel. E is the number of elements of the operand, R its rows, b the
training dtype's bytes, fp32 four bytes. The FLOPs are those of the fused kernel (the same
arithmetic; the casts and copies add none), so FLOP counts and MFU do not depend on the fusion.
Kernels over one value per row (the RMS statistics) are counted as launches, with their R-sized
traffic.

* `rmsnorm_chain`: ``RMSNorm.forward``, ``(x.float() * rsqrt(x.float().pow(2).mean(-1, keepdim=True) +
  eps)).type_as(x) * weight`` (pytorch/torchtitan@157a12c torchtitan/models/norms.py RMSNorm, the
  same in @7310abe; Meta's reference llama/model.py RMSNorm).
  Forward kernels: cast to fp32 (reads b, writes 4), pow (4, 4), mean over the row (4, R), add eps
  and rsqrt (R-sized), x·rstd (4, 4), cast back (4, b), ·weight (b, b): 8 launches, reads 16 + 2b and
  writes 12 + 2b bytes per element. Autograd keeps the fp32 copy (for pow and the product), the
  rstd row (the product's and rsqrt's, one tensor), and the normalised b-byte tensor (for ∇weight):
  (4 + b)·E + 4·R bytes; not x itself.
  Backward (pytorch/pytorch tools/autograd/derivatives.yaml and FunctionsManual.cpp):
  MulBackward0 of ·weight: ∇ = g·w (reads b, writes b) and ∇weight = sum(g·x̂) (a product reads 2b
  writes b, a reduction reads b); the cast's backward (b, 4); MulBackward0 of x·rstd: g·rstd (4, 4)
  and sum(g·x) (8, 4; 4, R); RsqrtBackward0 and AddBackward0 (R-sized); MeanBackward1:
  ``grad.expand / D`` (writes 4); PowBackward0 ``grad · (2 · x.pow(1))`` (x.pow(1) is a copy:
  aten/src/ATen/native/Pow.cpp; then two products: reads 16, writes 12); the two gradients of the
  fp32 copy summed (8, 4); the first cast's backward (4, b): 13 element-sized kernels and 3
  row-sized, reads 44 + 5b and writes 32 + 3b bytes per element.
* `glu_chain`: ``F.silu(w1(x)) * w3(x)`` (torchtitan/models/llama/model.py FeedForward; GeGLU the same
  with gelu): the activation (reads b, writes b) and the product (2b, b): 2 launches; autograd
  keeps the activation's input, its output and the other operand (3·b per output element).
  Backward: MulBackward0 g·v and g·σ(a) (two kernels, 2b read, b written each), the activation's
  backward from g and a (2b, b): 3 launches.
* `rope_chain`: ``apply_rotary_emb`` (torchtitan/models/llama/model.py: ``view_as_complex(x.float()
  ...) * freqs_cis``, ``view_as_real(...).type_as(x)``) on Q and K: per tensor a cast to fp32 (b, 4),
  the complex product (4, 4; the frequency table's L·d_h/2 complex numbers are a broadcast read,
  not counted), the cast back (4, b): 3 launches per tensor, and the same three backward (the
  product's gradient g·conj(freqs), freqs needing none). Nothing extra kept (freqs_cis is a buffer).
"""

from __future__ import annotations

from dlsim.cost.layercost import PassCost
from dlsim.cost.workdepth import clog2

FP32 = 4


def rmsnorm_chain(elements: int, rows: int, b: int, fwd_flops: float, bwd_flops: float) -> tuple[PassCost, PassCost, float]:
    """(forward, backward, bytes autograd keeps) of eager RMSNorm over `elements` in `rows` rows of
    `b`-byte elements (see the module doc)."""
    depth = clog2(max(elements // max(rows, 1), 1))
    fwd = PassCost(fwd_flops, fwd_flops, depth, (16 + 2 * b) * elements + 12 * rows,
                   (12 + 2 * b) * elements + 12 * rows, kernels=8)
    bwd = PassCost(bwd_flops, bwd_flops, depth, (44 + 5 * b) * elements + 16 * rows,
                   (32 + 3 * b) * elements + 12 * rows, kernels=16)
    return fwd, bwd, (FP32 + b) * elements + FP32 * rows


def glu_chain(out: int, b: int, fwd_flops: float, bwd_flops: float) -> tuple[PassCost, PassCost, float]:
    """(forward, backward, bytes autograd keeps) of an eager gated linear unit act(a)·v with `out`
    output elements (see the module doc)."""
    fwd = PassCost(fwd_flops, fwd_flops, 1, 3 * out * b, 2 * out * b, kernels=2)
    bwd = PassCost(bwd_flops, bwd_flops, 1, 6 * out * b, 3 * out * b, kernels=3)
    return fwd, bwd, 3 * out * b


def rope_chain(elements: int, b: int, tensors: int = 2) -> PassCost:
    """One pass (forward or backward: the same kernels) of eager rotary embeddings over `elements`
    of Q and K together, `tensors` tensors (see the module doc)."""
    return PassCost(3 * elements, 3 * elements, 1, (b + 2 * FP32) * elements, (2 * FP32 + b) * elements,
                    kernels=3 * tensors)
