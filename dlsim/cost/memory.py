"""Device memory of training: weights, gradients, optimizer state, activations kept for backward.

Per-layer storage in the survey's terms is |w| + |f(o)| + |∇w| + |∇o| (S001 L155). dlsim counts
weights and gradients in the model's data type, the optimizer's state in fp32 (momentum: one copy
of the weights, Adam: two), plus an fp32 master copy of the weights when training in fp16/bf16
(mixed precision, Micikevicius et al. 2018; the ZeRO paper's K = 12 bytes/parameter for Adam,
Rajbhandari et al. SC'20 §3.1). Activations: each layer output that a backward pass needs (because
its consumer saves its input, or its producer saves its output) is counted once, plus the extra
state layers keep (dropout masks, attention probabilities, recurrent gates).
"""

from __future__ import annotations

from dataclasses import dataclass

from dlsim.cost.layers import LayerCost
from dlsim.spec.model import INPUT, Model
from dlsim.units import DTYPE_BYTES

OPTIMIZERS = {"sgd": 0, "momentum": 1, "adam": 2}
"""fp32 state tensors of the size of the weights, per optimizer (S002 Table 3 update rules)."""

# bytes moved and FLOPs per parameter of one optimizer step (fp32 state; read w, g and state, write w and state)
_STEP = {"sgd": (3, 2), "momentum": (5, 4), "adam": (7, 12)}

_UNFUSED_STEP = {"sgd": (3, 1), "momentum": (8, 3), "adam": (21, 8)}
"""(fp32 elements read or written per parameter, element-wise ops) of the unfused step, counted in
pytorch/pytorch@005941e torch/optim/adam.py `_multi_tensor_adam` (mul_ and add_ of exp_avg, mul_
and addcmul_ of exp_avg_sq, sqrt, div_, add of eps, addcdiv_ into the parameters: 2 + 3 + 2 + 4 + 2
+ 2 + 2 + 4 elements, 8 ops) and torch/optim/sgd.py `_multi_tensor_sgd` (momentum: mul_ and add_
of the buffer, add_ into the parameters; plain SGD: the add_ alone). The single-tensor loop runs
the same ops tensor by tensor."""


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter for weights, gradients and optimizer state."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def state_bytes_per_param(dtype: str, optimizer: str, grad_bytes: float | None = None) -> StateBytes:
    """Bytes per parameter: weights in `dtype`, gradients in `dtype` or `grad_bytes` (a gradient
    buffer kept in another dtype, e.g. fp32 for an fp32 reduction); optimizer state (+ fp32 master
    weights for half precision) in fp32."""
    b = DTYPE_BYTES[dtype]
    master = 4 if b < 4 else 0
    return StateBytes(b, b if grad_bytes is None else grad_bytes, 4 * OPTIMIZERS[optimizer] + master)


def optimizer_step_traffic(params: int, optimizer: str, impl: str = "fused") -> tuple[float, float]:
    """(bytes, FLOPs) of one optimizer step over `params` fp32 parameters: one pass over weights,
    gradients and state when fused; with `impl` foreach or for_loop, every op's pass
    (`_UNFUSED_STEP`)."""
    per_bytes, per_flops = _STEP[optimizer]
    if impl != "fused":
        per_bytes = _UNFUSED_STEP[optimizer][0]
    return params * per_bytes * 4.0, params * float(per_flops)


def optimizer_step_kernels(tensor_groups: int, tensors: int, optimizer: str, impl: str = "fused") -> int:
    """Kernel launches of one optimizer step: fused, one per group of tensors (`tensor_groups`,
    multi-tensor apply); foreach, one per op and group; for_loop, one per op and tensor."""
    if impl == "fused":
        return tensor_groups
    ops = _UNFUSED_STEP[optimizer][1]
    return ops * (tensor_groups if impl == "foreach" else max(1, tensors))


