"""Importing networks written in PyTorch as dlsim descriptions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import yaml

from dlsim.errors import SpecError
from dlsim.io.files import write_atomic


def load_factory(spec: str) -> Any:
    """Call ``FILE.py:NAME`` (or ``package.module:NAME``) and return the `nn.Module` it builds."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise SpecError(f"expected FILE.py:NAME or module:NAME, got {spec!r}")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise SpecError("no such file", path=target)
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
            sys.modules.setdefault(path.stem, module)
            module_spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            module = importlib.import_module(target)
    except SpecError:
        raise
    except Exception as exc:
        raise SpecError(f"cannot import: {type(exc).__name__}: {exc}".splitlines()[0], path=target) from None
    if not hasattr(module, attr):
        raise SpecError(f"has no attribute {attr!r}", path=target)
    obj = getattr(module, attr)
    import torch

    if isinstance(obj, torch.nn.Module):
        return obj
    built = obj()
    if not isinstance(built, torch.nn.Module):
        raise SpecError(f"{attr} did not give a torch.nn.Module", path=target)
    return built


def to_yaml(description: dict) -> str:
    """YAML text with one line per layer (flow style), as the zoo files are written."""
    head = {k: v for k, v in description.items() if k != "layers"}
    text = yaml.safe_dump(head, sort_keys=False, default_flow_style=None)
    lines = ["layers:"]
    for layer in description["layers"]:
        lines.append("  - " + yaml.safe_dump(layer, sort_keys=False, default_flow_style=True, width=10**6).strip())
    return text + "\n".join(lines) + "\n"


def import_torch(factory: str, input_shape: list[int], *, batch: int = 2, tokens: bool = False,
                 name: str | None = None, out: Path | None = None, force: bool = False) -> str:
    """Trace the module built by `factory` on a random input of (batch, *input_shape); return YAML text
    (and write it to `out`, never overwriting an existing file unless `force`)."""
    try:
        import torch
    except ModuleNotFoundError:
        raise SpecError("importing from PyTorch needs torch (pip install torch)") from None
    from dlsim.importers.torch_fx import import_torch_module

    if out is not None and Path(out).exists() and not force:
        raise SpecError("exists; pass --force to overwrite it", path=out)
    module = load_factory(factory).eval()
    shape = (batch, *input_shape)
    example = torch.randint(0, 2, shape) if tokens else torch.randn(shape)
    description = import_torch_module(module, example, name or factory.rpartition(":")[2])
    text = to_yaml(description)
    if out is not None:
        write_atomic(Path(out), text)
    return text
