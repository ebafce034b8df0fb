"""Listing and describing models and profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from dlsim.api.limits import check_batch_limit
from dlsim.cost.layers import layer_cost
from dlsim.cost.memory import activation_bytes
from dlsim.cost.pricing import PASSES
from dlsim.errors import SpecError, excerpt
from dlsim.io.model_yaml import load_model
from dlsim.io.paths import list_models, list_profiles
from dlsim.io.profile_yaml import load_profile
from dlsim.io.yamlfile import read_yaml
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.units import DTYPE_BYTES


def as_model(model: Model | str | Path, overrides: Mapping[str, Any] | None = None) -> Model:
    """A `Model` from a Model, a zoo name or a YAML path; `overrides` (zoo names and paths only) set
    keys of the model's YAML before it is built."""
    if isinstance(model, Model):
        if overrides:
            raise SpecError(f"overrides apply to a model given by name or YAML path, not to a built Model "
                            f"({excerpt(model.name, 40)})", field="overrides")
        return model
    return load_model(model, overrides)


def as_cluster(cluster: Cluster | str | Path) -> Cluster:
    """A `Cluster` from a Cluster, a built-in profile name or a profile path."""
    return cluster if isinstance(cluster, Cluster) else load_profile(cluster)


def check_batch(batch: int) -> int:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise SpecError(f"batch must be a positive integer, got {batch!r}", field="batch")
    return check_batch_limit(batch)


def check_dtype(dtype: str | None, model: Model) -> str:
    """`dtype`, or the model's when not given (None: an empty string is a wrong dtype, not a default)."""
    dtype = model.dtype if dtype is None else dtype
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES or dtype.startswith("int"):
        raise SpecError(f"unknown dtype {excerpt(dtype, 40)} (use fp32, tf32, fp16, bf16, fp8)", field="dtype")
    return dtype


def zoo() -> list[dict[str, Any]]:
    """Built-in models: name, description, parameters, input."""
    rows = []
    for path in list_models():
        raw = read_yaml(path) or {}
        try:
            model = load_model(path)
            rows.append({"name": path.stem, "description": raw.get("description", ""), "params": model.params,
                         "layers": len(model.layers), "input": list(model.input_shape), "dtype": model.dtype,
                         "path": str(path)})
        except SpecError as exc:
            rows.append({"name": path.stem, "description": f"(invalid: {exc})", "params": 0, "layers": 0,
                         "input": [], "dtype": "", "path": str(path)})
    return rows


def profiles() -> list[dict[str, Any]]:
    """Built-in hardware profiles with their headline numbers."""
    rows = []
    for folder in list_profiles():
        c = load_profile(folder)
        rows.append({"name": folder.name, "description": c.description, "device": c.device.name,
                     "devices": c.num_devices, "nodes": c.nodes, "devices_per_node": c.devices_per_node,
                     "intra_node": c.intra.name, "inter_node": c.inter.name if c.inter else None,
                     "memory_bytes": c.device.memory_bytes,
                     "memory_usable_bytes": c.device.memory_bytes - c.device.memory_reserved, "peak_flops": dict(c.device.peak_flops),
                     "measured_tables": sorted(c.tables), "path": str(folder)})
    return rows


def describe_model(model: Model | str | Path, batch: int = 1, dtype: str | None = None,
                   overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Per-layer shapes, parameters, FLOPs, work W and depth D per pass, activation bytes; totals."""
    model = as_model(model, overrides)
    assumed = {"dtype": model.dtype} if dtype is None else {}
    batch, dtype = check_batch(batch), check_dtype(dtype, model)
    costs = {layer.name: layer_cost(layer, batch, dtype) for layer in model.layers}
    kept = activation_bytes(model, costs, batch, dtype)
    layers = []
    for layer in model.layers:
        c = costs[layer.name]
        passes = {p: {"flops": getattr(c, p).flops, "work": getattr(c, p).work, "depth": getattr(c, p).depth,
                      "bytes": getattr(c, p).bytes} for p in PASSES}
        layers.append({"name": layer.name, "type": layer.type, "inputs": list(layer.inputs),
                       "out_shape": [batch, *layer.out_shape], "params": layer.params,
                       "forward_flops": c.forward.flops, "matmul_flops": c.matmul_flops,
                       "passes": passes, "activation_bytes": kept[layer.name]})
    return {
        "schema_version": 1, "kind": "model", "model": model.name, "source": model.source, "dtype": dtype,
        "assumed": assumed,
        "batch": batch, "input_shape": [batch, *model.input_shape], "params": model.params,
        "active_params": model.active_params,
        "forward_flops": sum(layer["forward_flops"] for layer in layers),
        "training_flops": sum(c.flops for c in costs.values()),
        "work": sum(p["work"] for layer in layers for p in layer["passes"].values()),
        "forward_depth": sum(layer["passes"]["forward"]["depth"] for layer in layers),
        "activation_bytes": sum(kept.values()),
        "layers": layers,
    }
