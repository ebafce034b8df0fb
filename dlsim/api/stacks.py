"""Which software stack a run uses, and the strategy fields it sets (`dlsim.spec.stack`).

The stack is, in order: the one the caller names (``stack=`` / ``--stack`` / a strategy file's
``stack:``), the one the model names (the zoo's large models name the stack they were trained
with), else `DEFAULT_STACK`, a modern PyTorch stack (flash attention through SDPA, fused AdamW,
bf16 autocast where the device has bf16). The stack fills every stack key the caller did not set;
a record names the stack, where it came from, the keys it set and the keys the caller overrode.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

from dlsim.io.stack_yaml import load_stack
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.spec.stack import RECORD_NAMES, STACK_KEYS, Stack, device_dtype, stack_fields
from dlsim.spec.strategy import Strategy

DEFAULT_STACK = "pytorch"
"""The stack of a model that names none: eager PyTorch 2 as its documentation recommends for
training (stacks/pytorch.yaml)."""


def choose_stack(name: str | None, model: Model, load: Callable[[str], Stack] = load_stack) -> tuple[Stack, str]:
    """(the stack, why it was chosen: ``given``, ``the model's`` or ``default``), read by `load`
    (`load_stack`, or a caller's kept stacks: `dlsim.api.simulate.Builders.stack`)."""
    if name:
        return load(name), "given"
    if model.stack:
        return load(model.stack), "the model's"
    return load(DEFAULT_STACK), "default"


def apply_stack(stack: Stack, fields: Mapping[str, Any], given: Iterable[str], model: Model,
                cluster: Cluster) -> dict[str, Any]:
    """`fields` with the stack's value of every stack key not in `given`, and ``stack`` set to its
    name. The stack's dtype becomes the device's closest precision (`device_dtype`); where the
    device has neither 16-bit type the model's dtype stays."""
    given = set(given) | set(fields)
    tp = fields.get("tp", 1)
    dtype = None
    if "dtype" in stack.values and "dtype" not in given:
        dtype = device_dtype(stack.values["dtype"], cluster.device.peak_flops)
    sp = fields.get("sequence_parallel") if "sequence_parallel" in given else None
    out = {**stack_fields(stack, given, tp if isinstance(tp, int) else 1, dtype,
                          sp if isinstance(sp, bool) else None, _zero1(stack, fields, given)), **fields}
    out["stack"] = stack.name
    return out


def _zero1(stack: Stack, fields: Mapping[str, Any], given: set[str]) -> bool | None:
    """Whether the strategy runs ZeRO-1 without hybrid sharding, where the caller set `zero` or
    `hybrid_shard` (a searched `zero`, named in `given` without a value, runs other stages: False);
    None where it set neither (the stack's zero decides)."""
    if "zero" not in given and "hybrid_shard" not in given:
        return None
    zero = fields["zero"] if "zero" in fields else (None if "zero" in given else stack.values.get("zero", 0))
    return zero == 1 and fields.get("hybrid_shard") is not True


def stack_record(stack: Stack, why: str, given: Iterable[str]) -> dict[str, Any]:
    """What a record says of its stack: name, version, framework, why it was chosen, the keys it
    set and those the caller overrode."""
    given = set(given)
    rec = stack.to_dict()
    rec["chosen"] = why
    rec["overridden"] = sorted(RECORD_NAMES.get(k, k) for k in stack.values if k in given)
    return rec


_UNSET = {"dtype": "the model's", "grad_reduce_dtype": "the training dtype"}


def unset_value(key: str) -> Any:
    """What a strategy runs for stack key `key` when its stack does not set it: the `Strategy`
    default (the model's dtype for ``dtype``, the training dtype for ``grad_reduce_dtype``)."""
    if key in _UNSET:
        return _UNSET[key]
    f = next(f for f in dataclasses.fields(Strategy) if f.name == key)
    value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    return list(value) if isinstance(value, tuple) else value


def stack_diff(a: Stack, b: Stack) -> dict[str, Any]:
    """Where stacks `a` and `b` differ, key by key (`STACK_KEYS` order): each side's value (or, for a
    key one of them leaves unset, what a strategy then runs: `unset_value`) and the source it was read
    from; and the keys on which they agree."""
    def value(s: Stack, key: str) -> Any:
        v = s.values[key] if key in s.values else unset_value(key)
        return list(v) if isinstance(v, tuple) else v

    differ, same = [], {}
    for key in (k for k in STACK_KEYS if k in a.values or k in b.values):
        va, vb, name = value(a, key), value(b, key), RECORD_NAMES.get(key, key)
        if va == vb:
            same[name] = va
            continue
        differ.append({"key": name, "a": va, "b": vb,
                       "a_source": a.sources.get(key, "not set by the stack: the strategy's default"),
                       "b_source": b.sources.get(key, "not set by the stack: the strategy's default")})
    side = ("name", "version", "framework")
    return {"kind": "stack_diff", "a": {k: getattr(a, k) for k in side}, "b": {k: getattr(b, k) for k in side},
            "differ": differ, "same": same}
