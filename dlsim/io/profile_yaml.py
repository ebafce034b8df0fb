"""Loading a hardware profile (``hardware_profiles/<name>/profile.yaml``) into a `Cluster`.

The file's keys are declared once, as the typed records below (`ProfileFile`; JSON Schema
``dlsim/schemas/profile.schema.json``). Every dimensioned key carries its unit in its name
(``memory_gib``, ``latency_us``, ``bandwidth_gbytes_per_s`` or ``bandwidth_gbits_per_s``,
``peak_tflops``); `_cluster` converts the values to SI, the one place where that happens.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from dlsim import units
from dlsim.errors import SpecError
from dlsim.io.fabric_yaml import FabricFields, read_fabric
from dlsim.io.paths import resolve_profile
from dlsim.io.profile_run import PowerRecord, ReliabilityRecord, RestartRecord, StorageRecord
from dlsim.io.yamlfile import read_yaml
from dlsim.spec.cluster import Cluster, Device, LinkTier
from dlsim.spec.efficiency import AttentionEfficiency, AttentionMeasurements, DeviceEfficiency, EfficiencyCurve
from dlsim.spec.typed import Count, Fraction, NonNegative, Positive, Record, Seq, Text, validate

DType = Literal[tuple(units.DTYPE_BYTES)]  # type: ignore[valid-type]
Rates = Annotated[dict[DType, Positive], Field(min_length=1)]
Source = Annotated[str, Field(min_length=1, pattern=r"\S")]
Points = Annotated[Seq[Positive], Field(min_length=1, max_length=1000)]


class _Curve(Record):
    value: Annotated[Seq[Fraction], Field(min_length=1, max_length=1000)] = Field(
        description="efficiency at each size, a fraction of peak in (0, 1]")
    source: Source = Field(description="where the numbers were measured")


class WorkCurve(_Curve):
    """Efficiency by the work of one kernel (GFLOP), sizes increasing."""

    gflop: Points


class BytesCurve(_Curve):
    """Efficiency by the bytes one kernel moves (MiB), sizes increasing."""

    mib: Points


class KernelEfficiency(Record):
    """A memory-bound kernel's fraction of the memory bandwidth, per pass."""

    forward: Fraction | None = None
    backward_data: Fraction | None = None
    backward_weight: Fraction | None = None
    source: Source


class AttentionKernelRecord(Record):
    """A flash-attention kernel's measured throughput (TFLOP/s, 16-bit) by sequence length, causal
    runs counting half the full products (`dlsim.cost.flash`): each pass on its own (forward_tflops,
    forward_causal_tflops, backward_tflops and optionally backward_causal_tflops), or forward and
    backward timed together (forward_backward_tflops and forward_backward_causal_tflops, the
    backward counted as 2.5 forwards)."""

    seq: Points = Field(description="sequence lengths (keys per query), increasing")
    head_dim: int | None = Field(None, gt=0, description="the head dimension measured (needed when a kernel lists "
                                                         "several measurements)")
    forward_tflops: Points | None = None
    forward_causal_tflops: Points | None = None
    backward_tflops: Points | None = None
    backward_causal_tflops: Points | None = None
    forward_backward_tflops: Points | None = Field(
        None, description="forward and backward timed together, FLOPs 3.5x the forward's")
    forward_backward_causal_tflops: Points | None = None
    source: Source = Field(description="where the numbers were measured")


class Efficiency(Record):
    matrix: dict[DType, WorkCurve] | None = None
    attention: dict[Literal["flash_attention", "cudnn_attention", "xformers_attention", "standard_attention"],
                    AttentionKernelRecord | list[AttentionKernelRecord]] | None = Field(
        None, description="attention kernels measured on their own, one record or one per head dimension: the "
                          "flash kernels (dlsim.cost.flash) and the unfused chain, standard_attention "
                          "(dlsim.cost.unfused)")
    vector: WorkCurve | None = None
    memory: BytesCurve | None = None
    kernels: dict[str, KernelEfficiency] | None = None


