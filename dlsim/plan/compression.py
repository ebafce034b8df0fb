"""Gradient compression as a change of message volume plus compression compute.

reference/algorithms.md §7: T = T_compress(n) + T_comm(compressed bytes) + T_decompress. A dense
quantised payload cannot be summed on the wire, so it is reduce-scattered (each rank decompresses,
adds and re-quantises its stripe) and all-gathered (the two exchange phases of 1-bit SGD, Seide et
al., Interspeech 2014); a sparse top-k payload is reduced by SparCML's sparse allreduce (Renggli et
al. SC'19, `dlsim.cost.collectives.sparse`: recursive doubling for small data, split-allgather for
large data, each part switched to dense where denser than the dense vector, or the dense allreduce
outright: the cheapest by closed form), so that top-k at any density costs at most the dense
all-reduce plus its selection and scatter kernels; each bucket's sum is added into the gradient as it
arrives (`dlsim.plan.syncplan`), so its buffers live only while its bucket is reduced. Payloads for n elements:

* fp16: 2n bytes, still summable: one all-reduce;
* QSGD with b bits per element and one fp32 norm per bucket of d elements (Alistarh et al., NIPS
  2017, practical bucketed form): n·b/8 + 4·⌈n/d⌉;
* top-k with density ρ: k = ⌈ρn⌉ (index, value) items of 4 + e bytes (e the gradient element's
  bytes, or with `value_bits` q < 32 the quantised value's q/8 and one fp32 scale per bucket of d
  elements, SparCML's quantised top-k): (4 + e)·k per rank; the sum of p such vectors has K(p) = n·(1 − (1 − ρ)^p) nonzeros
  (uniform indices, SparCML's analysis), scattered into the dense gradient after the reduction;
* 1-bit SGD: n/8 bytes of signs + 2 fp32 reconstruction values per column of d elements: n/8 + 8⌈n/d⌉.

Error feedback (residual accumulation) keeps one more fp32 copy of the gradients and adds a pass
over them. Compression work is element-wise and memory-bound: it is priced by the roofline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlsim.cost.collectives.sparse import DEFAULT_INDEX_BYTES, fill_in
from dlsim.plan.comm import sparse_op
from dlsim.spec.strategy import Compression

FP32 = 4


@dataclass(frozen=True)
class CompressedSync:
    """How one gradient bucket is synchronised: collectives (op, full-buffer bytes) in order, the
    element-wise work before (compress) and after (decompress) as (flops, bytes moved), and the bytes
    of communication buffers alive from compression to decompression (-1: the largest collective)."""

    collectives: tuple[tuple[str, float], ...]
    compress: tuple[float, float]
    decompress: tuple[float, float]
    payload: float
    buffer: float = -1.0

    @property
    def buffer_bytes(self) -> float:
        return self.buffer if self.buffer >= 0 else max(nbytes for _, nbytes in self.collectives)


def plan_sync(comp: Compression, nbytes: float, grad_bytes_per_elem: int, ranks: int,
              base_op: str = "allreduce") -> CompressedSync:
    """The synchronisation of `nbytes` of gradients over `ranks` under `comp`."""
    n = nbytes / grad_bytes_per_elem
    kind = comp.kind
    ef = (2.0, 2 * FP32 * n) if comp.error_feedback and kind not in ("none", "fp16") else (0.0, 0.0)
    if kind == "none":
        return CompressedSync(((base_op, nbytes),), (0.0, 0.0), (0.0, 0.0), nbytes)
    if kind == "fp16":
        payload = 2 * n
        if grad_bytes_per_elem <= 2:
            return CompressedSync(((base_op, nbytes),), (0.0, 0.0), (0.0, 0.0), nbytes)
        return CompressedSync(((base_op, payload),), (n, nbytes + payload), (n, payload + nbytes), payload)
    if kind == "qsgd":
        payload = n * comp.bits / 8 + FP32 * math.ceil(n / comp.bucket_elements)
        work = (6 * n + ef[0] * n, nbytes + payload + ef[1])
        back = (6 * n, 2 * payload + nbytes)  # decode stripes, add, re-quantise, decode
        return CompressedSync((("reduce_scatter", payload), ("allgather", payload)), work, back, payload)
    if kind == "1bit":
        payload = n / 8 + 2 * FP32 * math.ceil(n / comp.bucket_elements)
        work = (4 * n + ef[0] * n, nbytes + payload + ef[1])
        back = (4 * n, 2 * payload + nbytes)
        return CompressedSync((("reduce_scatter", payload), ("allgather", payload)), work, back, payload)
    if kind == "topk":
        k = math.ceil(comp.density * n)
        value = grad_bytes_per_elem if comp.value_bits >= 32 else comp.value_bits / 8 + FP32 / comp.bucket_elements
        item = DEFAULT_INDEX_BYTES + value
        dense = n * value  # the dense vector in the values' precision (what the sparse/dense switch compares)
        payload = item * k
        nonzeros = float(fill_in(comp.density, ranks, n))
        reduced = min(item * nonzeros, dense)  # the sum, sparse or (switched) dense
        # selection (a threshold pass and a gather pass over the gradients, O(n), DGC's sampling), quantisation
        work = (3 * n + ef[0] * n, 2 * nbytes + payload + ef[1])
        back = (min(nonzeros, n), reduced + nbytes)  # the reduced items added into the dense gradient
        return CompressedSync(((sparse_op(comp.density, value), dense),), work, back, payload,
                              min(payload, dense) + reduced)
    raise ValueError(f"unknown compression {kind!r}")


def error_feedback_bytes(comp: Compression, params: float) -> float:
    """Memory of the residual kept by error feedback: one fp32 copy of the gradients."""
    if comp.kind in ("none", "fp16") or not comp.error_feedback:
        return 0.0
    return FP32 * params
