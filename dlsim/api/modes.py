"""Options that only mean something in one mode are refused in the others (issue 16).

An option the run would ignore is refused with one line naming it and what it needs, never
accepted silently: `iterations`, `ps_shards`, `fetch_every` and `push_every` belong to
parameter-server training (sync ps | async | ssp), `staleness` to SSP, gradient buckets, overlap
and compression to all-reduce; a compression parameter to its compressor; jitter needs a
coefficient of variation (and the other way round), stragglers a fraction and a slowdown, a seed
something to draw; `recompute_layers` full recomputation; `tp_async_backward` tp >= 2.

`given` names the strategy fields the user set (CLI flags, strategy-file keys; `compression.bits`,
`jitter_cv`, ...); a nested field of `compression` or `variability` also counts as given when its
value is not the default.
"""

from __future__ import annotations

from typing import Iterable

from dlsim.errors import SpecError
from dlsim.spec.strategy import Compression, Strategy, Variability

PS_ONLY = ("iterations", "ps_shards", "fetch_every", "push_every")
ALLREDUCE_ONLY = ("bucket_size", "first_bucket_size", "overlap")
_SYNC_HINT = "--sync ps, async or ssp"


def _refuse(field: str, reason: str) -> None:
    raise SpecError(reason, field=field)


def check_mode_fields(s: Strategy, given: Iterable[str]) -> Strategy:
    """Refuse fields of `s` (named in `given`, or nested and not default) that its mode ignores."""
    given = set(given)
    if s.sync == "allreduce":
        for name in PS_ONLY:
            if name in given:
                _refuse(name, f"applies to parameter-server training only ({_SYNC_HINT}); sync is allreduce")
    else:
        for name in ALLREDUCE_ONLY:
            if name in given:
                _refuse(name, f"applies to all-reduce gradient synchronisation only; sync is {s.sync}")
        if s.compression.kind != "none":
            _refuse("compression", f"compresses all-reduce traffic only; sync is {s.sync}")
    if "staleness" in given and s.sync != "ssp":
        _refuse("staleness", f"is the SSP staleness bound and needs sync ssp; sync is {s.sync}")
    c, c0 = s.compression, Compression()

    def set_(name: str, value: object, default: object) -> bool:
        return name in given or value != default

    for name, needs in (("bits", "qsgd"), ("bucket_elements", ("qsgd", "topk")), ("density", "topk"),
                        ("value_bits", "topk")):
        if set_(f"compression.{name}", getattr(c, name), getattr(c0, name)) and c.kind not in needs:
            _refuse(f"compression.{name}", f"needs compression {needs}; compression is {c.kind}")
    if set_("compression.error_feedback", c.error_feedback, c0.error_feedback) and c.kind in ("none", "fp16"):
        _refuse("compression.error_feedback", f"needs a lossy compression (qsgd, topk, 1bit); compression is {c.kind}")
    v, v0 = s.variability, Variability()
    if set_("jitter", v.jitter, v0.jitter) and not v.jitter_cv > 0:
        _refuse("jitter", "needs a jitter_cv > 0 (the coefficient of variation)")
    if set_("jitter_cv", v.jitter_cv, v0.jitter_cv) and v.jitter == "none":
        _refuse("jitter_cv", "needs a jitter distribution (jitter normal, lognormal, exponential or uniform)")
    if set_("straggler_fraction", v.straggler_fraction, v0.straggler_fraction) and v.straggler_slowdown == 1.0:
        _refuse("straggler_fraction", "needs a straggler_slowdown > 1")
    if set_("straggler_slowdown", v.straggler_slowdown, v0.straggler_slowdown) and not v.straggler_fraction > 0:
        _refuse("straggler_slowdown", "needs a straggler_fraction > 0")
    if set_("seed", v.seed, v0.seed) and not v.active:
        _refuse("seed", "seeds the variability draws and needs jitter, stragglers or device slowdowns")
    if "recompute_layers" in given and s.recompute != "full":
        _refuse("recompute_layers", f"needs recompute full; recompute is {s.recompute}")
    if s.tp_async_backward and s.tp < 2:
        _refuse("tp_async_backward", f"overlaps tensor-parallel collectives and needs tp >= 2; tp is {s.tp}")
    return s
