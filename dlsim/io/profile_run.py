"""A profile's run sections (``power:``, ``reliability:``, ``storage:``, ``restart:``) into a
`dlsim.spec.run.RunProfile`, converted to SI here (the one place for these keys' units).

```yaml
power:                        # dlsim.cost.power
  device: {idle_w: 70, compute_w: 700, memory_bound_w: 450, communication_w: 300, waiting_w: 120,
           source: "..."}
  node_overhead_w: 1600       # per node, beyond its devices
  pue: 1.1                    # facility power / IT power
  source: "..."
reliability:                  # dlsim.cost.reliability
  node_failures_per_1000_node_days: 6.5
  device_failures_per_1000_device_days: 0     # optional
  planned_interruptions_per_day: 0            # optional, per job
  source: "..."
storage:                      # dlsim.cost.checkpoint
  name: parallel-fs
  write_gbytes_per_s_per_node: 25
  read_gbytes_per_s_per_node: 25
  aggregate_write_gbytes_per_s: 2000
  aggregate_read_gbytes_per_s: 2000
  source: "..."
restart:
  relaunch_s: 600             # detect, replace, relaunch, communicator set-up
  warmup_iterations: 2
  source: "..."
```
Every section needs its `source`. The loader of the rest of the profile (`dlsim.io.profile_yaml`)
accepts these sections and leaves them to this module.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from dlsim import units
from dlsim.errors import SpecError
from dlsim.io.yamlfile import check_keys, expect_mapping, read_yaml
from dlsim.spec.cluster import Cluster
from dlsim.spec.run import DAY, DevicePower, PowerModel, Reliability, Restart, RunProfile, StorageTier

SECTIONS = ("power", "reliability", "storage", "restart")
_DEVICE_POWER = ("idle_w", "compute_w", "memory_bound_w", "communication_w", "waiting_w")
_STORAGE = ("write_gbytes_per_s_per_node", "read_gbytes_per_s_per_node", "aggregate_write_gbytes_per_s",
            "aggregate_read_gbytes_per_s")


def number(data: Mapping, key: str, path: object, field: str, *, default: float | None = None,
           positive: bool = False) -> float:
    """`data[key]` as a finite number, non-negative (or positive); `default` when absent (None: required)."""
    where = f"{field}.{key}" if field else key
    if key not in data or data[key] is None:
        if default is None:
            raise SpecError("missing required field", path=path, field=where)
        return default
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecError(f"must be a number, got {value!r}", path=path, field=where)
    if value < 0 or (positive and value == 0):
        raise SpecError(f"must be {'positive' if positive else 'non-negative'}, got {value!r}", path=path, field=where)
    return float(value)


def _source(data: Mapping, path: object, field: str) -> str:
    src = data.get("source")
    if not isinstance(src, str) or not src.strip():
        raise SpecError("every number here needs its source (a non-empty string)", path=path, field=f"{field}.source")
    return src


def _power(data: Any, path: Path) -> PowerModel:
    data = expect_mapping(data, path, "power")
    check_keys(data, {"device", "node_overhead_w", "pue", "source"}, path, "power")
    dev = expect_mapping(data.get("device"), path, "power.device") if "device" in data else None
    if dev is None:
        raise SpecError("missing required field", path=path, field="power.device")
    check_keys(dev, set(_DEVICE_POWER) | {"source"}, path, "power.device")
    watts = {k: number(dev, k, path, "power.device") for k in _DEVICE_POWER}
    if watts["compute_w"] <= 0:
        raise SpecError("must be positive, got 0", path=path, field="power.device.compute_w")
    over = [k for k in _DEVICE_POWER if watts[k] > watts["compute_w"]]
    if over:
        raise SpecError(f"exceeds compute_w ({watts['compute_w']:g} W): the busiest state draws the most",
                        path=path, field=f"power.device.{over[0]}")
    pue = number(data, "pue", path, "power", default=1.0)
    if pue < 1:
        raise SpecError(f"is facility / IT power and must be at least 1, got {pue:g}", path=path, field="power.pue")
    device = DevicePower(**watts, source=_source(dev, path, "power.device"))
    return PowerModel(device, number(data, "node_overhead_w", path, "power", default=0.0), pue,
                      _source(data, path, "power"))


def _reliability(data: Any, path: Path) -> Reliability:
    data = expect_mapping(data, path, "reliability")
    check_keys(data, {"node_failures_per_1000_node_days", "device_failures_per_1000_device_days",
                      "planned_interruptions_per_day", "source"}, path, "reliability")
    node = number(data, "node_failures_per_1000_node_days", path, "reliability")
    device = number(data, "device_failures_per_1000_device_days", path, "reliability", default=0.0)
    planned = number(data, "planned_interruptions_per_day", path, "reliability", default=0.0)
    return Reliability(node / 1000 / DAY, device / 1000 / DAY, planned / DAY, _source(data, path, "reliability"))


def _storage(data: Any, path: Path) -> StorageTier:
    data = expect_mapping(data, path, "storage")
    check_keys(data, {"name", *_STORAGE, "source"}, path, "storage")
    bw = [number(data, k, path, "storage", positive=True) * units.GBYTE_PER_S for k in _STORAGE]
    return StorageTier(str(data.get("name", "storage")), bw[0], bw[1], bw[2], bw[3], _source(data, path, "storage"))


def _restart(data: Any, path: Path) -> Restart:
    data = expect_mapping(data, path, "restart")
    check_keys(data, {"relaunch_s", "warmup_iterations", "source"}, path, "restart")
    return Restart(number(data, "relaunch_s", path, "restart"),
                   number(data, "warmup_iterations", path, "restart", default=0.0), _source(data, path, "restart"))


def run_profile(data: Mapping[str, Any], path: Path) -> RunProfile:
    """The run sections of a profile's parsed YAML `data` (read from `path`)."""
    sources = data.get("sources") or ()
    return RunProfile(
        power=_power(data["power"], path) if data.get("power") is not None else None,
        reliability=_reliability(data["reliability"], path) if data.get("reliability") is not None else None,
        storage=_storage(data["storage"], path) if data.get("storage") is not None else None,
        restart=_restart(data["restart"], path) if data.get("restart") is not None else None,
        path=str(path), sources=tuple(str(s) for s in sources) if isinstance(sources, list) else ())


def load_run_profile(cluster: Cluster) -> RunProfile:
    """The run sections of the profile `cluster` was loaded from (an empty `RunProfile` for a
    cluster built in code)."""
    if not cluster.source:
        return RunProfile()
    path = Path(cluster.source)
    return run_profile(expect_mapping(read_yaml(path), path, ""), path)
