"""The allocator regime a prediction assumes, and the measured fresh-memory rate it charges.

``device.csv`` beside a calibrated CPU profile holds ``fresh_memory_s_per_byte_t<N>`` rows
(`dlsim.calibrate.alloc_probe`), one per thread count; the rate for the thread count the profile's
tables were measured with (meta.yaml ``timing.threads``) is used, else the nearest measured one.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from dlsim.cost.allocation import REGIMES, AllocatorCost
from dlsim.errors import SpecError
from dlsim.io.yamlfile import read_yaml
from dlsim.spec.cluster import Cluster

_QUANTITY = re.compile(r"^fresh_memory_s_per_byte_t(\d+)$")


def fresh_memory_rates(profile_dir: Path) -> dict[int, float]:
    """Thread count -> measured seconds per byte (empty when the profile has none)."""
    path = profile_dir / "device.csv"
    if not path.exists():
        return {}
    rates = {}
    with open(path) as handle:
        for line, row in enumerate(csv.DictReader(handle), 2):
            m = _QUANTITY.match((row.get("quantity") or "").strip())
            if m:
                try:
                    value = float(row["value"])
                except (TypeError, ValueError):
                    raise SpecError(f"value must be a number, got {row.get('value')!r}", path=path,
                                    field=f"line {line}") from None
                if not value >= 0:
                    raise SpecError(f"value must be non-negative, got {value}", path=path, field=f"line {line}")
                rates[int(m.group(1))] = value
    return rates


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
    return AllocatorCost("default", rates[t], source=f"measured with {t} threads, device.csv"), []
