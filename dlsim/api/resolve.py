"""A run's strategy from what its caller gave: a `Strategy`, a strategy file or fields, completed by
the software stack (`dlsim.api.stacks`), checked against its mode (`dlsim.api.modes`); and what the
run assumed because nobody gave it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from dlsim.api.modes import ALLREDUCE_ONLY, PS_ONLY, check_mode_fields
from dlsim.api.stacks import apply_stack, choose_stack, stack_record
from dlsim.io.stack_yaml import load_stack
from dlsim.io.strategy_yaml import load_strategy
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.spec.stack import RECORD_NAMES, STACK_KEYS, Stack
from dlsim.spec.strategy import PIPELINED_MICROBATCH, Strategy, make_strategy, validate_strategy


@dataclass(frozen=True)
class Resolved:
    """A run's strategy, the names of the fields its caller set (None: a whole `Strategy` object,
    every field given), the record of its stack (None: none applied) and the strategy fields that
    stack sets."""

    strategy: Strategy
    names: set[str] | None
    stack_record: dict[str, Any] | None
    stack_keys: frozenset[str] = frozenset()


def resolve_strategy(strategy: Strategy | str | Path | None, fields: Mapping[str, Any], given: Iterable[str],
                     model: Model, cluster: Cluster, stacks: Callable[[str], Stack] = load_stack) -> Resolved:
    """The strategy from a Strategy (fields replace its values; its stack, if it names one, is
    recorded, not applied again), a YAML path or fields alone, completed by the stack.

    Fields the strategy's mode would ignore are refused (`dlsim.api.modes`): those in `fields`, those
    a strategy file sets, those named in `given` (e.g. ``jitter_cv``, ``compression.density``); a
    stack's values are not the caller's and never refused. `stacks` reads a stack by name (`load_stack`,
    or a caller's kept stacks)."""
    names = set(fields) | set(given)
    if isinstance(strategy, Strategy):
        s = validate_strategy(replace(strategy, **fields)) if fields else strategy
        stack = load_stack(s.stack) if s.stack else None
        record = stack_record(stack, "given", STACK_KEYS) if stack else None
        return Resolved(check_mode_fields(s, names), None, record, frozenset(stack.values) if stack else frozenset())
    chosen: list = []

    def complete(merged: dict[str, Any], set_names: set[str]) -> dict[str, Any]:
        stack, why = choose_stack(merged.get("stack") or None, model, stacks)
        chosen.append((stack_record(stack, why, set_names), frozenset(stack.values)))
        return apply_stack(stack, merged, set_names, model, cluster)

    if strategy is not None:
        s = load_strategy(strategy, dict(fields), names, complete)
    else:
        s = make_strategy(**complete(dict(fields), set(names)))
    return Resolved(check_mode_fields(s, names), names, *chosen[-1])


def as_strategy(strategy: Strategy | str | Path | None, fields: Mapping[str, Any], given: Iterable[str] = (),
                model: Model | None = None, cluster: Cluster | None = None) -> Strategy:
    """`resolve_strategy`'s strategy; without a model and a cluster, no stack is applied (the
    strategy as given, every other field at its dataclass default)."""
    if model is not None and cluster is not None:
        return resolve_strategy(strategy, fields, given, model, cluster).strategy
    names = set(fields) | set(given)
    if isinstance(strategy, Strategy):
        s = validate_strategy(replace(strategy, **fields)) if fields else strategy
    elif strategy is not None:
        s = load_strategy(strategy, dict(fields), names)
    else:
        s = make_strategy(**fields)
    return check_mode_fields(s, names)


def assumed_fields(s: Strategy, given: set[str] | None, dtype: str,
                   stack_keys: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The strategy values dlsim filled in because neither the caller nor the stack (which set
    `stack_keys`) gave them (record names), the dtype when it is the model's. A whole `Strategy`
    object counts as given (but its dtype)."""
    out: dict[str, Any] = {}
    if s.dtype is None:
        out["dtype"] = dtype
    if given is None:
        return out
    record = s.to_dict()
    derived = {"global_batch", "stack"} | ({"microbatch_size", "num_microbatches"} if "global_batch" in given else set())
    # defaults of another mode are not assumptions of this run
    derived |= set(PS_ONLY) | {"staleness"} if s.sync == "allreduce" else set(ALLREDUCE_ONLY) | {"compression"}
    if s.sync != "ssp":
        derived.add("staleness")
    derived |= stack_keys  # the stack's keys come from the stack, named in the record's `stack`
    if "global_batch" in given and not {"microbatch_size", "num_microbatches"} & given and s.pp > 1:
        out["microbatch_size"] = (f"{s.microbatch_size}: a pipelined strategy given only its global batch runs "
                                  f"micro-batches of {PIPELINED_MICROBATCH} sample (Megatron-LM's examples)")
    for name in Strategy.__dataclass_fields__:
        key = RECORD_NAMES.get(name, name)
        if name in given or name in derived or name == "dtype" or key not in record:
            continue
        if name in ("compression", "variability") and (
                any(g.startswith("compression.") for g in given) if name == "compression"
                else given & {"jitter", "jitter_cv", "straggler_fraction", "straggler_slowdown", "seed"}):
            continue
        out[key] = record[key]
    return out
