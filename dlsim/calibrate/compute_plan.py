"""What a compute calibration measures: the generic grids and exactly the kernels a model needs.

Pure planning, no PyTorch: a list of tasks, each the key of one table row.

* GEMM grid: every (m, n, k) with each dimension a power of two from 1 to `gemm_max`, except
  products above `gemm_max_flops` (the largest kernels cost the most time and sit where the
  throughput has saturated, so the lookup clamps there), per data type; plus batched GEMMs of
  attention shapes (L×L×64 and L×64×L, 16 of them) for L = 64 … 1024.
* GEMM "odd" set (`odd_gemms`): `ODD_POINTS` shapes whose dimensions are not powers of two, spread
  evenly in (log m, log n, log k) over the same box by a Halton sequence (bases 2, 3, 5; J. H.
  Halton, "On the efficiency of certain quasi-random sequences of points in evaluating
  multi-dimensional integrals", Numer. Math. 2, 1960), same FLOP cap. A BLAS kernel works in
  register and cache blocks (K. Goto and R. van de Geijn, "Anatomy of high-performance matrix
  multiplication", ACM TOMS 34(3), 2008, §6: micro-kernel m_r × n_r, blocks m_c × k_c); a
  power-of-two size fills them exactly, other sizes pay partial edge blocks and packing tails, so
  a power-of-two grid alone might be biased fast for the odd sizes models use. These rows measure
  that bias; on the 2-core EPYC profile it was not found (reports/validation-cpu.md, held-out
  section), so the lookup does not use them yet (exact hits only).
* Memory-bound sweep: each element-wise, normalisation, pooling, softmax, dropout and loss operator
  on tensors of 4 Ki to 16 Mi elements (×4 steps), forward and backward, so that any model's
  memory-bound layers land between measured sizes.
* Optimizer steps (sgd, momentum, adam; PyTorch's fused kernels) over 2^16 … 2^26 parameters in
  16 tensors, and over each model's own parameter tensors (one per layer with parameters, the
  count dlsim's cost model uses).
* A model at a batch size (`model_tasks`): for every layer, `dlsim.cost.layers.layer_cost` gives
  the GEMMs of linear, attention and recurrent layers (scaled dot-product attention and recurrent layers,
  `WHOLE_KERNEL_OPS`, as their one fused operator, forward and whole backward), the geometry of each convolution (measured
  per pass and per algorithm the library offers) and the memory-bound passes; identical shapes
  are measured once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

from dlsim.cost.layers import Gemm, layer_cost
from dlsim.cost.memory import OPTIMIZERS, optimizer_step_traffic
from dlsim.cost.conv_methods import ConvGeometry
from dlsim.cost.lookup import CHANNELS_LAST, shape_of
from dlsim.cost.pricing import PASSES, WHOLE_KERNEL_OPS
from dlsim.spec.model import ALLOCATED_BYTES, HOST_OPS, INPUT, Layer, Model, build_model
from dlsim.spec.ops import table_op

CONV_ALGORITHMS = {"cpu": ("mkldnn", "native"), "cuda": ("cudnn-default", "cudnn-benchmark", "cudnn-deterministic")}
"""Convolution algorithm choices the library exposes: oneDNN on or off on a CPU
(``torch.backends.mkldnn.enabled``); cuDNN's heuristic choice, its autotuner (``benchmark``) or its
deterministic algorithms on CUDA."""
DEFAULT_CONV_ALGORITHM = {"cpu": "mkldnn", "cuda": "cudnn-default"}
"""What PyTorch runs when nobody changes a flag."""

MEMORY_SWEEP_OPS = ("relu", "gelu", "tanh", "sigmoid", "add", "dropout", "softmax", "layernorm", "batchnorm",
                    "maxpool", "avgpool", "global_avgpool", "lrn", "concat", "cross_entropy")
SWEEP_ELEMENTS = tuple(4**e for e in range(6, 13))  # 4 Ki … 16 Mi per tensor


@dataclass(frozen=True)
class GemmTask:
    dtype: str
    gemm: Gemm
    set: str = "grid"


@dataclass(frozen=True)
class ConvTask:
    dtype: str
    pass_name: str
    algorithm: str
    n: int
    shape: ConvGeometry
    set: str = "model"


@dataclass(frozen=True)
class MemoryTask:
    """One memory-bound pass of `layer` for `batch` samples; `bytes`/`flops` are dlsim's cost of it."""

    dtype: str
    layer: Layer = field(compare=False)
    batch: int
    pass_name: str
    signature: str
    bytes: float
    flops: float
    set: str = "model"

    @property
    def op(self) -> str:
        """The kernel's name in the memory table (`dlsim.spec.ops.table_op`)."""
        return table_op(self.layer.type, self.layer.attrs)


