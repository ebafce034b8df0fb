"""Importing networks written in PyTorch or ONNX as dlsim descriptions.

`import_torch(module, example_inputs)` captures a module at the operator level with torch.export
(`dlsim.importers.torch_export`) and returns the `Model` its YAML description loads into;
`import_torch_module` returns the whole record (description, YAML text, model, fallback report);
`import_torch_file` is what ``dlsim import torch FILE.py:FACTORY`` runs, `import_onnx_file` what
``dlsim import onnx FILE.onnx`` runs. Every import is written as YAML and read back through dlsim's
own loader, so what a user gets on disk is exactly what was checked.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from dlsim.errors import SpecError, excerpt
from dlsim.plain_loop import float_dtype_of, make_batch
from dlsim.io.files import check_output, write_atomic
from dlsim.io.runfiles import note_input, run_scope
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model

DEFAULT_REPORT_CLUSTER = "cpu-epyc-2core"
"""The profile the fallback report prices the imported network on when none is given."""


def _what_it_did(exc: BaseException) -> str:
    """What a factory's exception or exit did, in a few words (the first line of its message)."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({excerpt(exc.code, 40)})"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"raised {type(exc).__name__}" + (f": {text[:120]}" if text else "")


def _source_files(before: set[str], root: Path) -> list[Path]:
    """Files of the modules loaded since `before` that live under `root` (a factory's own helpers)."""
    found = []
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if name in before or not where:
            continue
        try:
            if Path(where).resolve().is_relative_to(root):
                found.append(Path(where))
        except (OSError, ValueError):
            continue
    return found


def load_factory(spec: str) -> Any:
    """Call ``FILE.py:NAME`` (or ``package.module:NAME``) and return the `nn.Module` it builds. Its
    source file (and the modules beside it that it imports) are inputs of the run (`note_input`).
    A factory, or its module, that raises or calls ``sys.exit`` is one `SpecError` line naming it and
    what it did."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise SpecError(f"expected FILE.py:NAME or module:NAME, got {excerpt(spec)}")
    before = set(sys.modules)
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise SpecError("no such file", path=target)
            note_input(path, "the factory's source")
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
            sys.modules.setdefault(path.stem, module)
            module_spec.loader.exec_module(module)  # type: ignore[union-attr]
            for helper in _source_files(before, path.resolve().parent):
                note_input(helper, "a module the factory imports")
        else:
            module = importlib.import_module(target)
    except (SpecError, KeyboardInterrupt):
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001  (the user's module: whatever it does is reported)
        raise SpecError(f"importing it {_what_it_did(exc)}", path=target) from None
    if not hasattr(module, attr):
        raise SpecError(f"has no attribute {excerpt(attr)}", path=target)
    obj = getattr(module, attr)
    import torch

    if isinstance(obj, torch.nn.Module):
        return obj
    if not callable(obj):
        raise SpecError(f"{excerpt(attr)} is neither a torch.nn.Module nor a function returning one", path=target)
    try:
        built = obj()
    except KeyboardInterrupt:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        raise SpecError(f"the factory {attr[:40]}() {_what_it_did(exc)}", path=target) from None
    if not isinstance(built, torch.nn.Module):
        raise SpecError(f"{attr} did not give a torch.nn.Module", path=target)
    return built


@dataclass(frozen=True)
class FallbackRow:
    """One source operator that became a ``generic`` layer: how many layers, their share of the time."""

    op: str
    layers: int
    seconds: float
    share: float


@dataclass(frozen=True)
class Imported:
    """An imported network: its description, YAML text and loaded model, and what fell back."""

    description: dict
    text: str
    model: Model
    source_params: int
    fallbacks: tuple[FallbackRow, ...]
    fallback_share: float
    priced_on: str
    batch: int
    notes: tuple[str, ...] = ()

    def report(self) -> str:
        """Lines for the user: layers, parameters, and the operators priced as generic."""
        from dlsim.cost.counted import counted_flops

        generic = sum(r.layers for r in self.fallbacks)
        fwd, bwd = counted_flops(self.model, 1)
        lines = [f"imported {self.model.name}: {len(self.model.layers)} layers, {self.model.params:,} parameters, "
                 f"{fwd:.4g} forward and {bwd:.4g} backward FLOPs per sample (as PyTorch's counter counts them); "
                 f"{generic} generic layer{' carries' if generic == 1 else 's carry'} {100 * self.fallback_share:.1f}% of the "
                 f"predicted step "
                 f"(batch {self.batch} on {self.priced_on})"]
        for r in self.fallbacks:
            lines.append(f"  generic {r.op}: {r.layers} layer{'s' if r.layers != 1 else ''}, "
                         f"{100 * r.share:.1f}% of the time")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def _load_text(text: str, name: str) -> Model:
    from dlsim.io.model_yaml import load_model

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.yaml"
        path.write_text(text)
        model = load_model(path)
    return replace(model, source="")


def _fallback_report(model: Model, cluster: Cluster | str | Path | None, batch: int) -> tuple[tuple[FallbackRow, ...], float, str]:
    from dlsim.api.estimate import estimate

    result = estimate(model, cluster if cluster is not None else DEFAULT_REPORT_CLUSTER, batch, optimizer="sgd")
    total = sum(t.total_seconds for t in result.layers) or 1.0
    rows: dict[str, list[float]] = {}
    for t in result.layers:
        layer = model.layer(t.name)
        if layer.type == "generic":
            row = rows.setdefault(str(layer.attrs["op"]), [0, 0.0])
            row[0] += 1
            row[1] += t.total_seconds
    out = tuple(sorted((FallbackRow(op, int(n), s, s / total) for op, (n, s) in rows.items()),
                       key=lambda r: (-r.seconds, r.op)))
    return out, sum(r.seconds for r in out) / total, result.cluster


def finish_import(description: dict, header: str, source_params: int, batch: int,
                  cluster: Cluster | str | Path | None, notes: Sequence[str] = ()) -> Imported:
    """Write the description as YAML, load it back with dlsim's loader, check its parameters, price it."""
    from dlsim.importers.graph import to_yaml

    text = to_yaml(description, header)
    model = _load_text(text, description["name"])
    if model.params != source_params:
        raise SpecError(f"the imported description holds {model.params:,} parameters, the source "
                        f"{source_params:,} (an operator's weights were not attributed)")
    fallbacks, share, priced_on = _fallback_report(model, cluster, batch)
    return Imported(description, text, model, source_params, fallbacks, share, priced_on, batch, tuple(notes))


