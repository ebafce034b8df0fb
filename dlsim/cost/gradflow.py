"""Which tensors of a training step need no gradient.

Autograd computes a gradient only for a tensor that is computed from a parameter (PyTorch's
``requires_grad`` propagation): the model input needs none, and neither does the output of a layer
without parameters (own or tied) whose inputs all need none. A layer whose inputs all need no
gradient runs no ∇x pass.
"""

from __future__ import annotations

from dlsim.spec.model import INPUT, Model


def gradient_free(model: Model) -> frozenset[str]:
    """Names of the tensors (``input`` and layer outputs) of `model` that need no gradient."""
    free = {INPUT}
    for layer in model.layers:
        if not layer.params and not layer.attrs.get("tied_to") and all(src in free for src in layer.inputs):
            free.add(layer.name)
    return frozenset(free)
