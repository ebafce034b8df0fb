"""A sweep description (YAML), validated once into a frozen `SweepSpec`, and its points.

::

    models: [gpt2, llama3-8b]          # zoo names or model YAML paths
    clusters: [dgx-a100, dgx-h100]     # built-in profiles or profile directories
    gpus: [8, 16, 32]                  # optional: dp = gpus / (tp x pp); the cluster is resized to fit
    global_batch: 64                   # one value or a list
    grid:                              # strategy fields, each a list of values (the cross product)
      tp: [1, 2, 4]
      pp: [1, 2]
      microbatch_size: [1, 2]
      recompute: [none, selective]
    fixed: {schedule: 1f1b, zero: 1}   # strategy fields set for every point
    # also in grid or fixed: compression, compression_bits, compression_density,
    # compression_error_feedback, jitter, jitter_cv, straggler_fraction, straggler_slowdown, seed
    # (`dlsim.io.sweep_fields`: a field applies only to the points it means something for)
    model_only: false                  # true: price with the roofline model, ignore measured tables
    max_points: 100000                 # refuse a larger grid (at most MAX_POINTS)

A point is one (model, cluster, gpus, global_batch, strategy fields) combination; its id is a hash
of those values alone (`point_id`; and of ``model_only`` when set, whose prices differ), so it does
not change when the spec's lists are reordered or extended and a results file can be resumed
against an edited spec.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from dlsim.errors import SpecError
from dlsim.io.sweep_fields import NESTED_KEYS, applicable, check_nested, check_usable
from dlsim.io.yamlfile import check_keys, expect_mapping, read_yaml
from dlsim.spec.strategy import Strategy

MAX_POINTS = 1_000_000
DEFAULT_MAX_POINTS = 100_000
MAX_LIST = 10_000
# strategy fields a sweep may set: the scalar ones (nested records stay in strategy files)
_NESTED = {"compression", "variability", "stage_partition", "layer_groups", "fused_kernels"}
STRATEGY_KEYS = frozenset(set(Strategy.__dataclass_fields__) - _NESTED)
SWEEP_KEYS = STRATEGY_KEYS | frozenset(NESTED_KEYS)
"""Keys of grid and fixed: the scalar strategy fields, and the parts of compression and variability."""
_TOP_KEYS = {"models", "clusters", "gpus", "global_batch", "grid", "fixed", "model_only", "max_points", "name"}
_INT_KEYS = {k for k, f in Strategy.__dataclass_fields__.items() if f.type in ("int", int)}
_POSITIVE_KEYS = {"dp", "tp", "pp", "microbatch_size", "num_microbatches", "virtual_stages", "ps_shards",
                  "fetch_every", "push_every", "iterations", "recompute_layers"}
_BOOL_KEYS = {k for k, f in Strategy.__dataclass_fields__.items() if f.type in ("bool", bool)}
_FLOAT_KEYS = {k for k, f in Strategy.__dataclass_fields__.items() if f.type in ("float", float)}


@dataclass(frozen=True)
class SweepPoint:
    """One simulation of a sweep: `fields` are the strategy keywords of `simulate()`."""

    id: str
    model: str
    cluster: str
    gpus: int | None
    global_batch: int
    fields: tuple[tuple[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "cluster": self.cluster, "gpus": self.gpus, "global_batch": self.global_batch,
                **dict(self.fields)}


@dataclass(frozen=True)
class SweepSpec:
    models: tuple[str, ...]
    clusters: tuple[str, ...]
    gpus: tuple[int, ...] | None
    global_batch: tuple[int, ...]
    grid: tuple[tuple[str, tuple[Any, ...]], ...]
    fixed: tuple[tuple[str, Any], ...]
    model_only: bool = False
    max_points: int = DEFAULT_MAX_POINTS
    name: str = "sweep"

    @property
    def size(self) -> int:
        n = len(self.models) * len(self.clusters) * len(self.gpus or (None,)) * len(self.global_batch)
        for _, values in self.grid:
            n *= len(values)
        return n

    def points(self) -> Iterator[SweepPoint]:
        """Every point, in a deterministic order (models, clusters, gpus, batch, then the grid)."""
        keys = [k for k, _ in self.grid]
        seen: set[str] = set()
        for model, cluster, gpus, batch in itertools.product(self.models, self.clusters, self.gpus or (None,),
                                                             self.global_batch):
            for values in itertools.product(*(v for _, v in self.grid)):
                fields = tuple(sorted(applicable({**dict(self.fixed), **dict(zip(keys, values))}).items()))
                hashed = fields + ((("~model_only", True),) if self.model_only else ())
                pid = point_id(model, cluster, gpus, batch, hashed)
                if pid not in seen:  # parts that do not apply dropped: equal points are one
                    seen.add(pid)
                    yield SweepPoint(pid, model, cluster, gpus, batch, fields)


def point_id(model: str, cluster: str, gpus: int | None, global_batch: int, fields: tuple[tuple[str, Any], ...]) -> str:
    """A stable id: 16 hex digits of the SHA-256 of the point's canonical JSON."""
    key = json.dumps([model, cluster, gpus, global_batch, [list(f) for f in sorted(fields)]],
                     sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _names(value: Any, path: Path, field: str) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise SpecError("must name at least one", path=path, field=field)
    for i, v in enumerate(items):
        if not isinstance(v, str) or not v.strip():
            raise SpecError(f"must be a name or a path, got {v!r}"[:120], path=path, field=f"{field}[{i}]")
    if len(set(items)) != len(items):
        raise SpecError("lists a value twice", path=path, field=field)
    return tuple(items)


def _positive_ints(value: Any, path: Path, field: str) -> tuple[int, ...]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise SpecError("must list at least one value", path=path, field=field)
    for i, v in enumerate(items):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecError(f"must be a positive integer, got {v!r}"[:120], path=path, field=f"{field}[{i}]")
    if len(set(items)) != len(items):
        raise SpecError("lists a value twice", path=path, field=field)
    return tuple(items)


def _check_value(key: str, v: Any, path: Path, field: str) -> Any:
    if key in NESTED_KEYS:
        return check_nested(key, v, path, field)
    if key in _INT_KEYS and (isinstance(v, bool) or not isinstance(v, int)):
        raise SpecError(f"must be an integer, got {v!r}"[:120], path=path, field=field)
    if key in _POSITIVE_KEYS and v < 1 or key in _INT_KEYS and v < 0:
        raise SpecError(f"must be {'positive' if key in _POSITIVE_KEYS else 'non-negative'}, got {v!r}"[:120],
                        path=path, field=field)
    if key in _BOOL_KEYS and not isinstance(v, bool):
        raise SpecError(f"must be true or false, got {v!r}"[:120], path=path, field=field)
    if key in _FLOAT_KEYS and (isinstance(v, bool) or not isinstance(v, (int, float, str))):
        raise SpecError(f"must be a number or a size such as 25MB, got {v!r}"[:120], path=path, field=field)
    if not isinstance(v, (str, int, float, bool)) and not (v is None and key == "dtype"):
        raise SpecError(f"must be a single value, got {type(v).__name__}", path=path, field=field)
    return v


def _strategy_map(value: Any, path: Path, field: str, lists: bool) -> tuple[tuple[str, Any], ...]:
    data = expect_mapping(value if value is not None else {}, path, field)
    check_keys(data, set(SWEEP_KEYS), path, field)
    out = []
    for key in sorted(data):
        v = data[key]
        if lists:
            items = v if isinstance(v, list) else [v]
            if not items:
                raise SpecError("must list at least one value", path=path, field=f"{field}.{key}")
            if len(items) > MAX_LIST:
                raise SpecError(f"lists {len(items)} values (at most {MAX_LIST})", path=path, field=f"{field}.{key}")
            vals = tuple(_check_value(key, x, path, f"{field}.{key}[{i}]") for i, x in enumerate(items))
            if len(set(map(repr, vals))) != len(vals):
                raise SpecError("lists a value twice", path=path, field=f"{field}.{key}")
            out.append((key, vals))
        else:
            out.append((key, _check_value(key, v, path, f"{field}.{key}")))
    return tuple(out)


def parse_sweep(data: Any, path: Path | str = "<sweep>") -> SweepSpec:
    """Validate a parsed sweep description (see the module docstring)."""
    path = Path(path)
    data = expect_mapping(data, path, "")
    check_keys(data, _TOP_KEYS, path, "")
    for key in ("models", "clusters", "global_batch"):
        if key not in data:
            raise SpecError("is required", path=path, field=key)
    models = _names(data["models"], path, "models")
    clusters = _names(data["clusters"], path, "clusters")
    gpus = _positive_ints(data["gpus"], path, "gpus") if data.get("gpus") is not None else None
    batch = _positive_ints(data["global_batch"], path, "global_batch")
    grid = _strategy_map(data.get("grid"), path, "grid", lists=True)
    fixed = _strategy_map(data.get("fixed"), path, "fixed", lists=False)
    both = sorted({k for k, _ in grid} & {k for k, _ in fixed})
    if both:
        raise SpecError("is set in both grid and fixed", path=path, field=f"grid.{both[0]}")
    values = {**{k: v for k, v in grid}, **{k: (v,) for k, v in fixed}}
    check_usable(values, path, {**{k: "grid" for k, _ in grid}, **{k: "fixed" for k, _ in fixed}})
    if gpus is not None:
        for section, keys in (("grid", [k for k, _ in grid]), ("fixed", [k for k, _ in fixed])):
            if "dp" in keys:
                raise SpecError("dp follows from gpus / (tp x pp): set gpus or dp, not both", path=path,
                                field=f"{section}.dp")
    model_only = data.get("model_only", False)
    if not isinstance(model_only, bool):
        raise SpecError(f"must be true or false, got {model_only!r}"[:120], path=path, field="model_only")
    max_points = data.get("max_points", DEFAULT_MAX_POINTS)
    if isinstance(max_points, bool) or not isinstance(max_points, int) or not 1 <= max_points <= MAX_POINTS:
        raise SpecError(f"must be an integer from 1 to {MAX_POINTS}, got {max_points!r}"[:120], path=path,
                        field="max_points")
    name = data.get("name", path.stem if path.name != "<sweep>" else "sweep")
    if not isinstance(name, str):
        raise SpecError("must be a string", path=path, field="name")
    spec = SweepSpec(models, clusters, gpus, batch, grid, fixed, model_only, max_points, name)
    if spec.size > max_points:
        raise SpecError(f"the grid has {spec.size} points, more than max_points = {max_points} "
                        f"({spec.size - max_points} over)", path=path, field="grid")
    return spec


def load_sweep(path: Path | str) -> SweepSpec:
    """Read and validate a sweep YAML file: a bad field is one `SpecError` line."""
    path = Path(path)
    return parse_sweep(read_yaml(path), path)