class DeviceRecord(Record):
    name: str = "device"
    peak_tflops: Rates = Field(description="dense matrix-unit peak per data type, TFLOP/s")
    vector_tflops: Rates | None = Field(None, description="peak without matrix units, TFLOP/s (default: peak)")
    memory_gib: Positive
    memory_bandwidth_gbytes_per_s: Positive
    launch_overhead_us: NonNegative = 0.0
    compute_efficiency: Fraction = 0.7
    half_efficiency_gflop: Positive = 1.0
    memory_efficiency: Fraction = 0.8
    source: Text | None = None
    efficiency: Efficiency | None = None
    overlap_slowdown: Annotated[float, Field(ge=0, lt=1)] = 0.0
    memory_reserved_gib: NonNegative = 0.0
    fp8_efficiency_ratio: Positive = 1.0
    sm_count: Count | None = Field(None, description="streaming multiprocessors, which tensor-parallel overlap's "
                                   "communication kernels take from the GEMMs beside them (unknown when left out)")
    sustained_matrix_fraction: Fraction = Field(
        1.0, description="sustained / burst matrix throughput of the same GEMM under continuous load at the power "
        "limit; scales the matrix efficiency curves and flash-attention measurements (short benchmarks)")


class LinkRecord(FabricFields):
    """A link tier (LogGP); bandwidth in GB/s or in Gbit/s, not both; its network keys (`FabricFields`:
    topology and the shape of a fabric between nodes, `dlsim.io.fabric_yaml`)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["bandwidth_gbytes_per_s"]},
                                                           {"required": ["bandwidth_gbits_per_s"]}]})
    name: str | None = None
    latency_us: NonNegative
    bandwidth_gbytes_per_s: Positive | None = None
    bandwidth_gbits_per_s: Positive | None = None
    overhead_us: NonNegative = 0.0
    gap_us: NonNegative = 0.0
    source: Text | None = None
    burst_bytes: NonNegative = 0.0
    burst_peak_bandwidth_gbytes_per_s: Positive | None = None
    bandwidth_efficiency: Fraction = Field(1.0, description="achievable / link bandwidth")


class ProfileFile(Record):
    """``profile.yaml``: one device type, nodes of several devices, the link tiers."""

    name: str | None = None
    description: Text = ""
    device: DeviceRecord
    nodes: Count = 1
    devices_per_node: Count = 1
    intra_node: LinkRecord
    inter_node: LinkRecord | None = None
    host_link: LinkRecord | None = Field(None, description="each device's link to host memory (offload)")
    reduce_bandwidth_gbytes_per_s: NonNegative | None = Field(
        None, description="0: reductions run inside the transfer kernels (NCCL); default memory bandwidth / 3")
    tables: dict[str, str] | None = Field(None, description="measured table kind -> file beside profile.yaml")
    sources: Seq[Text] | None = None
    notes: Any = None
    measured: Any = None
    # the run sections (time to train, energy, failures, checkpoints), converted by dlsim.io.profile_run
    power: PowerRecord | None = None
    reliability: ReliabilityRecord | None = None
    storage: StorageRecord | None = None
    restart: RestartRecord | None = None


def _curve(rec: WorkCurve | BytesCurve, path: Path, field: str) -> EfficiencyCurve:
    key, scale = ("gflop", units.GFLOPS) if isinstance(rec, WorkCurve) else ("mib", units.MIB)
    sizes = getattr(rec, key)
    if len(sizes) != len(rec.value):
        raise SpecError(f"{key} has {len(sizes)} entries, value has {len(rec.value)}", path=path, field=field)
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise SpecError("sizes must increase", path=path, field=f"{field}.{key}")
    return EfficiencyCurve(tuple(v * scale for v in sizes), tuple(float(v) for v in rec.value), rec.source)


def _attention(name: str, rec: AttentionKernelRecord, peak_tflops: float | None, path: Path) -> AttentionEfficiency:
    """One attention kernel measured at one head dimension, as fractions of the 16-bit matrix peak."""
    field = f"device.efficiency.attention.{name}"
    if peak_tflops is None:
        raise SpecError("an attention measurement needs the device's bf16 or fp16 peak_tflops", path=path,
                        field=field)
    seq = tuple(float(v) for v in rec.seq)
    if any(b <= a for a, b in zip(seq, seq[1:])):
        raise SpecError("sequence lengths must increase", path=path, field=f"{field}.seq")

    def curve(key: str) -> EfficiencyCurve | None:
        values = getattr(rec, key)
        if values is None:
            return None
        if len(values) != len(seq):
            raise SpecError(f"{key} has {len(values)} entries, seq has {len(seq)}", path=path, field=f"{field}.{key}")
        if max(values) > peak_tflops:
            raise SpecError(f"{key} exceeds the 16-bit peak {peak_tflops:g} TFLOP/s", path=path, field=f"{field}.{key}")
        return EfficiencyCurve(seq, tuple(v / peak_tflops for v in values), rec.source)

    per_pass = ("forward_tflops", "forward_causal_tflops", "backward_tflops")
    together = ("forward_backward_tflops", "forward_backward_causal_tflops")
    given = [key for key in per_pass + ("backward_causal_tflops",) + together if getattr(rec, key) is not None]
    if set(given) & set(together):
        if set(given) != set(together):
            raise SpecError(f"give either {', '.join(together)} or the per-pass curves, not both",
                            path=path, field=field)
        plain, causal = curve(together[0]), curve(together[1])
        return AttentionEfficiency(plain, causal, plain, causal, rec.source, timed_together=True,  # type: ignore[arg-type]
                                   head_dim=rec.head_dim)
    missing = [key for key in per_pass if key not in given]
    if missing:
        raise SpecError(f"missing {', '.join(missing)} (or give {' and '.join(together)})", path=path, field=field)
    return AttentionEfficiency(curve("forward_tflops"), curve("forward_causal_tflops"),  # type: ignore[arg-type]
                               curve("backward_tflops"), curve("backward_causal_tflops"), rec.source,  # type: ignore[arg-type]
                               head_dim=rec.head_dim)


def _attention_kernel(name: str, recs: AttentionKernelRecord | list[AttentionKernelRecord], peak_tflops: float | None,
                      path: Path) -> AttentionMeasurements:
    """One attention kernel's measurements, by increasing head dimension."""
    field = f"device.efficiency.attention.{name}"
    recs = recs if isinstance(recs, list) else [recs]
    if not recs:
        raise SpecError("give at least one measurement", path=path, field=field)
    if len(recs) > 1:
        dims = [r.head_dim for r in recs]
        if any(d is None for d in dims) or len(set(dims)) != len(dims):
            raise SpecError("several measurements need distinct head_dim values", path=path, field=field)
        recs = sorted(recs, key=lambda r: r.head_dim or 0)
        if len({r.forward_backward_tflops is not None for r in recs}) > 1:
            raise SpecError("measurements of one kernel are either all timed together or all per pass",
                            path=path, field=field)
    return AttentionMeasurements(tuple(_attention(name, r, peak_tflops, path) for r in recs))


