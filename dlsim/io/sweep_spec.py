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
from typing import Annotated, Any, Iterator

from pydantic import Field, create_model

from dlsim.errors import SpecError
from dlsim.io.sweep_fields import NESTED_KEYS, applicable, check_usable, nested_type
from dlsim.io.yamlfile import read_yaml
from dlsim.spec.strategy import StrategyRecord
from dlsim.spec.typed import Count, Name, Record, one_or_many, validate

MAX_POINTS = 1_000_000
DEFAULT_MAX_POINTS = 100_000
MAX_LIST = 10_000
# strategy fields a sweep may set: the scalar ones (nested records stay in strategy files)
_NESTED = {"compression", "variability", "stage_partition", "layer_groups", "fused_kernels"}
STRATEGY_KEYS = frozenset(set(StrategyRecord.model_fields) - _NESTED)
SWEEP_KEYS = STRATEGY_KEYS | frozenset(NESTED_KEYS)
"""Keys of grid and fixed: the scalar strategy fields, and the parts of compression and variability."""


def _no_default(schema: dict) -> None:
    schema.pop("default", None)


def _section(name: str, lists: bool) -> type[Record]:
    """grid (each key a value or a list of them) or fixed (one value each): the strategy's own types."""
    fields: dict[str, Any] = {}
    for key in sorted(SWEEP_KEYS):
        kind = nested_type(key) if key in NESTED_KEYS else StrategyRecord.model_fields[key].rebuild_annotation()
        fields[key] = (one_or_many(kind, MAX_LIST) if lists else kind, Field(None, json_schema_extra=_no_default))
    return create_model(name, __base__=Record, **fields)


class SweepFile(Record):
    """A sweep spec (see the module docstring)."""

    name: Name | None = None
    models: one_or_many(Name) = Field(description="zoo names or model YAML paths")  # type: ignore[valid-type]
    clusters: one_or_many(Name) = Field(description="built-in profiles or profile directories")  # type: ignore[valid-type]
    gpus: one_or_many(Count) | None = Field(  # type: ignore[valid-type]
        None, description="dp = gpus / (tp x pp x cp); the cluster is resized to fit")
    global_batch: one_or_many(Count)  # type: ignore[valid-type]
    grid: _section("Grid", lists=True) | None = Field(  # type: ignore[valid-type]
        None, description="strategy fields, each a value or a list of values (the cross product)")
    fixed: _section("Fixed", lists=False) | None = Field(  # type: ignore[valid-type]
        None, description="strategy fields set for every point")
    model_only: bool = Field(False, description="price with the roofline model, ignore measured tables")
    max_points: Annotated[int, Field(ge=1, le=MAX_POINTS)] = DEFAULT_MAX_POINTS


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


def _values(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def parse_sweep(data: Any, path: Path | str = "<sweep>") -> SweepSpec:
    """Validate a parsed sweep description (see the module docstring); values are kept as written, so
    that a point's id does not change with the types the record converts to."""
    path = Path(path)
    validate(SweepFile, data, path)
    grid = tuple((key, _values(data["grid"][key])) for key in sorted(data.get("grid") or {}))
    fixed = tuple((key, data["fixed"][key]) for key in sorted(data.get("fixed") or {}))
    both = sorted({k for k, _ in grid} & {k for k, _ in fixed})
    if both:
        raise SpecError("is set in both grid and fixed", path=path, field=f"grid.{both[0]}")
    values = {**{k: v for k, v in grid}, **{k: (v,) for k, v in fixed}}
    check_usable(values, path, {**{k: "grid" for k, _ in grid}, **{k: "fixed" for k, _ in fixed}})
    gpus = _values(data["gpus"]) if data.get("gpus") is not None else None
    if gpus is not None:
        for section, keys in (("grid", [k for k, _ in grid]), ("fixed", [k for k, _ in fixed])):
            if "dp" in keys:
                raise SpecError("dp follows from gpus / (tp x pp): set gpus or dp, not both", path=path,
                                field=f"{section}.dp")
    max_points = data.get("max_points", DEFAULT_MAX_POINTS)
    spec = SweepSpec(_values(data["models"]), _values(data["clusters"]), gpus, _values(data["global_batch"]), grid,
                     fixed, data.get("model_only", False), max_points,
                     data.get("name") or (path.stem if path.name != "<sweep>" else "sweep"))
    if spec.size > max_points:
        raise SpecError(f"the grid has {spec.size} points, more than max_points = {max_points} "
                        f"({spec.size - max_points} over)", path=path, field="grid")
    return spec


def load_sweep(path: Path | str) -> SweepSpec:
    """Read and validate a sweep YAML file: a bad field is one `SpecError` line."""
    path = Path(path)
    return parse_sweep(read_yaml(path), path)