@dataclass(frozen=True)
class OptimizerTask:
    """One optimizer step over parameter tensors of `sizes` elements (fp32 state, as dlsim models it).

    The row is keyed by the parameter count and `key_tensors`, the tensor count dlsim's estimate
    asks for (one per layer with parameters), while the step runs over the real tensors (weights
    and biases apart), whose number sets the per-tensor overhead."""

    optimizer: str
    sizes: tuple[int, ...]
    key_tensors: int
    set: str = "model"
    dtype: str = "fp32"

    @property
    def signature(self) -> str:
        return step_signature(self.optimizer, sum(self.sizes), self.key_tensors)

    @property
    def traffic(self) -> tuple[float, float]:
        """(bytes, FLOPs) of the step in dlsim's cost model."""
        return optimizer_step_traffic(sum(self.sizes), self.optimizer)


Task = GemmTask | ConvTask | MemoryTask | OptimizerTask


def step_signature(optimizer: str, params: int, tensors: int) -> str:
    """The memory-table signature of an optimizer step (op = the optimizer, pass = "step")."""
    return f"{optimizer}|p{params}|t{tensors}"


def _dims(shape: Iterable[int]) -> str:
    return "x".join(str(d) for d in shape)


def signature(layer: Layer, batch: int) -> str:
    """A text key for a memory-bound kernel: type, batch, input shapes and the attributes that change it."""
    attrs = ";".join(f"{k}={_dims(v) if isinstance(v, (list, tuple)) else v}" for k, v in sorted(layer.attrs.items())
                     if k not in ("eps", "affine", HOST_OPS, ALLOCATED_BYTES))
    ins = "+".join(_dims(s) for s in layer.in_shapes)
    return f"{layer.type}|n{batch}|{ins}|{attrs}".replace(",", ";").replace(" ", "")


def model_tasks(model: Model, batch: int, dtype: str, device: str = "cpu", algorithms: Iterable[str] | None = None,
                set_name: str = "model", param_sizes: tuple[int, ...] | None = None) -> list[Task]:
    """Every kernel `model` runs in one training iteration of `batch` samples, deduplicated.

    `param_sizes` are the model's parameter tensors as the framework holds them (default: one
    tensor per layer with parameters)."""
    algos = tuple(algorithms) if algorithms is not None else CONV_ALGORITHMS[device]
    tasks: dict[tuple, Task] = {}
    for layer in model.layers:
        cost = layer_cost(layer, batch, dtype)
        for pass_name in PASSES:
            p = getattr(cost, pass_name)
            if p.kernels == 0 and p.flops == 0 and p.bytes == 0:
                continue
            if layer.type in WHOLE_KERNEL_OPS:  # the fused operator: forward, and its whole backward as ∇x
                if pass_name == "backward_weight":
                    continue
                sig = signature(layer, batch)
                t = MemoryTask(dtype, layer, batch, pass_name, sig, p.bytes, p.flops, set_name)
                tasks.setdefault(("memory", dtype, t.op, pass_name, sig), t)
            elif p.kind == "conv" and cost.conv is not None:
                shape = shape_of(cost.conv)
                for algo in algos:
                    algo += CHANNELS_LAST if cost.conv.get("channels_last") else ""
                    t = ConvTask(dtype, pass_name, algo, batch, shape, set_name)
                    tasks.setdefault(("conv", t), t)
            elif p.gemms:
                for g in p.gemms:
                    tasks.setdefault(("gemm", dtype, g), GemmTask(dtype, g, set_name))
            else:
                sig = signature(layer, batch)
                t = MemoryTask(dtype, layer, batch, pass_name, sig, p.bytes, p.flops, set_name)
                tasks.setdefault(("memory", dtype, t.op, pass_name, sig), t)
    per_layer = tuple(layer.params for layer in model.layers if layer.params)
    sizes = param_sizes if param_sizes and sum(param_sizes) == sum(per_layer) else per_layer
    for opt in OPTIMIZERS if sizes else ():
        tasks.setdefault(("step", opt, sizes), OptimizerTask(opt, sizes, len(per_layer), set_name))
    return list(tasks.values())


