"""A cluster: one device type, nodes of several devices, an intra-node and an inter-node link tier."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from dlsim.spec.efficiency import DeviceEfficiency
from dlsim.spec.network import FABRICS, NON_BLOCKING, Fabric

BOARDS = ("hybrid-cube-mesh", "pcie-tree", "ring")
"""Intra-node wirings that are not a crossbar; a tier's `bandwidth_efficiency` (a measured bus bandwidth
on that board, e.g. nccl-tests on the DGX-1's hybrid cube-mesh) carries what they cost."""

TOPOLOGIES = NON_BLOCKING + FABRICS + BOARDS


@dataclass(frozen=True)
class Device:
    """One accelerator (or CPU socket). All quantities SI.

    `peak_flops` holds the dense matrix-unit (tensor-core) peak per data type, `vector_flops`
    the peak without matrix units (element-wise work). `compute_efficiency` is the fraction of
    peak that large GEMMs attain; it reaches half of that at `half_efficiency_flops` of work per
    kernel (see `dlsim.cost.roofline`). `memory_efficiency` is the attainable fraction of
    `memory_bandwidth` for streaming kernels. `efficiency` holds measured efficiency curves by
    kernel size (`dlsim.spec.efficiency`), which replace those single numbers where present.
    `overlap_slowdown` is the fraction by which compute kernels slow down while communication
    runs beside them on the same device (shared SMs and memory bandwidth). `memory_reserved` is
    device memory a training process cannot use for tensors (CUDA context, allocator reserve).
    `fp8_efficiency_ratio` scales the bf16 GEMM efficiency for FP8 GEMMs where no FP8 curve is
    given (a published FP8 best-shape fraction over the BF16 one of the same device; 1: unknown).
    `sm_count` is the number of streaming multiprocessors (0: unknown), which communication kernels
    running beside a GEMM take from it (`dlsim.plan.tpoverlap`). `sustained_matrix_fraction` is the
    share of its short-benchmark (burst) matrix throughput the device keeps under the continuous
    tensor-core load of training at its power limit (a sustained measurement over a burst one of the
    same GEMM; 1: not known to differ): it scales every matrix efficiency, the measured curves and
    flash-attention kernels included (`dlsim.cost.roofline.sustained`).
    """

    name: str
    peak_flops: Mapping[str, float]
    vector_flops: Mapping[str, float]
    memory_bytes: float
    memory_bandwidth: float
    launch_overhead: float
    compute_efficiency: float = 0.7
    half_efficiency_flops: float = 1e9
    memory_efficiency: float = 0.8
    efficiency: DeviceEfficiency = field(default_factory=DeviceEfficiency)
    overlap_slowdown: float = 0.0
    memory_reserved: float = 0.0
    fp8_efficiency_ratio: float = 1.0
    sm_count: int = 0
    sustained_matrix_fraction: float = 1.0


@dataclass(frozen=True)
class LinkTier:
    """A level of the network with LogGP parameters (Alexandrov et al., SPAA 1995).

    `latency` L and `bandwidth` (1/G, bytes/s per direction per endpoint) also give the Hockney
    α-β model (α = L + 2o, β = G). `overhead` o is the CPU time to send or receive a message,
    `gap` g the minimum interval between consecutive small messages. `burst` (bytes, 0 = none) and
    `peak_bandwidth` (bytes/s) describe a token-bucket-shaped port (`dlsim.cost.p2p`): up to
    `burst` bytes leave at `peak_bandwidth` once the bucket has refilled at `bandwidth`.
    `bandwidth_efficiency` (default 1) is the achievable fraction of the link rate, e.g. nccl-tests
    bus bandwidth / link rate from a published measurement; the collective and point-to-point costs
    (`dlsim.cost.p2p.p2p_model`) use `bandwidth` × `bandwidth_efficiency`. `topology` names the
    wiring (`TOPOLOGIES`); `fabric` describes the network between nodes when it has shared links
    (`dlsim.spec.network`, priced by `dlsim.cost.fabric`).
    """

    name: str
    latency: float
    bandwidth: float
    overhead: float = 0.0
    gap: float = 0.0
    topology: str = "switch"
    fabric: Fabric = field(default_factory=Fabric)
    burst: float = 0.0
    peak_bandwidth: float = float("inf")
    bandwidth_efficiency: float = 1.0

    @property
    def effective_bandwidth(self) -> float:
        """Achievable bytes/s: `bandwidth` × `bandwidth_efficiency`."""
        return self.bandwidth * self.bandwidth_efficiency

    @property
    def gap_per_byte(self) -> float:
        """G: seconds per byte of a long message (at the achievable bandwidth)."""
        return 1.0 / self.effective_bandwidth


@dataclass(frozen=True)
class Cluster:
    """Nodes × devices per node, links per tier, optional measured tables (kind -> file); `host` is
    each device's own link to host memory (PCIe, NVLink-C2C), used by offloading (None: unknown)."""

    name: str
    device: Device
    nodes: int
    devices_per_node: int
    intra: LinkTier
    inter: LinkTier | None
    reduce_bandwidth: float
    tables: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    source: str = ""
    description: str = ""
    host: LinkTier | None = None

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    def tier(self, ranks: int, ranks_per_node: int | None = None) -> LinkTier:
        """The slowest tier a group of `ranks` consecutive ranks has to cross."""
        per_node = ranks_per_node or self.devices_per_node
        if ranks <= per_node or self.inter is None:
            return self.intra
        return self.inter
