"""Loading a strategy file (YAML) into a `Strategy`; units in key names (`bucket_size_mib`).

Example:

    dp: 32
    tp: 8
    pp: 16
    ep: 8                         # expert parallelism: MoE experts over 8 data-parallel ranks (divides dp)
    ep_overlap: true              # shared experts beside the all-to-alls
    cp: 2                         # context parallelism: ring attention over 2 ranks (default 1)
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
    p2p_overlap: false            # pipeline exchanges block the sender (Megatron-LM's default)
    p2p_scatter_gather: true      # replicated boundaries sent as 1/tp slices, all-gathered at the receiver
    stack: megatron-core          # the software stack (dlsim stacks): its values for every key not set here
    fused_kernels: [scale_mask_softmax, bias_dropout_add]   # dlsim.spec.strategy.FUSIONS
    grad_accumulation: main_grad  # autograd | main_grad | main_grad_fp32 | fused_fp32 | none
    zero: 1                       # 0-3; 1 = distributed optimizer, 3 = FSDP (+ hybrid_shard: true)
    optimizer: adam
    offload: none                 # activations | optimizer | both: to host memory over the host link
    compression: {kind: topk, density: 0.01, error_feedback: true}
    variability: {jitter: lognormal, jitter_cv: 0.05, straggler_fraction: 0.01, straggler_slowdown: 1.5, seed: 7}
    stage_partition: [13, 12, ...]                       # layers per chunk (pp x virtual_stages entries)
    layer_groups:                                        # Krizhevsky 2014's data/model split (tp = pp = 1)
      - {first: conv1, last: flatten, parallel: data}
      - {first: drop6, last: loss, parallel: model}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from dlsim.errors import SpecError, UnitError
from dlsim.io.yamlfile import check_keys, expect_mapping, read_yaml
from dlsim.spec.stack import STACK_KEYS
from dlsim.spec.strategy import Compression, LayerGroup, Strategy, Variability, make_strategy
from dlsim.units import KIB, MIB

_PLAIN = {"dp", "tp", "pp", "microbatch_size", "num_microbatches", "global_batch", "schedule", "virtual_stages",
          "sync", "staleness", "ps_shards", "fetch_every", "push_every", "iterations", "collective", "overlap",
          "recompute", "zero", "optimizer", "dtype", "sequence_parallel", "recompute_layers",
          "tp_async_backward", "p2p_overlap", "p2p_scatter_gather", "ep", "ep_overlap", "grad_accumulation", "cp", "hybrid_shard", "offload",
          "stack", "optimizer_impl", "grad_reduce_dtype", "param_gather_overlap"}
_SIZES = {"bucket_size_mib": ("bucket_size", MIB), "bucket_size_kib": ("bucket_size", KIB),
          "bucket_size_bytes": ("bucket_size", 1), "first_bucket_size_mib": ("first_bucket_size", MIB),
          "first_bucket_size_kib": ("first_bucket_size", KIB), "first_bucket_size_bytes": ("first_bucket_size", 1)}
_NESTED = {"compression", "variability", "stage_partition", "layer_groups", "description", "fused_kernels"}
_COMPRESSION_KEYS = {"kind", "bits", "density", "bucket_elements", "error_feedback"}
_VARIABILITY_KEYS = {"jitter", "jitter_cv", "straggler_fraction", "straggler_slowdown", "device_slowdown", "seed"}


def strategy_fields(data: dict, path: Path | str = "<strategy>") -> dict[str, Any]:
    """Keyword arguments of `make_strategy` from a strategy mapping (file units converted)."""
    data = expect_mapping(data, Path(str(path)), "")
    check_keys(data, _PLAIN | set(_SIZES) | _NESTED, Path(str(path)), "")
    out: dict[str, Any] = {k: v for k, v in data.items() if k in _PLAIN}
    for key, (name, scale) in _SIZES.items():
        if key in data:
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise SpecError(f"must be a positive number, got {value!r}", path=path, field=key)
            out[name] = float(value) * scale
    if "compression" in data:
        comp = data["compression"]
        if isinstance(comp, str):
            comp = {"kind": comp}
        comp = expect_mapping(comp, Path(str(path)), "compression")
        check_keys(comp, _COMPRESSION_KEYS, Path(str(path)), "compression")
        out["compression"] = Compression(**comp)
    if "variability" in data:
        var = dict(expect_mapping(data["variability"], Path(str(path)), "variability"))
        check_keys(var, _VARIABILITY_KEYS, Path(str(path)), "variability")
        slow = var.pop("device_slowdown", {}) or {}
        if not isinstance(slow, dict):
            raise SpecError("must map rank -> slowdown factor", path=path, field="variability.device_slowdown")
        out["variability"] = Variability(**var, device_slowdown=tuple(sorted((int(k), v) for k, v in slow.items())))
    if "stage_partition" in data:
        parts = data["stage_partition"]
        if not isinstance(parts, list):
            raise SpecError("must be a list of layer counts per chunk", path=path, field="stage_partition")
        out["stage_partition"] = tuple(parts)
    if "fused_kernels" in data:
        kernels = data["fused_kernels"]
        if not isinstance(kernels, list) or not all(isinstance(k, str) for k in kernels):
            raise SpecError("must be a list of fused kernel names", path=path, field="fused_kernels")
        out["fused_kernels"] = tuple(kernels)
    if "layer_groups" in data:
        groups = data["layer_groups"]
        if not isinstance(groups, list):
            raise SpecError("must be a list of {first, last, parallel}", path=path, field="layer_groups")
        parsed = []
        for i, g in enumerate(groups):
            g = expect_mapping(g, Path(str(path)), f"layer_groups[{i}]")
            check_keys(g, {"first", "last", "parallel"}, Path(str(path)), f"layer_groups[{i}]")
            missing = {"first", "last", "parallel"} - set(g)
            if missing:
                raise SpecError(f"missing {sorted(missing)[0]}", path=path, field=f"layer_groups[{i}]")
            parsed.append(LayerGroup(str(g["first"]), str(g["last"]), str(g["parallel"])))
        out["layer_groups"] = tuple(parsed)
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
            out[key] = {"kind": value.kind, "bits": value.bits, "density": value.density,
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
