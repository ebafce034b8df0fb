"""The allocator regime a prediction assumes, and the measured fresh-memory rate and heap re-fault
fraction it charges; the measured host cost per ATen operator (`host_op_cost`).

``device.csv`` beside a calibrated CPU profile holds ``fresh_memory_s_per_byte_t<N>`` rows
(`dlsim.calibrate.alloc_probe`), one per thread count; the rate for the thread count the profile's
tables were measured with (meta.yaml ``timing.threads``) is used, else the nearest measured one. Its
``heap_refault_fraction`` row (`dlsim.calibrate.loop_probe`) is α of `dlsim.cost.allocation`.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path
from typing import Callable

from dlsim.cost.allocation import REFAULT_QUANTITY, REGIMES, AllocatorCost
from dlsim.cost.hostops import OPTIMIZER_FIT_QUANTITY, OPTIMIZER_QUANTITY, QUANTITIES as HOST_QUANTITIES, HostOpCost
from dlsim.errors import SpecError, excerpt
from dlsim.io.files import read_text
from dlsim.io.yamlfile import read_yaml
from dlsim.spec.cluster import Cluster

_QUANTITY = re.compile(r"^fresh_memory_s_per_byte_t(\d+)$")


def device_quantities(profile_dir: Path, keep: Callable[[str], bool]) -> dict[str, float]:
    """Quantity -> value of the ``device.csv`` rows whose quantity `keep` accepts (each a non-negative
    number; empty when the profile has no device.csv). The whole file is checked, not only the rows
    kept: a damaged device.csv (no ``quantity,value`` header, a row without a name or a finite
    number) is a `SpecError` naming the line, never a file silently ignored."""
    path = profile_dir / "device.csv"
    if not path.exists():
        return {}
    out = {}
    try:
        reader = csv.DictReader(read_text(path, "device table").splitlines())
        header = [h.strip() for h in reader.fieldnames or []]
        if "quantity" not in header or "value" not in header:
            raise SpecError(f"expected a header line with quantity and value columns, got {excerpt(header)}",
                            path=path, field="line 1")
        reader.fieldnames = header
        for line, row in enumerate(reader, 2):
            quantity = (row.get("quantity") or "").strip()
            try:
                value = float(row["value"])
            except (TypeError, ValueError):
                raise SpecError(f"value must be a number, got {excerpt(row.get('value'))}", path=path,
                                field=f"line {line}") from None
            if not quantity or not math.isfinite(value) or None in row:
                raise SpecError("every row needs a quantity and a finite value (and no extra columns)", path=path,
                                field=f"line {line}")
            if keep(quantity):
                if not value >= 0:
                    raise SpecError(f"value must be non-negative, got {value}", path=path, field=f"line {line}")
                out[quantity] = value
    except csv.Error as exc:
        raise SpecError(f"malformed CSV: {excerpt(str(exc), 120)}", path=path) from None
    return out


def fresh_memory_rates(profile_dir: Path) -> dict[int, float]:
    """Thread count -> measured seconds per byte (empty when the profile has none)."""
    rows = device_quantities(profile_dir, lambda q: _QUANTITY.match(q) is not None)
    return {int(_QUANTITY.match(q).group(1)): v for q, v in rows.items()}  # type: ignore[union-attr]


def host_op_cost(cluster: Cluster) -> tuple[HostOpCost | None, list[str]]:
    """The profile's measured host seconds per ATen operator (``host_op_forward_s``, ``host_op_backward_s``
    in device.csv, `dlsim.calibrate.host_ops`) and the optimizer step's in-loop extra
    (``optimizer_in_loop_extra_s`` h and ``optimizer_in_loop_extra_fit_s`` h_fit, `dlsim.calibrate.loop_probe`;
    None where not measured), or None and a note when it measured no host cost."""
    profile_dir = Path(cluster.source).parent if cluster.source else None
    wanted = (*HOST_QUANTITIES, OPTIMIZER_QUANTITY, OPTIMIZER_FIT_QUANTITY)
    rows = device_quantities(profile_dir, lambda q: q in wanted) if profile_dir else {}
    if any(q not in rows for q in HOST_QUANTITIES):
        return None, ["host: the profile measured no host cost per ATen operator (dlsim calibrate compute adds "
                      "it): captured layers pay their kernels only"]
    f, b = (rows[q] for q in HOST_QUANTITIES)
    extra, fit = rows.get(OPTIMIZER_QUANTITY), rows.get(OPTIMIZER_FIT_QUANTITY)
    parts = [f"back-to-back table + {fit * 1e6:.0f} us where the step fits the cache" if fit is not None else "",
             f"flushed-cache table + {extra * 1e6:.0f} us where it does not" if extra is not None else ""]
    loop = ("; optimizer step in the loop (measured by the loop probe): " + ", ".join(p for p in parts if p)
            if any(parts) else "; optimizer step as the tables time it (the profile measured no in-loop extra)")
    return HostOpCost(f, b, "measured by the host probe, device.csv", extra, fit), \
        [f"host: {f * 1e6:.2f} us forward, {b * 1e6:.2f} us backward per ATen operator a captured layer dispatches "
         f"(measured, device.csv){loop}"]


def allocator_cost(cluster: Cluster, regime: str = "default") -> tuple[AllocatorCost, list[str]]:
    """The `AllocatorCost` for `regime` on `cluster` and notes; ``default`` without a measured rate
    falls back to charging nothing, with a note saying so."""
    if regime not in REGIMES:
        raise SpecError(f"unknown allocator {regime!r} (use {', '.join(REGIMES)})", field="allocator")
    if regime != "default":
        return AllocatorCost(regime), []
    profile_dir = Path(cluster.source).parent if cluster.source else None
    rates = fresh_memory_rates(profile_dir) if profile_dir else {}
    if not rates:
        return AllocatorCost("retained"), ["allocator: the profile measured no fresh-memory cost (dlsim calibrate "
                                           "compute adds it): fresh pages of tensors above 32 MiB are not charged"]
    meta = profile_dir / "meta.yaml"
    threads = int(((read_yaml(meta) or {}).get("timing") or {}).get("threads") or max(rates)) if meta.exists() \
        else max(rates)
    t = min(rates, key=lambda n: (abs(n - threads), -n))
    alpha = device_quantities(profile_dir, lambda q: q == REFAULT_QUANTITY).get(REFAULT_QUANTITY)
    if alpha is not None and alpha > 1:
        raise SpecError(f"{REFAULT_QUANTITY} is a share of the bytes allocated, at most 1; got {alpha}",
                        path=profile_dir / "device.csv", field=REFAULT_QUANTITY)
    if alpha is None:
        return AllocatorCost("default", rates[t], source=f"measured with {t} threads, device.csv"), [
            "allocator: the profile measured no heap re-fault fraction (dlsim calibrate compute adds it): only "
            "tensors above 32 MiB are charged fresh pages"]
    return AllocatorCost("default", rates[t], alpha, source=f"page cost measured with {t} threads, re-fault "
                                                              f"fraction by the probe networks, device.csv"), []
