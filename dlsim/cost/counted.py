"""FLOPs of a training step as PyTorch's FLOP counter counts them.

`torch.utils.flop_counter.FlopCounterMode` counts matrix-class work only: matrix products,
convolutions and attention (2 FLOPs per multiply-accumulate); element-wise kernels count zero.
`counted_flops` adds up the same for a dlsim model: the GEMMs of each pass (a generic layer's
measured FLOPs, which are the counter's own), the backward less the ∇x work autograd skips for inputs
that need no gradient (`dlsim.cost.gradflow.backward_data_run`) and less the layers it never visits
(`dlsim.cost.gradflow.unreached_by_loss`).
"""

from __future__ import annotations

from dlsim.cost.gradflow import backward_data_run, gradient_free, unreached_by_loss
from dlsim.cost.layers import PassCost, layer_cost
from dlsim.spec.model import Model


def _matrix(cost: PassCost) -> float:
    return cost.flops if cost.kind == "generic" else cost.matmul_flops


def counted_flops(model: Model, batch: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of one training step of `batch` samples, as PyTorch's counter counts them."""
    free, unreached = gradient_free(model), unreached_by_loss(model)
    forward = backward = 0.0
    for layer in model.layers:
        cost = layer_cost(layer, batch, model.dtype)
        forward += _matrix(cost.forward)
        if layer.name in unreached:
            continue
        backward += _matrix(backward_data_run(layer, cost, free))
        backward += _matrix(cost.backward_weight)
    return forward, backward
