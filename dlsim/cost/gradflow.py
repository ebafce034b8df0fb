"""Which tensors of a training step need no gradient, and which layers the backward never visits.

Autograd computes a gradient only for a tensor that is computed from a parameter (PyTorch's
``requires_grad`` propagation): the model input needs none, and neither does the output of a layer
without parameters (own or tied) whose inputs all need none. A layer whose inputs all need no
gradient runs no ∇x pass.

The backward starts at the losses, the model's output (its last layer) and every other layer with a
scalar output (an auxiliary loss, such as GoogLeNet's side classifiers, is added to the one the step
differentiates), and walks the graph towards the inputs: a layer from whose output no path leads there
(a branch computed and then dropped, such as the residual output of a WaveNet's last layer) is never
visited and runs no backward pass at all, ∇x or ∇w (its weights' ``.grad`` stays None).
"""

from __future__ import annotations

from dataclasses import dataclass

from dlsim.cost.layers import LayerCost, PassCost
from dlsim.spec.memo import derived
from dlsim.spec.model import INPUT, Layer, Model


@dataclass(frozen=True)
class GradientFlow:
    """What a training step's backward runs: `free` the tensors that need no gradient (`gradient_free`),
    `unreached` the layers it never visits (`unreached_by_loss`)."""

    free: frozenset[str]
    unreached: frozenset[str]

    @classmethod
    def of(cls, model: Model) -> GradientFlow:
        """The flow of `model` (once per model: `dlsim.spec.memo`)."""
        return derived(model, "gradient_flow", lambda: cls(gradient_free(model), unreached_by_loss(model)))


def gradient_free(model: Model) -> frozenset[str]:
    """Names of the tensors (``input`` and layer outputs) of `model` that need no gradient."""
    free = {INPUT}
    for layer in model.layers:
        if not layer.params and not layer.attrs.get("tied_to") and all(src in free for src in layer.inputs):
            free.add(layer.name)
    return frozenset(free)


def unreached_by_loss(model: Model) -> frozenset[str]:
    """Names of the layers of `model` whose output no path carries to a loss (its last layer, or any layer
    with a scalar output)."""
    if not model.layers:
        return frozenset()
    reached = {model.layers[-1].name} | {layer.name for layer in model.layers if tuple(layer.out_shape) == ()}
    for layer in reversed(model.layers):
        if layer.name in reached:
            reached.update(layer.inputs)
    return frozenset(layer.name for layer in model.layers if layer.name not in reached)


def backward_data_run(layer: Layer, cost: LayerCost, free: frozenset[str]) -> PassCost:
    """The part of `layer`'s ∇x pass autograd runs, given the tensors that need no gradient (`free`): all of
    it when every input needs one; when some do not, the per-input parts of those that do (where the layer
    splits its ∇x by input) or all of it; when none does, only what the layer's weights need."""
    needs = [src not in free for src in layer.inputs]
    if all(needs):
        return cost.backward_data
    if not any(needs):
        return cost.internal_backward
    parts = [part for part, need in zip(cost.input_backward, needs) if need]
    return parts[0] if len(parts) == 1 and len(cost.input_backward) == len(needs) else cost.backward_data
