"""`validate_torch()`: a user's own PyTorch module, trained in a plain loop, against dlsim's prediction.

The module built by ``FILE.py:FACTORY`` is captured at the operator level (`dlsim.api.importers`,
torch.export) and given the loop's loss (`training_model`: cross-entropy over the output's last
dimension, as `dlsim.validate.torch_loop` trains it); dlsim predicts one training step of it on the
profile (`estimate`, the allocator regime of the process measured) and the step is timed in a fresh
process running the plain loop (`dlsim.validate.torch_loop.time_in_worker`). The record compares the
two end to end, per phase and per operator kind (ATen self times from the profiler against the
predicted layers of that kind); it is the record `validate model` writes, with ``kind:
validate-torch`` and per-kind rows in ``layers``.
"""

from __future__ import annotations

import functools
import math
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from dlsim.api.estimate import estimate
from dlsim.api.importers import import_torch_file, load_factory
from dlsim.api.models import as_cluster, check_batch
from dlsim.api.validate import _model_record, rel_error, set_allocator
from dlsim.calibrate.compute_ops import make_optimizer
from dlsim.calibrate.compute_timer import STATISTICS, check_device, set_threads, warm_allocator
from dlsim.errors import SpecError
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.validate.compute_iteration import MeasuredIteration
from dlsim.progress import PHASE_DONE, PHASE_RUNNING, PHASE_WAITING
from dlsim.validate.torch_loop import KINDS, layer_kind, time_in_worker

LOSS = "train_loss"


def training_model(factory: str, input_shape: Sequence[int], *, tokens: bool = False, vocab: int = 2,
                   cluster: Cluster | str | Path | None = None, name: str | None = None) -> tuple[Model, Any]:
    """(the imported model with the plain loop's loss appended, the import record)."""
    from dlsim.importers.graph import to_yaml
    from dlsim.io.model_yaml import load_model
    imported = import_torch_file(factory, list(input_shape), tokens=tokens, vocab=vocab, cluster=cluster, name=name)
    last = imported.model.layers[-1]
    desc = dict(imported.description)
    layers = list(desc["layers"])
    src = last.name
    if len(last.out_shape) > 2:  # every position a sample, as the loop's reshape(-1, C) does
        layers.append({"name": f"{LOSS}_view", "type": "reshape",
                       "shape": [math.prod(last.out_shape[:-1]), last.out_shape[-1]], "inputs": [src]})
        src = f"{LOSS}_view"
    layers.append({"name": LOSS, "type": "cross_entropy", "inputs": [src]})
    desc["layers"] = layers
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{desc['name']}.yaml"
        path.write_text(to_yaml(desc, f"{desc['name']}: {factory} with the plain loop's cross-entropy loss"))
        model = load_model(path)
    from dataclasses import replace
    return replace(model, source=""), imported


