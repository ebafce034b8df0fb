"""Where built-in models and hardware profiles live, and how names resolve to files."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from dlsim.errors import SpecError

_PACKAGE = Path(__file__).resolve().parents[1]


@cache
def data_root() -> Path:
    """Where the built-in zoo and profiles are: ``dlsim/_data`` in an installed wheel, else the checkout
    (looked up once: an installation does not move under a running process)."""
    packaged = _PACKAGE / "_data"
    return packaged if (packaged / "models").is_dir() else _PACKAGE.parent


def model_dirs() -> list[Path]:
    """Directories searched for zoo models: $DLSIM_MODELS (colon-separated), then the built-in zoo."""
    extra = [Path(p) for p in os.environ.get("DLSIM_MODELS", "").split(os.pathsep) if p]
    return extra + [data_root() / "models"]


def profile_dirs() -> list[Path]:
    """Directories searched for hardware profiles: $DLSIM_PROFILES, then the built-in ones."""
    extra = [Path(p) for p in os.environ.get("DLSIM_PROFILES", "").split(os.pathsep) if p]
    return extra + [data_root() / "hardware_profiles"]


def stack_dirs() -> list[Path]:
    """Directories searched for software stacks: $DLSIM_STACKS (colon-separated), then the built-in ones."""
    extra = [Path(p) for p in os.environ.get("DLSIM_STACKS", "").split(os.pathsep) if p]
    return extra + [data_root() / "stacks"]


def list_stacks() -> list[Path]:
    """All stack files, first directory wins on a name clash."""
    return _yaml_files(stack_dirs())


def _yaml_files(dirs: list[Path]) -> list[Path]:
    """The YAML files of `dirs` by name, the first directory winning a name clash."""
    seen: dict[str, Path] = {}
    for d in dirs:
        for p in sorted(d.glob("*.yaml")) if d.is_dir() else []:
            seen.setdefault(p.stem, p)
    return sorted(seen.values(), key=lambda p: p.stem)


def resolve_stack(name_or_path: str | Path) -> Path:
    """A stack file from a name (``megatron-core``) or a path to a YAML file."""
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or os.sep in text:
        if Path(text).is_file():
            return Path(text)
        raise SpecError("no such stack file", path=text)
    for d in stack_dirs():
        c = d / f"{text}.yaml"
        if c.is_file():
            return c
    known = ", ".join(p.stem for p in list_stacks())
    raise SpecError(f"unknown stack {text!r} (known: {known}; or a stack YAML file)", field="stack")


def list_models() -> list[Path]:
    """All zoo model files, first directory wins on a name clash."""
    return _yaml_files(model_dirs())


def list_profiles() -> list[Path]:
    """All profile directories (those holding a profile.yaml)."""
    seen: dict[str, Path] = {}
    for d in profile_dirs():
        for p in sorted(d.glob("*/profile.yaml")) if d.is_dir() else []:
            seen.setdefault(p.parent.name, p.parent)
    return sorted(seen.values(), key=lambda p: p.name)


def resolve_model(name_or_path: str | Path, relative_to: Path | None = None) -> Path:
    """A model file from a zoo name (``resnet50``) or a path to a YAML file."""
    text = str(name_or_path)
    candidates = [Path(text)]
    if relative_to is not None:
        candidates.insert(0, relative_to / text)
        candidates.insert(1, relative_to / f"{text}.yaml")
    for c in candidates:
        if c.is_file():
            return c
    for d in model_dirs():
        c = d / f"{text}.yaml"
        if c.is_file():
            return c
    known = ", ".join(p.stem for p in list_models())
    raise SpecError(f"no such model file or zoo model (zoo: {known})", path=text)


def resolve_profile(name_or_path: str | Path) -> Path:
    """A profile directory from a built-in name (``dgx-h100``), a directory, or a profile.yaml path."""
    p = Path(name_or_path)
    if p.is_file() and p.name.endswith((".yaml", ".yml")):
        return p.parent if p.name == "profile.yaml" else p
    if (p / "profile.yaml").is_file():
        return p
    for d in profile_dirs():
        if (d / str(name_or_path) / "profile.yaml").is_file():
            return d / str(name_or_path)
    known = ", ".join(q.name for q in list_profiles())
    raise SpecError(f"no such profile directory or built-in profile (built-in: {known})", path=str(name_or_path))
