"""Which repeated-block instance each layer of a model belongs to: the "layer" of full
recomputation (`dlsim.plan.recompute`) and of torchtitan's checkpointing policies
(`dlsim.plan.oprecompute`)."""

from __future__ import annotations

import re

from dlsim.spec.memo import derived
from dlsim.spec.model import Model

_INSTANCE = re.compile(r"^(.*?\.\d+)\.")


def recompute_layers(model: Model) -> dict[str, str | None]:
    """The "layer" of full recomputation each model layer belongs to: the repeated-block instance
    ("h.3" for "h.3.attn"; None outside blocks), or, in a model without repeated blocks, the
    layer itself (once per model: `dlsim.spec.memo`)."""
    return derived(model, "recompute_layers", lambda: _recompute_layers(model))


def block_instance(name: str) -> str | None:
    """The repeated-block instance a layer named `name` belongs to ("h.3" for "h.3.attn"; None outside
    blocks)."""
    m = _INSTANCE.match(name)
    return m.group(1) if m else None


def _recompute_layers(model: Model) -> dict[str, str | None]:
    found = {layer.name: block_instance(layer.name) for layer in model.layers}
    if not any(found.values()):
        return {name: name for name in found}
    return found