def _efficiency(rec: Efficiency | None, path: Path, peak_tflops: float | None = None) -> DeviceEfficiency:
    if rec is None:
        return DeviceEfficiency()
    field = "device.efficiency"
    matrix = {dtype: _curve(c, path, f"{field}.matrix.{dtype}") for dtype, c in (rec.matrix or {}).items()}
    kernels = {f"{op}.{name}": (float(value), passes.source) for op, passes in (rec.kernels or {}).items()
               for name, value in passes if name != "source" and value is not None}
    attention = {name: _attention_kernel(name, a, peak_tflops, path) for name, a in (rec.attention or {}).items()}
    return DeviceEfficiency(MappingProxyType(matrix), rec.vector and _curve(rec.vector, path, f"{field}.vector"),
                            rec.memory and _curve(rec.memory, path, f"{field}.memory"), MappingProxyType(kernels),
                            MappingProxyType(attention))


def _device(rec: DeviceRecord, path: Path) -> Device:
    peak = {k: v * units.TFLOPS for k, v in rec.peak_tflops.items()}
    vector = {k: v * units.TFLOPS for k, v in rec.vector_tflops.items()} if rec.vector_tflops else dict(peak)
    if rec.memory_reserved_gib >= rec.memory_gib:
        raise SpecError(f"{rec.memory_reserved_gib:g} GiB reserved is not below the device's memory_gib "
                        f"{rec.memory_gib:g}", path=path, field="device.memory_reserved_gib")
    return Device(
        name=rec.name, peak_flops=MappingProxyType(peak), vector_flops=MappingProxyType(vector),
        memory_bytes=rec.memory_gib * units.GIB,
        memory_bandwidth=rec.memory_bandwidth_gbytes_per_s * units.GBYTE_PER_S,
        launch_overhead=rec.launch_overhead_us * units.US, compute_efficiency=float(rec.compute_efficiency),
        half_efficiency_flops=rec.half_efficiency_gflop * units.GFLOPS,
        memory_efficiency=float(rec.memory_efficiency),
        efficiency=_efficiency(rec.efficiency, path, rec.peak_tflops.get("bf16", rec.peak_tflops.get("fp16"))),
        overlap_slowdown=float(rec.overlap_slowdown), memory_reserved=rec.memory_reserved_gib * units.GIB,
        fp8_efficiency_ratio=float(rec.fp8_efficiency_ratio), sm_count=rec.sm_count or 0,
        sustained_matrix_fraction=float(rec.sustained_matrix_fraction),
    )


