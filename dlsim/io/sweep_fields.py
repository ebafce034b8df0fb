"""Which fields apply to a sweep point: gradient compression, run-time variability and the
synchronisation mode's own fields.

A sweep's grid and fixed fields are scalars; compression and variability are records of a strategy
(`dlsim.spec.strategy.Compression`, `Variability`). These keys name their parts, as
``dlsim simulate`` flags do:

=============================  =========================================================
``compression``                none | fp16 | qsgd | topk | 1bit
``compression_bits``           QSGD bits per element (1-16; qsgd points only)
``compression_density``        top-k fraction kept, in (0, 1] (topk points only)
``compression_error_feedback`` true | false (lossy kinds only: qsgd, topk, 1bit)
``jitter``                     none | normal | lognormal | exponential | uniform
``jitter_cv``                  coefficient of variation of the jitter, in [0, 10]
``straggler_fraction``         fraction of the devices that straggle, in [0, 1]
``straggler_slowdown``         their slowdown factor, >= 1
``seed``                       seed of the variability draws, >= 0
=============================  =========================================================

Each value is checked once, when the spec is read, against the strategy's own typed record
(`dlsim.spec.strategy.CompressionRecord`, `VariabilityRecord`: `nested_type`), so a bad one is one
line naming the sweep field. A field applies only where
it means something, so that one grid holds a study and its baseline:

* the compressor's parameters apply to points of that compressor (``compression: [none, qsgd]``
  with ``compression_bits: [2, 4]`` is three points: dense, QSGD 2 bits, QSGD 4 bits);
* jitter applies where its distribution is not none and its coefficient of variation is positive
  (``jitter_cv: 0`` is the point without jitter); stragglers where the fraction is positive and the
  slowdown above 1; the seed where any of these applies;
* ``staleness`` applies to ``sync: ssp`` points; ``iterations``, ``ps_shards``, ``fetch_every`` and
  ``push_every`` to parameter-server points (ps, async, ssp); compression, ``bucket_size``,
  ``first_bucket_size`` and ``overlap`` to all-reduce points (``sync: [allreduce, ps, ssp]`` with
  ``staleness: [1, 4]`` is four points).

A point keeps only the fields that apply (`applicable`), and points made equal by that are one
point. A field no point can use is an error of the spec (`check_usable`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from dlsim.errors import SpecError
from dlsim.spec.strategy import Compression, CompressionRecord, Strategy, Variability, VariabilityRecord

NESTED_KEYS = {
    "compression": ("compression", "kind"), "compression_bits": ("compression", "bits"),
    "compression_density": ("compression", "density"), "compression_error_feedback": ("compression", "error_feedback"),
    "jitter": ("variability", "jitter"), "jitter_cv": ("variability", "jitter_cv"),
    "straggler_fraction": ("variability", "straggler_fraction"),
    "straggler_slowdown": ("variability", "straggler_slowdown"), "seed": ("variability", "seed"),
}
"""sweep key -> (strategy record, its attribute)."""

_RECORDS = {"compression": CompressionRecord, "variability": VariabilityRecord}
_LOSSY = ("qsgd", "topk", "1bit")
PS_ONLY = ("iterations", "ps_shards", "fetch_every", "push_every")
ALLREDUCE_ONLY = ("bucket_size", "first_bucket_size", "overlap") + tuple(k for k in NESTED_KEYS
                                                                         if k.startswith("compression"))


def nested_type(key: str) -> Any:
    """The type (with its range or choices) of a nested sweep key's value: its strategy record's field."""
    record, attr = NESTED_KEYS[key]
    return _RECORDS[record].model_fields[attr].rebuild_annotation()


def _strategy(flat: Mapping[str, Any]) -> Strategy:
    comp = {NESTED_KEYS[k][1]: v for k, v in flat.items() if NESTED_KEYS[k][0] == "compression"}
    var = {NESTED_KEYS[k][1]: v for k, v in flat.items() if NESTED_KEYS[k][0] == "variability"}
    return replace(Strategy(), compression=Compression(**comp), variability=Variability(**var))


def applicable(fields: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` without those that do not apply to this point (see the module docstring)."""
    out = dict(fields)
    sync = out.get("sync", "allreduce")
    for key in (PS_ONLY if sync == "allreduce" else ALLREDUCE_ONLY) + (("staleness",) if sync != "ssp" else ()):
        out.pop(key, None)
    kind = out.get("compression", "none")
    for key, needs in (("compression_bits", ("qsgd",)), ("compression_density", ("topk",)),
                       ("compression_error_feedback", _LOSSY)):
        if kind not in needs:
            out.pop(key, None)
    jitter = out.get("jitter", "none") != "none" and out.get("jitter_cv", 0) > 0
    stragglers = out.get("straggler_fraction", 0) > 0 and out.get("straggler_slowdown", 1) > 1
    for key, keep in (("jitter", jitter), ("jitter_cv", jitter), ("straggler_fraction", stragglers),
                      ("straggler_slowdown", stragglers), ("seed", jitter or stragglers)):
        if not keep:
            out.pop(key, None)
    return out