def mixed_precision_step_traffic(params: int, dtype: str) -> tuple[float, float]:
    """(bytes, FLOPs) a 16-bit training step adds around the fp32 optimizer step over `params`
    parameters (Micikevicius et al. 2018; Megatron-LM's Float16OptimizerWithFloat16Params.step):
    unscale the fp32 gradients and check them for inf/NaN (read and write 4 bytes), their norm for
    clipping (read 4), copy the updated fp32 master weights into the 16-bit weights (read 4, write
    2) and zero the fp32 gradient buffer (write 4): 20 + b bytes per parameter. Nothing for fp32."""
    b = DTYPE_BYTES[dtype]
    if b >= 4:
        return 0.0, 0.0
    return params * (20.0 + b), params * 3.0


def grad_accumulation_bytes(mode: str, dtype: str, num_microbatches: int) -> float:
    """Bytes per parameter per micro-batch that adding a micro-batch's weight gradient into the
    gradient buffer moves (`dlsim.spec.strategy.GRAD_ACCUMULATIONS`), with b the bytes of a
    training-dtype element:

    * autograd: read the buffer and the new gradient, write the buffer (3b) for every micro-batch
      but the first, whose gradient is kept as it is: 3b (m - 1) / m averaged over m micro-batches;
    * main_grad: 3b for every micro-batch (Megatron-LM's hook adds into a zeroed buffer);
    * main_grad_fp32: read 4 + read b + write 4 for every micro-batch;
    * cast_add_fp32: two kernels for every micro-batch (DeepSpeed's BF16_Optimizer.update_hp_grads,
      microsoft/DeepSpeed@8164ea9 deepspeed/runtime/bf16_optimizer.py:
      ``hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype))``): the cast reads b and writes a
      temporary fp32 tensor (4), the add reads it and the buffer and writes the buffer (3 x 4): b + 16;
    * fused, fused_fp32, none: 0 (inside the weight-gradient GEMM's epilogue, which stays compute-bound;
      or not charged).
    """
    b = DTYPE_BYTES[dtype]
    if mode == "autograd":
        return 3.0 * b * (num_microbatches - 1) / num_microbatches
    if mode == "main_grad":
        return 3.0 * b
    if mode == "main_grad_fp32":
        return 8.0 + b
    if mode == "cast_add_fp32":
        return 16.0 + b
    return 0.0


def activation_bytes(model: Model, costs: dict[str, LayerCost], batch: int, dtype: str) -> dict[str, float]:
    """Bytes each layer keeps alive until its backward pass, for `batch` samples.

    A tensor (a layer's output, or the model input) is kept when its producer saves its output or a
    consumer saves its input; the model input of token models (int ids) is counted in the embedding's
    extra state. Each kept tensor is charged once, to its producer.
    """
    b = DTYPE_BYTES[dtype]
    kept: set[str] = set()
    for layer in model.layers:
        cost = costs[layer.name]
        if cost.saves_output:
            kept.add(layer.name)
        if cost.saves_input:
            kept.update(layer.inputs)
    out = {}
    for layer in model.layers:
        own = layer.out_elements * batch * b if layer.name in kept else 0.0
        out[layer.name] = own + costs[layer.name].extra_saved_bytes
    if INPUT in kept and model.input_kind == "tensor":
        first = model.layers[0].name
        out[first] = out[first] + batch * _prod(model.input_shape) * b
    return out


def _prod(shape: tuple[int, ...]) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


def training_working_set(model: Model, costs: dict[str, LayerCost], batch: int, dtype: str, optimizer: str,
                         kept: dict[str, float] | None = None) -> float:
    """Bytes one training step touches: weights + gradients + optimizer state (`state_bytes_per_param`)
    + the activations kept for backward (`activation_bytes`) + the largest temporary, taken as the
    largest layer output of the batch (while a layer's backward runs, the gradient of its output is
    alive beside the saved tensors). Used to decide whether the step runs from the last-level cache
    (`dlsim.cost.lookup.CacheAwareKernelTimes`)."""
    per = state_bytes_per_param(dtype, optimizer)
    kept = activation_bytes(model, costs, batch, dtype) if kept is None else kept
    temporary = max((layer.out_elements * batch * DTYPE_BYTES[dtype] for layer in model.layers), default=0)
    return model.params * per.total + sum(kept.values()) + temporary