def _link(rec: LinkRecord, path: Path, field: str, between_nodes: bool = False) -> LinkTier:
    if rec.bandwidth_gbytes_per_s is not None and rec.bandwidth_gbits_per_s is not None:
        raise SpecError("give bandwidth in GB/s or in Gbit/s, not both", path=path, field=field)
    if rec.bandwidth_gbits_per_s is not None:
        bandwidth = rec.bandwidth_gbits_per_s * units.GBIT_PER_S
    elif rec.bandwidth_gbytes_per_s is not None:
        bandwidth = rec.bandwidth_gbytes_per_s * units.GBYTE_PER_S
    else:
        raise SpecError("missing required field", path=path, field=f"{field}.bandwidth_gbytes_per_s")
    peak = rec.burst_peak_bandwidth_gbytes_per_s
    topology, fabric = read_fabric(rec, path, field, between_nodes=between_nodes)
    return LinkTier(
        name=rec.name if rec.name is not None else field, latency=rec.latency_us * units.US, bandwidth=bandwidth,
        overhead=rec.overhead_us * units.US, gap=rec.gap_us * units.US, topology=topology, fabric=fabric,
        burst=float(rec.burst_bytes),
        peak_bandwidth=math.inf if peak is None else peak * units.GBYTE_PER_S,
        bandwidth_efficiency=float(rec.bandwidth_efficiency),
    )


def _cluster(rec: ProfileFile, path: Path) -> Cluster:
    """The profile in SI units (the one place its file units are converted)."""
    device = _device(rec.device, path)
    intra = _link(rec.intra_node, path, "intra_node")
    inter = _link(rec.inter_node, path, "inter_node", between_nodes=True) if rec.inter_node else None
    if rec.nodes > 1 and inter is None:
        raise SpecError(f"nodes={rec.nodes} needs an inter_node link tier", path=path, field="inter_node")
    host = _link(rec.host_link, path, "host_link") if rec.host_link else None
    reduce = rec.reduce_bandwidth_gbytes_per_s
    reduce_bw = (device.memory_bandwidth / units.GBYTE_PER_S / 3 if reduce is None else reduce) * units.GBYTE_PER_S
    tables = {kind: str((path.parent / rel).resolve()) for kind, rel in (rec.tables or {}).items()}
    return Cluster(
        name=rec.name if rec.name is not None else path.parent.name, device=device, nodes=rec.nodes,
        devices_per_node=rec.devices_per_node, intra=intra, inter=inter, reduce_bandwidth=reduce_bw,
        tables=MappingProxyType(tables), host=host, source=str(path), description=rec.description,
    )


def load_profile(name_or_path: str | Path) -> Cluster:
    """Load a built-in profile name, a profile directory or a profile.yaml path."""
    folder = resolve_profile(name_or_path)
    path = folder / "profile.yaml" if folder.is_dir() else folder
    return _cluster(validate(ProfileFile, read_yaml(path), path), path)
