"""Loading a software stack (YAML) into a `dlsim.spec.stack.Stack`.

A stack file names the framework and its version and gives, per strategy key it sets, the value and
where in the framework's code it was read (units in key names, as in strategy files):

    name: megatron-lm-2022
    version: "55ba1f7 (June 2022)"
    framework: Megatron-LM
    description: Megatron-LM as Korthikanti et al. 2022 ran it
    repositories: ["NVIDIA/Megatron-LM@55ba1f7..."]
    keys:
      fused_kernels: {value: [scale_mask_softmax, bias_dropout_add], source: "NVIDIA/Megatron-LM@55ba1f7 megatron/..."}
      bucket_size_mib: {value: 40, source: "..."}
    notes: ["..."]

Every key needs a source; a key that is not a stack key (`dlsim.spec.stack.STACK_KEYS`) is refused.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dlsim.errors import SpecError, UnitError
from dlsim.io.paths import list_stacks, resolve_stack
from dlsim.io.strategy_yaml import strategy_fields
from dlsim.io.yamlfile import check_keys, expect_mapping, read_yaml
from dlsim.spec.stack import STACK_KEYS, Stack
from dlsim.spec.strategy import make_strategy

_TOP = {"name", "version", "framework", "description", "repositories", "keys", "notes"}
_KEY = {"value", "source"}


def _text(data: dict, key: str, path: Path, required: bool = True) -> str:
    value = data.get(key, "" if not required else None)
    if value is None or (required and value == ""):
        raise SpecError("missing (a stack names its framework and version)", path=path, field=key)
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise SpecError(f"must be text, got {type(value).__name__}", path=path, field=key)
    return str(value)


def parse_stack(data: Any, path: Path) -> Stack:
    """A `Stack` from a parsed stack file (see the module docstring)."""
    data = expect_mapping(data, path, "")
    check_keys(data, _TOP, path, "")
    keys = expect_mapping(data.get("keys") or {}, path, "keys")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, entry in keys.items():
        entry = expect_mapping(entry, path, f"keys.{key}")
        check_keys(entry, _KEY, path, f"keys.{key}")
        if "value" not in entry:
            raise SpecError("missing value", path=path, field=f"keys.{key}")
        source = entry.get("source")
        if not isinstance(source, str) or len(source.strip()) < 10:
            raise SpecError("needs a source (repository, file and commit where the value was read)", path=path,
                            field=f"keys.{key}.source")
        try:
            fields = strategy_fields({key: entry["value"]}, path)
        except SpecError as exc:
            field = exc.field if exc.field and exc.field != key else key
            raise SpecError(exc.reason, path=path, field=f"keys.{field}") from None
        for name in fields:
            if name not in STACK_KEYS:
                raise SpecError(f"does not apply to a stack: a stack sets {', '.join(STACK_KEYS)}", path=path,
                                field=f"keys.{key}")
            values[name] = fields[name]
            sources[name] = source.strip()
    try:  # each value as a strategy would take it (tensor-parallel keys checked with tp 2)
        make_strategy(tp=2, **values)
    except SpecError as exc:
        raise SpecError(exc.reason, path=path, field=f"keys.{exc.field}" if exc.field else "keys") from None
    except (TypeError, UnitError) as exc:
        raise SpecError(str(exc), path=path, field="keys") from None
    repos = data.get("repositories") or []
    notes = data.get("notes") or []
    for name, items in (("repositories", repos), ("notes", notes)):
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise SpecError("must be a list of text lines", path=path, field=name)
    return Stack(_text(data, "name", path), _text(data, "version", path), _text(data, "framework", path),
                 _text(data, "description", path, required=False), MappingProxyType(values),
                 MappingProxyType(sources), tuple(repos), tuple(notes), str(path))


@lru_cache(maxsize=64)
def _load(path: str, mtime_ns: int) -> Stack:
    return parse_stack(read_yaml(Path(path)), Path(path))


def load_stack(name_or_path: str | Path) -> Stack:
    """A stack by name (``stacks/<name>.yaml``, or $DLSIM_STACKS) or from a YAML file."""
    path = resolve_stack(name_or_path)
    try:
        mtime = path.stat().st_mtime_ns
    except OSError as exc:
        raise SpecError(f"cannot read stack file ({exc.strerror or exc})", path=path) from None
    return _load(str(path), mtime)


def all_stacks() -> list[Stack]:
    """Every stack on the search path, by name."""
    return [load_stack(p) for p in list_stacks()]
