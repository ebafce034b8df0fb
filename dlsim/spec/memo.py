"""Facts derived from one frozen spec object (a `Model`, a `Device`), computed once per object.

A model of a thousand layers is priced again for every strategy a search weighs and every
prediction a process makes; what depends only on the model (its gradient flow, its cut points, its
layers' shape keys, its FLOPs per sample) need not be derived again. `derived(obj, key, make)`
returns `make()` the first time it is asked for `key` on `obj` and the same value afterwards, for as
long as `obj` lives: keyed by the object's identity (models hold read-only mappings and do not hash),
dropped when the object is collected, so that a new object at the same address never sees them.
Spec objects are frozen, so what is derived from one never goes stale. Values are shared: callers
must not mutate them.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Hashable, TypeVar

T = TypeVar("T")

_FACTS: dict[int, tuple[weakref.ref, dict[Hashable, Any]]] = {}


def _forget(ref: weakref.ref, key: int) -> None:
    got = _FACTS.get(key)
    if got is not None and got[0] is ref:
        del _FACTS[key]


def derived(obj: object, key: Hashable, make: Callable[[], T]) -> T:
    """`make()`, computed once per (`obj`, `key`) while `obj` lives (see the module docstring)."""
    got = _FACTS.get(id(obj))
    if got is None or got[0]() is not obj:
        ref = weakref.ref(obj, lambda r, i=id(obj): _forget(r, i))
        got = _FACTS[id(obj)] = (ref, {})
    facts = got[1]
    if key in facts:
        return facts[key]
    value = facts[key] = make()
    return value
