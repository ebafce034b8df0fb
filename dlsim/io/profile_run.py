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
Every section needs its `source`. The sections are typed records (`RunSections`); the profile's own record
(`dlsim.io.profile_yaml.ProfileFile`) holds them too, so that the profile's JSON Schema describes them and
a bad value is refused when the profile is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Mapping

from pydantic import ConfigDict, Field

from dlsim import units
from dlsim.errors import SpecError
from dlsim.io.yamlfile import read_yaml
from dlsim.spec.cluster import Cluster
from dlsim.spec.run import DAY, DevicePower, PowerModel, Reliability, Restart, RunProfile, StorageTier
from dlsim.spec.typed import NonNegative, Positive, Record, Seq, Text, validate

SECTIONS = ("power", "reliability", "storage", "restart")
_DEVICE_POWER = ("idle_w", "compute_w", "memory_bound_w", "communication_w", "waiting_w")
Source = Annotated[str, Field(min_length=1, max_length=4096, pattern=r"\S",
                              description="where the numbers come from (every number here needs its source)")]


class DevicePowerRecord(Record):
    """Watts one device draws in each state; the busiest (compute) draws the most."""

    idle_w: NonNegative
    compute_w: Positive
    memory_bound_w: NonNegative
    communication_w: NonNegative
    waiting_w: NonNegative
    source: Source


class PowerRecord(Record):
    device: DevicePowerRecord
    node_overhead_w: NonNegative = Field(0.0, description="per node, beyond its devices")
    pue: Annotated[float, Field(ge=1)] = Field(1.0, description="facility power / IT power")
    source: Source


class ReliabilityRecord(Record):
    node_failures_per_1000_node_days: NonNegative
    device_failures_per_1000_device_days: NonNegative = 0.0
    planned_interruptions_per_day: NonNegative = Field(0.0, description="per job")
    source: Source


class StorageRecord(Record):
    name: str = "storage"
    write_gbytes_per_s_per_node: Positive
    read_gbytes_per_s_per_node: Positive
    aggregate_write_gbytes_per_s: Positive
    aggregate_read_gbytes_per_s: Positive
    source: Source


class RestartRecord(Record):
    relaunch_s: NonNegative = Field(description="detect, replace, relaunch, communicator set-up")
    warmup_iterations: NonNegative = 0.0
    source: Source


class RunSections(Record):
    """The run sections of a profile (the rest of the file is `dlsim.io.profile_yaml.ProfileFile`'s)."""

    model_config = ConfigDict(extra="ignore")
    power: PowerRecord | None = None
    reliability: ReliabilityRecord | None = None
    storage: StorageRecord | None = None
    restart: RestartRecord | None = None
    sources: Seq[Text] | None = None


def _power(rec: PowerRecord, path: Path) -> PowerModel:
    watts = {k: getattr(rec.device, k) for k in _DEVICE_POWER}
    over = [k for k in _DEVICE_POWER if watts[k] > watts["compute_w"]]
    if over:
        raise SpecError(f"exceeds compute_w ({watts['compute_w']:g} W): the busiest state draws the most",
                        path=path, field=f"power.device.{over[0]}")
    return PowerModel(DevicePower(**watts, source=rec.device.source), rec.node_overhead_w, rec.pue, rec.source)


def run_profile(data: Mapping[str, Any], path: Path) -> RunProfile:
    """The run sections of a profile's parsed YAML `data` (read from `path`), in SI (the one place)."""
    rec = validate(RunSections, data, path)
    r, st, rs = rec.reliability, rec.storage, rec.restart
    return RunProfile(
        power=_power(rec.power, path) if rec.power else None,
        reliability=Reliability(r.node_failures_per_1000_node_days / 1000 / DAY,
                                r.device_failures_per_1000_device_days / 1000 / DAY,
                                r.planned_interruptions_per_day / DAY, r.source) if r else None,
        storage=StorageTier(st.name, *(getattr(st, k) * units.GBYTE_PER_S for k in (
            "write_gbytes_per_s_per_node", "read_gbytes_per_s_per_node", "aggregate_write_gbytes_per_s",
            "aggregate_read_gbytes_per_s")), st.source) if st else None,
        restart=Restart(rs.relaunch_s, rs.warmup_iterations, rs.source) if rs else None,
        path=str(path), sources=tuple(rec.sources or ()))


def load_run_profile(cluster: Cluster) -> RunProfile:
    """The run sections of the profile `cluster` was loaded from (an empty `RunProfile` for a
    cluster built in code)."""
    if not cluster.source:
        return RunProfile()
    path = Path(cluster.source)
    return run_profile(read_yaml(path), path)