def import_torch_module(module: Any, example_inputs: Sequence[Any], *, name: str = "imported",
                        cluster: Cluster | str | Path | None = None, header: str = "") -> Imported:
    """Capture `module` on `example_inputs` (one batch-first tensor, batch >= 2) with torch.export and
    map it onto dlsim operators; the record holds the description, its YAML and the loaded model."""
    from dlsim.importers.graph import assemble
    from dlsim.importers.torch_export import capture

    captured = capture(module, tuple(example_inputs))
    description = assemble(name, captured.dtype, captured.input_entry, captured.nodes)
    notes = [] if captured.dynamic else ["the batch dimension was specialised by torch.export; per-sample "
                                         "shapes were taken as dimension 0"]
    if captured.unmeasured:
        notes.append(f"could not re-run alone, priced by their tensors' sizes: {', '.join(sorted(set(captured.unmeasured)))}")
    if captured.folded:
        notes.append(f"{captured.folded} operators on weights or constants only folded into their consumers")
    head = header or f"{name}: captured with torch.export (training mode, example batch {captured.batch})"
    return finish_import(description, head, captured.params, captured.batch, cluster, notes)


def import_torch(module: Any, example_inputs: Sequence[Any], *, name: str = "imported") -> Model:
    """The dlsim `Model` of a PyTorch module traced on `example_inputs` (one batch-first tensor)."""
    return import_torch_module(module, example_inputs, name=name).model


def import_torch_file(factory: str, input_shape: list[int], *, batch: int = 2, tokens: bool = False,
                      vocab: int = 2, name: str | None = None, out: Path | None = None, force: bool = False,
                      cluster: Cluster | str | Path | None = None) -> Imported:
    """Trace the module built by `factory` on a random input of (batch, *input_shape); write the YAML to
    `out` (never the factory's own file; an existing file only with `force`)."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        raise SpecError("importing from PyTorch needs torch (pip install torch)") from None
    source = factory.rpartition(":")[0]
    check_name_option(name)
    if batch < 2:
        raise SpecError(f"--batch must be at least 2 (the batch dimension is traced as dynamic), got {batch}")
    with run_scope():
        if out is not None:
            check_output(out, inputs=(source,) if source.endswith(".py") else (), force=force, option="--out")
        module = load_factory(factory)
        label = name or factory.rpartition(":")[2]
        example = make_batch(input_shape, batch, tokens, vocab, dtype=float_dtype_of(module))
        imported = import_torch_module(module, [example], name=label, cluster=cluster,
                                       header=f"{label}: imported from {factory} by dlsim import torch (torch.export, "
                                              f"training mode, example batch {batch})")
        if out is not None:
            write_atomic(Path(out), imported.text)
    return imported


def check_name_option(name: str | None) -> None:
    """A model name given (``--name``) is a non-empty word, never silently the default."""
    if name is not None and (not isinstance(name, str) or not name.strip() or len(name) > 200
                             or any(c in name for c in "\n\r\x00")):
        raise SpecError(f"--name must be a non-empty name of at most 200 characters on one line, got {excerpt(name)}",
                        field="name")


def import_onnx_file(path: str | Path, *, name: str | None = None, out: Path | None = None, force: bool = False,
                     cluster: Cluster | str | Path | None = None, batch: int | None = None,
                     buffers: Sequence[str] = ()) -> Imported:
    """Import an ONNX file (shapes by onnx's shape inference); write the YAML to `out` (never the ONNX
    file itself; an existing file only with `force`). `buffers` names initializers that are registered
    buffers, not parameters (ONNX does not mark them: for a module at hand, its ``named_buffers()``)."""
    from dlsim.importers.onnx_graph import read_onnx
    from dlsim.importers.graph import assemble

    path = Path(path)
    check_name_option(name)
    if batch is not None and batch < 1:
        raise SpecError(f"--batch must be positive, got {batch}")
    with run_scope():
        if out is not None:
            check_output(out, inputs=(path,), force=force, option="--out")
        note_input(path, "the ONNX file")
        graph = read_onnx(path, batch=batch, buffers=buffers)
        for extra in graph.sources[1:]:
            note_input(extra, "the ONNX file's external data")
        label = name or path.stem
        description = assemble(label, graph.dtype, graph.input_entry, graph.nodes)
        imported = finish_import(description, f"{label}: imported from {path.name} by dlsim import onnx "
                                              f"(shape inference, batch {graph.batch})",
                                 graph.params, graph.batch, cluster, graph.notes)
        if out is not None:
            write_atomic(Path(out), imported.text)
    return imported
