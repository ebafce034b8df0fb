"""Which strategy fields tell compared strategies apart, and how a field's value reads in a label."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

SHOWN_FIELDS = ("dp", "tp", "pp", "microbatch_size", "num_microbatches", "global_batch", "schedule", "sync")
"""Strategy fields a comparison shows in columns of their own."""
_NOT_CHOICES = {"variability", "compression", "stage_partition", "layer_groups"}


def varying_fields(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The strategy fields whose values differ among the compared entries (beyond `SHOWN_FIELDS`):
    what tells apart strategies that share a shape (recomputation, ZeRO, sequence parallelism,
    virtual stages, fused kernels, the stack, ...)."""
    values: dict[str, set] = {}
    for e in entries:
        for k, v in (e.get("strategy") or {}).items():
            if k not in SHOWN_FIELDS and k not in _NOT_CHOICES:
                values.setdefault(k, set()).add(json.dumps(v, sort_keys=True))
    return [k for k, vs in values.items() if len(vs) > 1]


def field_text(value: Any) -> str:
    if isinstance(value, list):
        return "+".join(map(str, value)) or "none"
    return str(value)
