"""The cost records of one layer's training step: a GEMM call, one pass's cost (FLOPs, work and
depth, bytes, GEMMs, kernels), a layer's three passes and what it keeps for the backward pass.
Built by the per-operator rules of `dlsim.cost.layers`, `dlsim.cost.attention` and `dlsim.cost.moe`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

MASK_BYTES = 1   # a dropout keep-mask element (bool)
INDEX_BYTES = 8  # an int64 token id


# FLOP per output element, forward / backward: silu(a)·b = a·σ(a)·b (σ ≈ 4, two products);
# gelu(a)·b with gelu's tanh approximation (14) and one product; backward about 1.5x
GLU_FLOPS = {"swiglu": (6, 10), "geglu": (15, 22)}

# relu6 two compares each way; silu x·σ(x) = σ (4) + 1 product, backward σ(x)(1 + x(1 - σ(x))) ≈ 6.
ACTIVATION_FLOPS = {"relu": (1, 1), "sigmoid": (4, 3), "tanh": (5, 3), "gelu": (14, 20), "relu6": (2, 2),
                     "silu": (5, 6)}


@dataclass(frozen=True)
class Gemm:
    """C[m×n] = A[m×k]·B[k×n], `count` independent times (a batched GEMM)."""

    m: int
    n: int
    k: int
    count: int = 1

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class FlashKernel:
    """An attention core run as one tiled kernel that keeps the scores on chip (Dao et al. 2022):
    FlashAttention-2 (`kernel` "flash_attention") or cuDNN's fused attention ("cudnn_attention"). Its
    products stay in the pass's `gemms` (the batched ones, counted as full products), but it is priced
    as one kernel per `pass_name` ("forward" or "backward") by `dlsim.cost.flash`: no L×L score
    reaches memory, and a `causal` mask skips the tiles above the diagonal. `length` is the key length
    one call sees (the rank's share of the sequence under context parallelism, whose ring of `cp`
    steps runs one call per step); `io_elements` the Q, K, V, output (and gradients) it reads and
    writes, elements of this device."""

    kernel: str
    pass_name: str
    causal: bool
    length: int
    io_elements: float
    cp: int = 1
    head_dim: int | None = None


@dataclass(frozen=True)
class UnfusedCore:
    """The shape of an unfused attention core in its pass: the pass's batched GEMMs (count > 1) run
    `length` keys of `head_dim`-wide heads; `dlsim.cost.unfused` prices them where the device holds a
    measured standard-attention chain."""

    length: int
    head_dim: int


@dataclass(frozen=True)
class PassCost:
    """Cost of one pass of one layer for a whole (micro-)batch.

    `kind` is "gemm" (priced by its GEMMs), "conv" (a convolution; `gemms` is its im2col form)
    or "memory" (element-wise / reduction work, bandwidth-bound). `kernels` is the number of
    kernel launches the pass needs. `parts` lists the memory-bound kernels a "gemm" pass runs
    between its GEMMs, as (op type priced like, pass of that op, its cost): measured tables price
    each from that op's curve (an unfused attention's scaling, softmax, dropout and layout copies).
    `flash` marks an attention core run as one flash kernel: its batched GEMMs are priced as that
    kernel (`dlsim.cost.flash`), not one by one; `unfused` an unfused core, whose batched GEMMs
    `dlsim.cost.unfused` prices. `chain` names the loss implementation (`dlsim.cost.loss`) whose kernel
    chain the pass is: priced by the roofline of its bytes, never by the operator's measured curve (a
    measurement of another kernel, indexed by another byte count).
    """

    flops: float = 0.0
    work: float = 0.0
    depth: int = 0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    gemms: tuple[Gemm, ...] = ()
    kind: str = "memory"
    kernels: int = 1
    parts: tuple[tuple[str, str, "PassCost"], ...] = ()
    flash: FlashKernel | None = None
    unfused: UnfusedCore | None = None
    chain: str = ""

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written

    @property
    def matmul_flops(self) -> float:
        return float(sum(g.flops for g in self.gemms))


NO_PASS = PassCost(kernels=0)


@dataclass(frozen=True)
class LayerCost:
    """Forward, ∇x and ∇w costs of a layer, and what it keeps for the backward pass."""

    forward: PassCost
    backward_data: PassCost
    backward_weight: PassCost
    saves_input: bool = False
    saves_output: bool = False
    extra_saved_bytes: float = 0.0
    conv: dict | None = field(default=None)
    internal_backward: PassCost = NO_PASS
    """The part of the ∇x pass that still runs when no input needs a gradient: in a composite layer the
    gradients its own weights need (through time and between stacked layers of a recurrent layer, into
    an attention's Q, K and V), all but the products giving the input's gradient."""
    input_backward: tuple[PassCost, ...] = ()
    """For a layer of several activation inputs whose ∇x is one product per input (∇A and ∇B of a
    matrix product), each input's part of the ∇x pass, in input order."""

    @property
    def matmul_flops(self) -> float:
        """Forward FLOPs of matrix-multiply-class work (conv, linear, attention products), as
        PyTorch's FlopCounterMode counts them."""
        return self.forward.matmul_flops

    @property
    def flops(self) -> float:
        return self.forward.flops + self.backward_data.flops + self.backward_weight.flops


def without_gemms(cost: PassCost, drop: tuple[Gemm, ...], bytes_written: float) -> PassCost:
    """`cost` less the GEMMs `drop` (one occurrence each, with their FLOPs and launches), writing
    `bytes_written` instead."""
    gemms = list(cost.gemms)
    for g in drop:
        gemms.remove(g)
    flops = sum(g.flops for g in drop)
    return replace(cost, flops=cost.flops - flops, work=cost.work - flops / 2, gemms=tuple(gemms),
                   kernels=cost.kernels - len(drop), bytes_written=bytes_written)


def elementwise(elements: float, b: int, flops_per: float, reads: int = 1, writes: int = 1,
                 depth: int = 1) -> PassCost:
    """An element-wise kernel over `elements` of `b` bytes: `flops_per` FLOPs, `reads` reads and
    `writes` writes per element."""
    return PassCost(flops=flops_per * elements, work=flops_per * elements, depth=depth,
                    bytes_read=reads * elements * b, bytes_written=writes * elements * b)