def validate_torch(factory: str, input_shape: Sequence[int], batch: int, cluster: Cluster | str | Path, *,
                   tokens: bool = False, vocab: int = 2, optimizer: str = "adam", repeats: int = 10, warmup: int = 3,
                   profile_steps: int = 3, threads: int | None = None, statistic: str = "median",
                   allocator: str = "default", name: str | None = None,
                   progress: Callable[[int, int, str, str], None] | None = None) -> dict[str, Any]:
    """Predicted vs measured plain-loop training step of the module `factory` builds (module docstring);
    `progress` hears of each phase (`dlsim.progress.Progress.callback`)."""
    cluster = as_cluster(cluster)
    batch = check_batch(batch)
    if repeats < 1 or warmup < 0:
        raise SpecError("repeats must be >= 1 and warmup >= 0", field="repeats")
    for label, value in (("threads", threads), ("vocab", vocab), ("profile_steps", profile_steps)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise SpecError(f"must be a positive integer, got {value!r}", field=label)  # before the timing process
    if statistic not in STATISTICS:
        raise SpecError(f"unknown statistic {statistic!r} (use {' or '.join(STATISTICS)})", field="statistic")
    check_device("cpu")
    regime = set_allocator(allocator) if allocator != "retained" else "retained"
    say = progress or (lambda *args: None)
    say(0, 3, f"capturing {factory} with torch.export", PHASE_RUNNING)
    model, imported = training_model(factory, input_shape, tokens=tokens, vocab=vocab, cluster=cluster, name=name)
    say(1, 3, "predicting", PHASE_RUNNING)
    predicted = estimate(model, cluster, batch, optimizer=optimizer, allocator=regime)
    say(2, 3, f"timing {warmup} + {repeats} plain-loop steps (and {profile_steps} profiled) in a fresh process",
        PHASE_WAITING)
    run = time_in_worker(factory, input_shape, batch, loader=load_factory, make_optimizer=make_optimizer,
                         prepare=functools.partial(prepare_process, threads, regime), tokens=tokens, vocab=vocab,
                         optimizer=optimizer, warmup=warmup, steps=repeats, profile_steps=profile_steps)
    say(3, 3, "measured", PHASE_DONE)
    return torch_record(model, imported, cluster, batch, optimizer, predicted, run, statistic, regime, factory,
                        list(input_shape))


def prepare_process(threads: int | None, regime: str) -> None:
    """In the timing process: the intra-op threads and, for ``retained``, the allocator tuned as calibration runs."""
    set_threads(threads)
    if regime == "retained":
        warm_allocator()


def kind_rows(predicted: Any, model: Model, ops: dict[str, float]) -> list[dict[str, Any]]:
    """Per operator kind: predicted forward/backward (layers of that kind) against the profiled ATen time."""
    rows = []
    for kind in KINDS:
        if kind == "optimizer":
            pf, pb = predicted.optimizer_step.seconds, 0.0
        else:
            timings = [t for t in predicted.layers if layer_kind(model.layer(t.name).type) == kind]
            pf = sum(t.forward.seconds for t in timings)
            pb = sum(t.backward_data.seconds + t.backward_weight.seconds for t in timings)
        measured = ops.get(kind, 0.0)
        if pf + pb == 0 and not measured:
            continue
        rows.append({"name": kind, "type": "operator kind", "predicted_forward_s": pf, "predicted_backward_s": pb,
                     "predicted_s": pf + pb, "measured_s": measured,
                     "error": rel_error(pf + pb, measured) if measured > 0 else None, "source": ""})
    return rows


def torch_record(model: Model, imported: Any, cluster: Cluster, batch: int, optimizer: str, predicted: Any,
                 run: dict[str, Any], statistic: str, regime: str, factory: str,
                 input_shape: list[int]) -> dict[str, Any]:
    """The validate-torch record (see the module docstring)."""
    measured = MeasuredIteration(tuple(tuple(s) for s in run["samples"]), {}, run["threads"], run["optimizer_impl"],
                                 run.get("faulted_bytes_per_step"))
    rec = _model_record(model, cluster, batch, "cpu", model.dtype, optimizer, predicted, measured, statistic, regime,
                        len(run["samples"]))
    rows = kind_rows(predicted, model, run["ops"]) if run.get("ops") else []
    profiled = sum(r["measured_s"] for r in rows)
    rec.update(kind="validate-torch", factory=factory, input_shape=input_shape, parameters=run["parameters"],
               layers=rows, process="a fresh process running the plain loop (zero_grad, forward, cross-entropy, "
                                   "backward, step)",
               per_layer={"operator_kinds": len(rows), "profiled_step_s": profiled,
                          "time_weighted_abs_error": sum(abs(r["predicted_s"] - r["measured_s"]) for r in rows)
                          / max(profiled, 1e-30),
                          "layers_over_1pct": {}, "measured_layer_sum_s": profiled},
               imported={"layers": len(model.layers), "fallback_share": imported.fallback_share,
                         "fallbacks": [f.op for f in imported.fallbacks], "notes": list(imported.notes)})
    return rec
