"""Loading a strategy file (YAML) into a `Strategy`; units in key names (`bucket_size_mib`).

Example:

    dp: 32
    tp: 8
    pp: 16
    ep: 8                         # expert parallelism: MoE experts over 8 data-parallel ranks (divides dp)
    ep_overlap: true              # shared experts beside the all-to-alls
    cp: 2                         # context parallelism: ring attention over 2 ranks (default 1)
    spatial: 1                    # spatial parallelism: images split over a height x width grid (+ spatial_w, halo_overlap)
    microbatch_size: 1
    num_microbatches: 64          # or global_batch: 2048
    schedule: 1f1b                # gpipe | 1f1b | interleaved (+ virtual_stages: 2)
    sync: allreduce               # ps | async | ssp (+ staleness: 3, ps_shards, fetch_every, push_every, iterations)
    collective: auto              # or ring, recursive-doubling, rabenseifner, ...
    bucket_size_mib: 25
    overlap: true
    recompute: selective          # none | full | selective (full: + recompute_layers: 1)
    sequence_parallel: true       # Korthikanti et al. 2022 (needs tp >= 2)
    tp_async_backward: true       # TP input-gradient collectives beside the weight-gradient GEMMs (Megatron-LM)
    tp_comm_overlap: true         # SP all-gathers / reduce-scatters chunked beside their GEMMs (TE userbuffers)
    p2p_overlap: false            # pipeline exchanges block the sender (Megatron-LM's default)
    p2p_scatter_gather: true      # replicated boundaries sent as 1/tp slices, all-gathered at the receiver
    stack: megatron-core          # the software stack (dlsim stacks): its values for every key not set here
    fused_kernels: [scale_mask_softmax, bias_dropout_add]   # dlsim.spec.strategy.FUSIONS
    grad_accumulation: main_grad  # autograd | main_grad | main_grad_fp32 | fused_fp32 | none
    zero: 1                       # 0-3; 1 = distributed optimizer, 3 = FSDP (+ hybrid_shard: true)
    optimizer: adam
    offload: none                 # activations | optimizer | both: to host memory over the host link
    compression: {kind: topk, density: 0.01, error_feedback: true}   # + value_bits: 4 (SparCML's TopK_Q4)
    variability: {jitter: lognormal, jitter_cv: 0.05, straggler_fraction: 0.01, straggler_slowdown: 1.5, seed: 7}
    stage_partition: [13, 12, ...]                       # layers per chunk (pp x virtual_stages entries)
    pipeline_split: uniform                              # without stage_partition: balanced (by cost) | uniform (blocks)
    layer_groups:                                        # Krizhevsky 2014's data/model split (pp = 1); channel / filter
      - {first: conv1, last: flatten, parallel: data}
      - {first: drop6, last: loss, parallel: model}
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Callable

from pydantic import BeforeValidator, Field, create_model

from dlsim.errors import SpecError, UnitError
from dlsim.io.yamlfile import read_yaml
from dlsim.spec.stack import STACK_KEYS
from dlsim.spec.strategy import (Compression, CompressionRecord, LayerGroup, Strategy, StrategyRecord, Variability,
                                 VariabilityRecord, make_strategy)
from dlsim.spec.typed import Count, NonNegativeInt, Positive, Record, Text, validate
from dlsim.units import KIB, MIB

_SIZES = {"bucket_size_mib": ("bucket_size", MIB), "bucket_size_kib": ("bucket_size", KIB),
          "bucket_size_bytes": ("bucket_size", 1), "first_bucket_size_mib": ("first_bucket_size", MIB),
          "first_bucket_size_kib": ("first_bucket_size", KIB), "first_bucket_size_bytes": ("first_bucket_size", 1)}
"""A size key of the file -> (the strategy field, its unit in bytes)."""


def _kind_only(value: Any) -> Any:
    return {"kind": value} if isinstance(value, str) else value


class VariabilityFile(VariabilityRecord):
    """`variability` in a file: ``device_slowdown`` maps a rank to its slowdown factor."""

    device_slowdown: Annotated[dict[NonNegativeInt, Positive], Field(  # type: ignore[assignment]
        json_schema_extra={"propertyNames": {"pattern": "^[0-9]+$"}}, description="rank -> slowdown factor")] = {}


StrategyFile = create_model(
    "StrategyFile", __base__=Record, __doc__="A strategy file: `Strategy`'s fields, sizes with their unit in the key.",
    **{name: (f.rebuild_annotation(), f) for name, f in StrategyRecord.model_fields.items()
       if name not in ("bucket_size", "first_bucket_size", "compression", "variability")},
    **{key: (Positive | None, Field(None, description=f"{name} in {key.rsplit('_', 1)[1]}"))
       for key, (name, _) in _SIZES.items()},
    compression=(Annotated[CompressionRecord, BeforeValidator(_kind_only)] | None,
                 Field(None, description="a compressor's name, or {kind, bits, density, ...}")),
    variability=(VariabilityFile | None, None),
    global_batch=(Count | None, Field(None, description="dp x microbatch_size x num_microbatches")),
    description=(Text | None, None),
)


def strategy_fields(data: Any, path: Path | str = "<strategy>") -> dict[str, Any]:
    """Keyword arguments of `make_strategy` from a strategy mapping (file units converted to SI here)."""
    rec = validate(StrategyFile, data, Path(str(path)))
    out: dict[str, Any] = {}
    for key in rec.model_fields_set - {"description"}:
        value = getattr(rec, key)
        if key in _SIZES:
            if value is not None:
                name, scale = _SIZES[key]
                out[name] = float(value) * scale
        elif key == "compression":
            if value is not None:
                out[key] = Compression(**dict(value))
        elif key == "variability":
            if value is not None:
                slow = tuple(sorted(value.device_slowdown.items()))
                out[key] = Variability(**{**dict(value), "device_slowdown": slow})
        elif key == "layer_groups":
            out[key] = tuple(LayerGroup(**dict(g)) for g in value)
        else:
            out[key] = value
    return out


def given_keys(data: Any) -> set[str]:
    """The strategy fields a strategy mapping sets: top-level names (sizes by their field name),
    ``compression.<key>`` for a compression mapping's keys, a variability mapping's keys."""
    if not isinstance(data, dict):
        return set()
    out = {_SIZES[k][0] if k in _SIZES else k for k in data if k not in ("compression", "variability", "description")}
    if isinstance(data.get("compression"), dict):
        out |= {f"compression.{k}" for k in data["compression"] if k != "kind"}
    if isinstance(data.get("variability"), dict):
        out |= set(data["variability"])
    return out - {"global_batch"}


def load_strategy(path: str | Path, overrides: dict[str, Any] | None = None,
                  given: set[str] | None = None,
                  complete: Callable[[dict[str, Any], set[str]], dict[str, Any]] | None = None) -> Strategy:
    """A validated `Strategy` from a YAML file; `overrides` (already in SI) replace its fields.
    `given`, when passed, receives the names of the fields the file sets (`given_keys`).
    `complete(fields, names set)`, when passed, fills in what neither set (a software stack's values)."""
    path = Path(path)
    data = read_yaml(path) or {}
    fields = strategy_fields(data, path)
    names = given_keys(data)
    if given is not None:
        given |= names
    fields.update(overrides or {})
    try:
        if complete is not None:
            fields = complete(fields, names | set(overrides or {}))
        return make_strategy(**fields)
    except SpecError as exc:
        raise SpecError(exc.reason, path=path, field=exc.field) from None
    except (TypeError, UnitError) as exc:
        raise SpecError(str(exc), path=path) from None


def strategy_document(s: Strategy) -> dict[str, Any]:
    """A strategy as the mapping a strategy file holds, which `load_strategy` reads back to the same
    strategy: the layout, the batch, the schedule, the stack and every key a stack may set (so that the
    stack's own values cannot replace them), every other field off its default; sizes in bytes."""
    default = Strategy()
    always = {"dp", "tp", "pp", "microbatch_size", "num_microbatches", "schedule", "stack"} | set(STACK_KEYS)
    if s.sync != "allreduce":  # all-reduce's own fields would be refused beside parameter-server training
        always -= {"overlap", "bucket_size", "first_bucket_size"}
    out: dict[str, Any] = {}
    for key in Strategy.__dataclass_fields__:
        value = getattr(s, key)
        if key not in always and value == getattr(default, key):
            continue
        if value is None or value == "" or key == "variability" and not value.active:
            continue
        if key in ("bucket_size", "first_bucket_size"):
            out[f"{key}_bytes"] = value
        elif key in ("fused_kernels", "stage_partition"):
            out[key] = list(value)
        elif key == "compression":
            out[key] = {"kind": value.kind, "bits": value.bits, "density": value.density, "value_bits": value.value_bits,
                        "bucket_elements": value.bucket_elements, "error_feedback": value.error_feedback}
        elif key == "variability":
            out[key] = {"jitter": value.jitter, "jitter_cv": value.jitter_cv, "straggler_fraction":
                        value.straggler_fraction, "straggler_slowdown": value.straggler_slowdown, "seed": value.seed,
                        "device_slowdown": {rank: factor for rank, factor in value.device_slowdown}}
        elif key == "layer_groups":
            out[key] = [{"first": g.first, "last": g.last, "parallel": g.parallel} for g in value]
        else:
            out[key] = value
    return out