def check_usable(values: Mapping[str, Iterable[Any]], path: Path, where: Mapping[str, str]) -> None:
    """Refuse a field that no point of the spec can use (`values`: every value of each key; `where`:
    the section, grid or fixed, that sets it)."""
    def some(key: str, test) -> bool:
        return any(test(v) for v in values.get(key, ()))

    def refuse(key: str, reason: str) -> None:
        raise SpecError(reason, path=path, field=f"{where.get(key, 'grid')}.{key}")
    syncs = [str(v) for v in values.get("sync", ["allreduce"])]
    for keys, ok, needs in ((PS_ONLY, any(v != "allreduce" for v in syncs), "sync ps, async or ssp"),
                            (ALLREDUCE_ONLY, "allreduce" in syncs, "sync allreduce"),
                            (("staleness",), "ssp" in syncs, "sync ssp")):
        for key in keys:
            if key in values and not ok:
                refuse(key, f"applies to {needs} only, and no point has it (sync: {', '.join(syncs)})")
    kinds = list(values.get("compression", ["none"]))
    for key, needs in (("compression_bits", ("qsgd",)), ("compression_density", ("topk",)),
                       ("compression_error_feedback", _LOSSY)):
        if key in values and not any(k in needs for k in kinds):
            refuse(key, f"applies to compression {' or '.join(needs)} only, and no point has it "
                        f"(compression: {', '.join(map(str, kinds))})")
    jitter = some("jitter", lambda v: v != "none") and some("jitter_cv", lambda v: v > 0)
    stragglers = some("straggler_fraction", lambda v: v > 0) and some("straggler_slowdown", lambda v: v > 1)
    for key, ok, needs in (("jitter", jitter, "a jitter_cv > 0"), ("jitter_cv", jitter, "a jitter distribution"),
                           ("straggler_fraction", stragglers, "a straggler_slowdown > 1"),
                           ("straggler_slowdown", stragglers, "a straggler_fraction > 0"),
                           ("seed", jitter or stragglers, "jitter or stragglers")):
        if key in values and not ok:
            refuse(key, f"no point uses it: it needs {needs} in the grid or fixed")


def simulate_fields(fields: Mapping[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """A point's fields as `simulate()` keywords (nested parts folded into `Compression` and
    `Variability`) and the nested names the point sets (`given`, for the mode checks)."""
    flat = {k: v for k, v in fields.items() if k in NESTED_KEYS}
    out = {k: v for k, v in fields.items() if k not in NESTED_KEYS}
    given: set[str] = set()
    if flat:
        s = _strategy(flat)
        if any(NESTED_KEYS[k][0] == "compression" for k in flat):
            out["compression"] = s.compression
        if any(NESTED_KEYS[k][0] == "variability" for k in flat):
            out["variability"] = s.variability
        for key in flat:
            record, attr = NESTED_KEYS[key]
            if key != "compression":
                given.add(f"compression.{attr}" if record == "compression" else attr)
    return out, given
