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

Every key needs a source; a key that is not a stack key (`dlsim.spec.stack.STACK_KEYS`) is refused. The
keys are declared once, as the typed record `StackFile` (JSON Schema ``dlsim/schemas/stack.schema.json``),
each value typed as a strategy file types it.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, create_model

from dlsim.errors import SpecError, UnitError
from dlsim.io.paths import list_stacks, resolve_stack
from dlsim.io.strategy_yaml import _SIZES, StrategyFile, strategy_fields
from dlsim.io.yamlfile import read_yaml
from dlsim.spec.stack import STACK_KEYS, Stack
from dlsim.spec.strategy import make_strategy
from dlsim.spec.typed import Record, Seq, Text, validate


def _as_text(value: Any) -> Any:
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


Label = Annotated[str, BeforeValidator(_as_text), Field(min_length=1, max_length=4096, pattern=r"\S")]
"""A name, a version or a framework: text (a number is read as its text), not blank."""
Source = Annotated[str, Field(min_length=10, max_length=4096, description=(
    "where the value was read: repository, file and commit (at least 10 characters)"))]


def _key(name: str) -> Any:
    """A stack key of the file: {value, source}, the value typed as a strategy file types it."""
    value = StrategyFile.model_fields[name]
    return create_model(f"StackKey_{name}", __base__=Record,
                        value=(value.rebuild_annotation(), Field(description=value.description)), source=(Source, ...))


_FILE_KEYS = [k for k in StrategyFile.model_fields if _SIZES.get(k, (k,))[0] in STACK_KEYS]
StackKeys = create_model("StackKeys", __base__=Record, __doc__="The strategy keys a stack sets (`STACK_KEYS`).",
                         **{k: (_key(k) | None, None) for k in _FILE_KEYS})


class StackFile(Record):
    """A software stack file (see the module docstring)."""

    name: Label
    version: Label
    framework: Label
    description: Annotated[str, BeforeValidator(_as_text)] = ""
    repositories: Seq[Text] = ()
    keys: StackKeys | None = None  # type: ignore[valid-type]
    notes: Seq[Text] = ()


def parse_stack(data: Any, path: Path) -> Stack:
    """A `Stack` from a parsed stack file (see the module docstring)."""
    rec = validate(StackFile, data, path)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key in data.get("keys") or {}:  # in the file's order
        entry = getattr(rec.keys, key)
        if entry is None:
            continue
        for name, value in strategy_fields({key: data["keys"][key]["value"]}, path).items():
            values[name], sources[name] = value, entry.source.strip()
    try:  # each value as a strategy would take it (tensor-parallel keys checked with tp 2)
        make_strategy(tp=2, **values)
    except SpecError as exc:
        raise SpecError(exc.reason, path=path, field=f"keys.{exc.field}" if exc.field else "keys") from None
    except (TypeError, UnitError) as exc:
        raise SpecError(str(exc), path=path, field="keys") from None
    return Stack(rec.name, rec.version, rec.framework, rec.description, MappingProxyType(values),
                 MappingProxyType(sources), rec.repositories, rec.notes, str(path))


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