def optimizer_sweep(tensors: int = 16, optimizers: Iterable[str] = OPTIMIZERS,
                    params: Iterable[int] = tuple(2**e for e in range(16, 27, 2))) -> list[OptimizerTask]:
    """Optimizer steps over `params` parameters (default 2^16 … 2^26) split into `tensors` tensors."""
    return [OptimizerTask(opt, (n // tensors,) * tensors, tensors, "grid") for opt in optimizers for n in params]


ODD_POINTS = 512
"""How many off-power-of-two GEMM shapes the calibration measures (set "odd")."""


def halton(index: int, base: int) -> float:
    """The `index`-th element (from 1) of the van der Corput sequence in `base`: the radical inverse."""
    f, r = 1.0, 0.0
    while index > 0:
        f /= base
        r += f * (index % base)
        index //= base
    return r


def _off_power_of_two(value: int) -> int:
    """`value`, or `value` + 1 when it is a power of two ≥ 2 (1 stays: a vector product has no edge)."""
    return value + 1 if value >= 2 and value & (value - 1) == 0 else value


def odd_gemms(count: int = ODD_POINTS, max_dim: int = 4096, max_flops: float = 2.0**33) -> list[Gemm]:
    """`count` distinct shapes from the Halton points (bases 2, 3, 5) mapped log-uniformly onto
    [1, max_dim]³, each dimension moved off a power of two, products above `max_flops` skipped
    (see the module docstring). Deterministic, so a rerun resumes the same set."""
    out: list[Gemm] = []
    seen: set[tuple[int, int, int]] = set()
    index = 0
    top = math.log(max_dim)
    while len(out) < count and index < 100 * count:
        index += 1
        dims = tuple(min(_off_power_of_two(int(round(math.exp(halton(index, b) * top)))), max_dim)
                     for b in (2, 3, 5))
        if 2.0 * dims[0] * dims[1] * dims[2] <= max_flops and dims not in seen:
            seen.add(dims)
            out.append(Gemm(*dims))
    return out


def gemm_grid(dtypes: Iterable[str], max_dim: int = 4096, max_flops: float = 2.0**33,
              attention: bool = True, odd: int = ODD_POINTS) -> list[GemmTask]:
    """The GEMM calibration grid (see the module docstring), smallest kernels first, then the
    `odd` off-power-of-two shapes (set "odd"), smallest first."""
    values = [2**e for e in range(0, max_dim.bit_length()) if 2**e <= max_dim]
    extra = sorted(odd_gemms(odd, max_dim, max_flops), key=lambda g: (g.flops, g.m, g.n, g.k)) if odd else []
    out = []
    for dtype in dtypes:
        grid = [Gemm(m, n, k) for m in values for n in values for k in values if 2.0 * m * n * k <= max_flops]
        if attention:
            for steps in (64, 128, 256, 512, 1024):
                grid += [Gemm(steps, steps, 64, 16), Gemm(steps, 64, steps, 16)]
        out += [GemmTask(dtype, g, "grid") for g in sorted(grid, key=lambda g: (g.flops, g.m, g.n, g.k))]
        out += [GemmTask(dtype, g, "odd") for g in extra]
    return out


def square_gemms(dtypes: Iterable[str], sizes: Iterable[int], set_name: str = "grid") -> list[GemmTask]:
    """Square GEMMs n×n×n for each size and data type (a throughput curve by size)."""
    return [GemmTask(dtype, Gemm(n, n, n), set_name) for dtype in dtypes for n in sizes]


def _sweep_layer(op: str, elements: int, dtype: str) -> tuple[Layer, int]:
    """A one-layer model whose `op` layer touches about `elements` elements per input, and its batch."""
    batch = 4
    per = max(elements // batch, 1)
    if op in ("batchnorm", "maxpool", "avgpool", "global_avgpool", "lrn", "concat"):
        side = max(int(round((per / 64) ** 0.5)), 4)
        shape, kind = (64, side, side), "tensor"
    else:
        width = 1024 if op in ("softmax", "layernorm", "rmsnorm", "cross_entropy") else 256
        shape, kind = (max(per // width, 1), width), "tensor"
    extra: dict = {"maxpool": {"kernel": 3, "stride": 2, "padding": 1}, "avgpool": {"kernel": 2, "stride": 2},
                   "dropout": {"p": 0.1}}.get(op, {})
    entries = [{"name": op, "type": op, **extra}]
    if op in ("add", "concat"):
        entries[0]["inputs"] = [INPUT, INPUT]
    model = build_model(f"sweep-{op}", dtype, shape, kind, entries, source="calibration sweep")
    return model.layers[0], batch


def memory_sweep(dtypes: Iterable[str], ops: Iterable[str] = MEMORY_SWEEP_OPS,
                 elements: Iterable[int] = SWEEP_ELEMENTS) -> list[MemoryTask]:
    """Memory-bound kernels over a range of sizes, forward and backward (see the module docstring)."""
    out: list[MemoryTask] = []
    for dtype in dtypes:
        for op in ops:
            for count in elements:
                layer, batch = _sweep_layer(op, count, dtype)
                cost = layer_cost(layer, batch, dtype)
                for pass_name in PASSES:
                    p = getattr(cost, pass_name)
                    if p.kernels == 0 and p.flops == 0 and p.bytes == 0:
                        continue
                    out.append(MemoryTask(dtype, layer, batch, pass_name, signature(layer, batch), p.bytes, p.flops,
                                          "grid"))
    return out


def sdpa_layer(heads: int, steps: int, width: int, dtype: str, causal: bool = True) -> Layer:
    """A scaled dot-product attention over Q, K, V of (heads, steps, width) per sample (dlsim's ``sdpa``)."""
    model = build_model(f"sdpa-{heads}x{steps}x{width}", dtype, (heads, steps, width), "tensor",
                        [{"name": "sdpa", "type": "sdpa", "inputs": [INPUT, INPUT, INPUT], "causal": causal}],
                        source="calibration sweep")
    return model.layers[0]
