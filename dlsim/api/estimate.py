"""`estimate()`: one device, one training iteration."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from dlsim.api.models import as_cluster, as_model, check_batch, check_dtype
from dlsim.cost.estimate import estimate_iteration
from dlsim.cost.memory import OPTIMIZERS
from dlsim.errors import SpecError
from dlsim.results import EstimateResult
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model


DEFAULT_BATCH = 32
DEFAULT_OPTIMIZER = "adam"


def estimate(model: Model | str | Path, cluster: Cluster | str | Path, batch: int | None = None, *,
             dtype: str | None = None, optimizer: str | None = None, measured: bool = True,
             overrides: Mapping[str, Any] | None = None, allocator: str | None = None) -> EstimateResult:
    """Predict one training iteration of `model` on one device of `cluster`.

    Kernel times come from the profile's measured tables where it has them (`measured=True`)
    and from the roofline model otherwise; every layer's estimate says which. A measured CPU profile
    used on a host other than the one it records gets a one-line warning with the measured speed
    ratio (`dlsim.api.hostcheck`). On a measured CPU profile the step is predicted for a process with
    `allocator` ``default`` (glibc as it comes: fresh pages for tensors above the mmap ceiling and the
    measured re-fault share of the heap's bytes are charged at the profile's measured rate,
    `dlsim.cost.allocation`; the default), ``retained`` or a
    named allocator; the regime is listed in ``assumed``. Defaults filled in
    (batch 32, the model's dtype, optimizer adam) are listed in the record's ``assumed``.
    """
    model, cluster = as_model(model, overrides), as_cluster(cluster)
    assumed: dict[str, Any] = {}
    if batch is None:
        batch = assumed["batch"] = DEFAULT_BATCH
    if dtype is None:
        assumed["dtype"] = model.dtype
    if optimizer is None:
        optimizer = assumed["optimizer"] = DEFAULT_OPTIMIZER
    batch, dtype = check_batch(batch), check_dtype(dtype, model)
    if dtype == "fp8":  # mixed FP8 / BF16 training is the simulator's (dlsim.plan.fp8), not one precision throughout
        from dlsim.plan.fp8 import check_fp8
        check_fp8(cluster.device, cluster.name)
        raise SpecError("estimate prices one precision throughout; FP8 training (FP8 GEMMs, BF16 elsewhere, as "
                        "Transformer Engine runs it) is priced by dlsim simulate --dtype fp8", field="dtype")
    if optimizer not in OPTIMIZERS:
        raise SpecError(f"unknown optimizer {optimizer!r} (use {', '.join(OPTIMIZERS)})", field="optimizer")
    tables, notes = None, []
    if measured and cluster.tables:
        from dlsim.io.kernel_tables import load_kernel_times
        tables, notes = load_kernel_times(cluster)
    warnings: list[str] = []
    host: dict[str, Any] = {}
    alloc = hostops = None
    if tables is not None:
        from dlsim.api.hostcheck import host_check, profile_meta
        warnings, host_notes, host = host_check(cluster)
        notes = [*notes, *host_notes]
        if (profile_meta(cluster).get("device") or {}).get("kind") == "cpu":
            from dlsim.io.allocator_table import allocator_cost, host_op_cost
            alloc, alloc_notes = allocator_cost(cluster, allocator or "default")
            notes = [*notes, *alloc_notes, f"allocator: {alloc.describe()}"]
            if any(layer.attrs.get("host_ops") for layer in model.layers):
                hostops, host_op_notes = host_op_cost(cluster)
                notes = [*notes, *host_op_notes]
            if allocator is None:
                assumed["allocator"] = alloc.describe()
    result = estimate_iteration(model, cluster, batch, dtype=dtype, optimizer=optimizer, tables=tables,
                                notes=tuple(notes), allocator=alloc, host=hostops)
    return replace(result, assumed=assumed, warnings=tuple(warnings), host=host)
