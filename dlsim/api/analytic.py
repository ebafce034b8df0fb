"""`estimate_strategy()`: a whole strategy's iteration timed by the analytic evaluator, the strategy
search's fast path (`dlsim.plan.evaluate`), from the same scenario the event simulation times.

It answers in milliseconds where the simulation takes a second, and says how far to trust it: within
`EVALUATOR_TOLERANCE` of the simulation where it is exact in composition (tests/test_optimize.py),
`APPROXIMATE_TOLERANCE` where it flags what it does not model (`approximate`). Parameter-server
training, layer groups, run-time variability and gradient compression are the simulation's alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from dlsim.api.gcpause import paused_gc
from dlsim.api.optimize import APPROXIMATE_TOLERANCE, EVALUATOR_TOLERANCE
from dlsim.api.simulate import Builders, Prepared, prepare
from dlsim.errors import SpecError
from dlsim.plan.evaluate import Evaluator, supports
from dlsim.results import SCHEMA_VERSION
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.spec.strategy import Strategy

KIND = "analytic_estimate"
_KEPT = Builders(limit=8)
"""The scenario builders of a script's loaded model and cluster objects, kept across its predictions (as
a sweep's worker keeps them, `Builders`: the same numbers a fresh builder gives), so that a second
strategy on them reuses the layer tables, partitions and collective prices the first one priced."""


def estimate_strategy(model: Model | str | Path, cluster: Cluster | str | Path,
                      strategy: Strategy | str | Path | None = None, *, measured: bool = True,
                      overrides: Mapping[str, Any] | None = None, nodes: int | None = None,
                      given: Iterable[str] = (), **fields: Any) -> dict[str, Any]:
    """The analytic record of `strategy` (a Strategy, a YAML file or strategy fields, completed by its
    stack as `simulate` completes it): iteration time, its split, throughput, memory per pipeline
    stage and whether it fits, the evaluator's flags, how far it is held to the simulation."""
    loaded = isinstance(model, Model) and isinstance(cluster, Cluster) and nodes is None
    p = prepare(model, cluster, strategy, measured=measured, overrides=overrides, nodes=nodes, given=given,
                builders=_KEPT if loaded else None, **fields)
    why = supports(p.strategy)
    if why:
        raise SpecError(f"{why}: drop --analytic to simulate it", field="analytic")
    return estimate_prepared(p)


@paused_gc
def estimate_prepared(p: Prepared) -> dict[str, Any]:
    """The analytic record of a prepared run (`dlsim.api.simulate.prepare`) whose strategy the
    evaluator models (`supports`; `estimate_strategy` checks it)."""
    s = p.strategy
    builder = p.builder
    sc = builder.scenario(s)  # the checks a simulation makes (devices, heads, experts)
    e = Evaluator.of(builder).evaluate(s)
    t = e.iteration_time_s
    device = sc.cluster.device
    samples = s.global_batch / t if t > 0 else 0.0
    tokens = sc.full_model.input_shape[0] if sc.full_model.input_kind == "tokens" else 0
    flops = sc.training_flops
    fits = e.fits
    over = max(range(len(e.memory)), key=lambda r: e.memory[r].total)
    reason = "" if fits else (f"out of memory on stage {over}: needs {e.memory[over].total / 2**30:.4g} GiB, "
                              f"capacity {e.capacity_bytes / 2**30:.4g} GiB")
    return {
        "schema_version": SCHEMA_VERSION, "kind": KIND, "model": sc.full_model.name, "cluster": sc.cluster.name,
        "device": device.name, "strategy": {**s.to_dict(), "dtype": sc.record_dtype}, "dtype": sc.record_dtype,
        "stack": p.stack, "assumed": p.assumed, "feasible": fits, "infeasible_reason": reason,
        "iteration_time_s": t, "breakdown_s": {**e.breakdown(), "total": t},
        "throughput_samples_per_s": samples, "tokens_per_s": samples * tokens if tokens else None,
        "model_tflops_per_gpu": flops / t / s.devices / 1e12 if t > 0 else 0.0,
        "model_flops_utilisation": flops / (t * s.devices * sc.peak_flops) if t > 0 and sc.peak_flops else 0.0,
        "flops_per_iteration": flops, "peak_memory_bytes": e.peak_memory_bytes, "capacity_bytes": e.capacity_bytes,
        "stages": [m.to_dict() | {"total": m.total} for m in e.memory],
        "approximate": list(e.approximate),
        "tolerance": APPROXIMATE_TOLERANCE if e.approximate else EVALUATOR_TOLERANCE,
        "notes": list(sc.notes) + [sc.partition_note],
    }

