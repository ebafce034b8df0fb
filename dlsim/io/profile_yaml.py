"""Loading a hardware profile (``hardware_profiles/<name>/profile.yaml``) into a `Cluster`.

Every dimensioned key carries its unit in its name (``memory_gib``, ``latency_us``,
``bandwidth_gbytes_per_s`` or ``bandwidth_gbits_per_s``, ``peak_tflops``); values are converted
to SI here.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dlsim import units
from dlsim.errors import SpecError
from dlsim.io.paths import resolve_profile
from dlsim.io.yamlfile import check_keys, expect_mapping, read_yaml
from dlsim.spec.cluster import TOPOLOGIES, Cluster, Device, LinkTier
from dlsim.spec.efficiency import DeviceEfficiency, EfficiencyCurve

_CURVE_UNITS = {"gflop": units.GFLOPS, "mib": units.MIB}

_DEVICE_KEYS = {"name", "peak_tflops", "vector_tflops", "memory_gib", "memory_bandwidth_gbytes_per_s",
                "launch_overhead_us", "compute_efficiency", "half_efficiency_gflop", "memory_efficiency", "source",
                "efficiency", "overlap_slowdown", "memory_reserved_gib", "fp8_efficiency_ratio"}
_LINK_KEYS = {"name", "latency_us", "bandwidth_gbytes_per_s", "bandwidth_gbits_per_s", "overhead_us", "gap_us",
              "topology", "oversubscription", "dims", "source", "burst_bytes", "burst_peak_bandwidth_gbytes_per_s",
              "bandwidth_efficiency"}
_TOP_KEYS = {"name", "description", "device", "nodes", "devices_per_node", "intra_node", "inter_node", "host_link",
             "reduce_bandwidth_gbytes_per_s", "tables", "sources", "notes", "measured",
             # the run sections, read by dlsim.io.profile_run
             "power", "reliability", "storage", "restart"}


def _number(data: dict, key: str, path: Path, field: str, *, default: Any = None, positive: bool = True) -> float:
    if key not in data:
        if default is None:
            raise SpecError("missing required field", path=path, field=f"{field}.{key}")
        return default
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecError(f"must be a number, got {value!r}", path=path, field=f"{field}.{key}")
    if value < 0 or (positive and value == 0):
        raise SpecError(f"must be {'positive' if positive else 'non-negative'}, got {value!r}",
                        path=path, field=f"{field}.{key}")
    return float(value)


def _rates(data: Any, path: Path, field: str) -> dict[str, float]:
    data = expect_mapping(data, path, field)
    out = {}
    for dtype, value in data.items():
        if dtype not in units.DTYPE_BYTES:
            raise SpecError(f"unknown data type (use {', '.join(units.DTYPE_BYTES)})", path=path, field=f"{field}.{dtype}")
        out[dtype] = _number(data, dtype, path, field) * units.TFLOPS
    return out


def _curve(data: Any, path: Path, field: str, size_key: str) -> EfficiencyCurve:
    """One efficiency curve: ``{<size_key>: [increasing sizes], value: [fractions], source: "..."}``."""
    data = expect_mapping(data, path, field)
    check_keys(data, {size_key, "value", "source"}, path, field)
    sizes, values = data.get(size_key), data.get("value")
    for key, seq in ((size_key, sizes), ("value", values)):
        if not isinstance(seq, list) or not seq or len(seq) > 1000 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in seq):
            raise SpecError("must be a non-empty list of positive numbers", path=path, field=f"{field}.{key}")
    if len(sizes) != len(values):
        raise SpecError(f"{size_key} has {len(sizes)} entries, value has {len(values)}", path=path, field=field)
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise SpecError("sizes must increase", path=path, field=f"{field}.{size_key}")
    if any(v > 1 for v in values):
        raise SpecError("efficiencies are fractions of peak and must be at most 1", path=path, field=f"{field}.value")
    if not isinstance(data.get("source"), str) or not data["source"].strip():
        raise SpecError("every efficiency curve needs its source", path=path, field=f"{field}.source")
    scale = _CURVE_UNITS[size_key]
    return EfficiencyCurve(tuple(float(v) * scale for v in sizes), tuple(float(v) for v in values), data["source"])


def _efficiency(data: Any, path: Path) -> DeviceEfficiency:
    field = "device.efficiency"
    data = expect_mapping(data, path, field)
    check_keys(data, {"matrix", "vector", "memory", "kernels"}, path, field)
    matrix = {}
    for dtype, curve in expect_mapping(data.get("matrix", {}) or {}, path, f"{field}.matrix").items():
        if dtype not in units.DTYPE_BYTES:
            raise SpecError(f"unknown data type (use {', '.join(units.DTYPE_BYTES)})", path=path,
                            field=f"{field}.matrix.{dtype}")
        matrix[dtype] = _curve(curve, path, f"{field}.matrix.{dtype}", "gflop")
    vector = _curve(data["vector"], path, f"{field}.vector", "gflop") if data.get("vector") else None
    memory = _curve(data["memory"], path, f"{field}.memory", "mib") if data.get("memory") else None
    kernels = {}
    for op, passes in expect_mapping(data.get("kernels", {}) or {}, path, f"{field}.kernels").items():
        where = f"{field}.kernels.{op}"
        passes = expect_mapping(passes, path, where)
        check_keys(passes, {"forward", "backward_data", "backward_weight", "source"}, path, where)
        if not isinstance(passes.get("source"), str) or not passes["source"].strip():
            raise SpecError("every kernel efficiency needs its source", path=path, field=f"{where}.source")
        for name, value in passes.items():
            if name != "source":
                if _number(passes, name, path, where) > 1:
                    raise SpecError("efficiencies are fractions and must be at most 1", path=path,
                                    field=f"{where}.{name}")
                kernels[f"{op}.{name}"] = (float(value), passes["source"])
    return DeviceEfficiency(MappingProxyType(matrix), vector, memory, MappingProxyType(kernels))


def _device(data: Any, path: Path) -> Device:
    data = expect_mapping(data, path, "device")
    check_keys(data, _DEVICE_KEYS, path, "device")
    peak = _rates(data.get("peak_tflops"), path, "device.peak_tflops") if "peak_tflops" in data else None
    if not peak:
        raise SpecError("missing required field", path=path, field="device.peak_tflops")
    vector = _rates(data["vector_tflops"], path, "device.vector_tflops") if "vector_tflops" in data else dict(peak)
    eff = _number(data, "compute_efficiency", path, "device", default=0.7)
    meff = _number(data, "memory_efficiency", path, "device", default=0.8)
    for key, v in (("compute_efficiency", eff), ("memory_efficiency", meff)):
        if v > 1:
            raise SpecError(f"is a fraction of peak and must be at most 1, got {v}", path=path, field=f"device.{key}")
    return Device(
        name=str(data.get("name", "device")),
        peak_flops=MappingProxyType(peak),
        vector_flops=MappingProxyType(vector),
        memory_bytes=_number(data, "memory_gib", path, "device") * units.GIB,
        memory_bandwidth=_number(data, "memory_bandwidth_gbytes_per_s", path, "device") * units.GBYTE_PER_S,
        launch_overhead=_number(data, "launch_overhead_us", path, "device", default=0.0, positive=False) * units.US,
        compute_efficiency=eff,
        half_efficiency_flops=_number(data, "half_efficiency_gflop", path, "device", default=1.0) * units.GFLOPS,
        memory_efficiency=meff,
        efficiency=_efficiency(data["efficiency"], path) if data.get("efficiency") else DeviceEfficiency(),
        overlap_slowdown=_fraction(data, "overlap_slowdown", path),
        memory_reserved=_number(data, "memory_reserved_gib", path, "device", default=0.0, positive=False) * units.GIB,
        fp8_efficiency_ratio=_number(data, "fp8_efficiency_ratio", path, "device", default=1.0),
    )


def _fraction(data: dict, key: str, path: Path) -> float:
    value = _number(data, key, path, "device", default=0.0, positive=False)
    if value >= 1:
        raise SpecError(f"is a fraction and must be below 1, got {value}", path=path, field=f"device.{key}")
    return value


def _link(data: Any, path: Path, field: str) -> LinkTier:
    data = expect_mapping(data, path, field)
    check_keys(data, _LINK_KEYS, path, field)
    if "bandwidth_gbytes_per_s" in data and "bandwidth_gbits_per_s" in data:
        raise SpecError("give bandwidth in GB/s or in Gbit/s, not both", path=path, field=field)
    if "bandwidth_gbits_per_s" in data:
        bandwidth = _number(data, "bandwidth_gbits_per_s", path, field) * units.GBIT_PER_S
    else:
        bandwidth = _number(data, "bandwidth_gbytes_per_s", path, field) * units.GBYTE_PER_S
    topology = data.get("topology", "switch")
    if topology not in TOPOLOGIES:
        raise SpecError(f"unknown topology {topology!r} (use {', '.join(TOPOLOGIES)})", path=path, field=f"{field}.topology")
    efficiency = _number(data, "bandwidth_efficiency", path, field, default=1.0)
    if efficiency > 1:
        raise SpecError(f"is achievable / link bandwidth and must be at most 1, got {efficiency}", path=path,
                        field=f"{field}.bandwidth_efficiency")
    dims = data.get("dims", [])
    if not isinstance(dims, list) or not all(isinstance(d, int) and d > 0 for d in dims):
        raise SpecError("dims must be a list of positive integers", path=path, field=f"{field}.dims")
    return LinkTier(
        name=str(data.get("name", field)),
        latency=_number(data, "latency_us", path, field, positive=False) * units.US,
        bandwidth=bandwidth,
        overhead=_number(data, "overhead_us", path, field, default=0.0, positive=False) * units.US,
        gap=_number(data, "gap_us", path, field, default=0.0, positive=False) * units.US,
        topology=topology,
        oversubscription=_number(data, "oversubscription", path, field, default=1.0),
        dims=tuple(dims),
        burst=_number(data, "burst_bytes", path, field, default=0.0, positive=False),
        peak_bandwidth=_number(data, "burst_peak_bandwidth_gbytes_per_s", path, field,
                               default=math.inf) * units.GBYTE_PER_S,
        bandwidth_efficiency=efficiency,
    )


def _count(data: dict, key: str, path: Path, default: int | None = None) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"must be a positive integer, got {value!r}", path=path, field=key)
    return value


def load_profile(name_or_path: str | Path) -> Cluster:
    """Load a built-in profile name, a profile directory or a profile.yaml path."""
    folder = resolve_profile(name_or_path)
    path = folder / "profile.yaml" if folder.is_dir() else folder
    data = expect_mapping(read_yaml(path), path, "")
    check_keys(data, _TOP_KEYS, path, "")
    if "device" not in data:
        raise SpecError("missing required field", path=path, field="device")
    device = _device(data["device"], path)
    nodes = _count(data, "nodes", path, 1)
    per_node = _count(data, "devices_per_node", path, 1)
    if "intra_node" not in data:
        raise SpecError("missing required field", path=path, field="intra_node")
    intra = _link(data["intra_node"], path, "intra_node")
    inter = _link(data["inter_node"], path, "inter_node") if data.get("inter_node") else None
    if nodes > 1 and inter is None:
        raise SpecError(f"nodes={nodes} needs an inter_node link tier", path=path, field="inter_node")
    # the device's link to host memory (PCIe, NVLink-C2C): activation and optimizer-state offload
    host = _link(data["host_link"], path, "host_link") if data.get("host_link") else None
    # 0: reductions run inside the transfer kernels (NCCL), so measured bus bandwidths include them
    reduce_bw = _number(data, "reduce_bandwidth_gbytes_per_s", path, "", positive=False,
                        default=device.memory_bandwidth / units.GBYTE_PER_S / 3) * units.GBYTE_PER_S
    tables = expect_mapping(data.get("tables", {}) or {}, path, "tables")
    resolved = {}
    for kind, rel in tables.items():
        resolved[kind] = str((path.parent / str(rel)).resolve())
    return Cluster(
        name=str(data.get("name", path.parent.name)), device=device, nodes=nodes, devices_per_node=per_node,
        intra=intra, inter=inter, reduce_bandwidth=reduce_bw, tables=MappingProxyType(resolved), host=host,
        source=str(path), description=str(data.get("description", "")),
    )
