"""Built-in hardware profiles: they load, their numbers convert to the right SI values, every number
carries a source comment, and bad profile files give one-line SpecErrors (issue 2, part 5)."""

from __future__ import annotations

import re

import pytest

from dlsim import units
from dlsim.errors import SpecError
from dlsim.io.paths import list_profiles, resolve_profile
from dlsim.io.profile_yaml import load_profile
from dlsim.spec.cluster import TOPOLOGIES

BUILT_IN = ["aws-p3", "cpu-cluster", "dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72", "mi300x",
            "dgx1-p100", "dgx1-v100", "gpu-2013", "piz-daint"]
NO_MATRIX_UNITS = ["dgx1-p100", "piz-daint", "gpu-2013", "cpu-cluster"]


def test_every_built_in_profile_is_listed():
    assert set(BUILT_IN) <= {p.name for p in list_profiles()}


@pytest.mark.parametrize("name", BUILT_IN)
def test_profile_loads_and_is_consistent(name):
    c = load_profile(name)
    d = c.device
    assert c.name == name and c.num_devices == c.nodes * c.devices_per_node
    assert "fp32" in d.peak_flops and "fp32" in d.vector_flops
    # vector (non-matrix) rates exist only for types the device computes, and never beat the matrix peak
    assert set(d.vector_flops) <= set(d.peak_flops)
    for dtype, rate in d.vector_flops.items():
        assert 0 < rate <= d.peak_flops[dtype]
    assert d.memory_bytes > units.GIB and d.memory_bandwidth > units.GBYTE_PER_S
    assert 0 < d.compute_efficiency <= 1 and 0 < d.memory_efficiency <= 1
    tiers = [c.intra] + ([c.inter] if c.inter else [])
    assert c.inter is not None or c.nodes == 1
    for tier in tiers:
        assert tier.topology in TOPOLOGIES
        assert tier.latency > 0 and tier.bandwidth > 0 and tier.overhead > 0 and tier.gap > 0
    # the inter-node tier is never faster per device than the intra-node one
    if c.inter is not None and c.devices_per_node > 1:
        assert c.inter.bandwidth < c.intra.bandwidth


@pytest.mark.parametrize("name", NO_MATRIX_UNITS)
def test_devices_without_matrix_units_have_equal_tables(name):
    d = load_profile(name).device
    assert dict(d.peak_flops) == dict(d.vector_flops)


_NUMBER_LINE = re.compile(r"^\s*(\w+):\s*([-+]?[\d.]+(e[-+]?\d+)?\s*(#|$)|\{)")


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_number_has_a_source_or_estimate_comment(name):
    """Each numeric line carries a comment on the line itself or on the comment line(s) just above."""
    lines = (resolve_profile(name) / "profile.yaml").read_text().splitlines()
    bare = []
    for i, line in enumerate(lines):
        if _NUMBER_LINE.match(line) and "#" not in line:
            above = lines[i - 1].strip() if i else ""
            if not above.startswith("#"):
                bare.append(f"line {i + 1}: {line.strip()}")
    assert not bare, f"numbers without a source comment in {name}: {bare}"


# --- spot checks of the converted SI values -------------------------------------------------

def test_dgx1_p100_matches_the_seed_system_specification():
    """S004 L84-87 (seeds-inventory.md §9): 8x Tesla GP100, '170' TFLOPS GPU FP16, 16 GB per GPU."""
    c = load_profile("dgx1-p100")
    assert c.devices_per_node == 8
    node_fp16 = c.devices_per_node * c.device.peak_flops["fp16"]
    assert node_fp16 == pytest.approx(170 * units.TFLOPS, rel=0.01)      # 8 x 21.2 = 169.6
    assert c.device.peak_flops["fp16"] == pytest.approx(2 * c.device.peak_flops["fp32"])
    assert c.device.memory_bytes == 16 * units.GIB
    # S004 L91 "4 IB EDR": 4 x 100 Gb/s per node, shared by the 8 GPUs
    assert c.inter.bandwidth * c.devices_per_node == pytest.approx(4 * 100 * units.GBIT_PER_S)
    # NVLink 1: 4 links x 20 GB/s per direction per GPU
    assert c.intra.bandwidth == pytest.approx(4 * 20 * units.GBYTE_PER_S)
    assert c.intra.topology == "hybrid-cube-mesh"


def test_v100_tensor_cores_and_missing_types():
    for name in ("dgx1-v100", "aws-p3"):
        d = load_profile(name).device
        assert d.peak_flops["fp16"] == pytest.approx(125 * units.TFLOPS)
        assert d.vector_flops["fp16"] == pytest.approx(2 * d.vector_flops["fp32"])
        assert "bf16" not in d.peak_flops and "tf32" not in d.peak_flops   # Volta has neither
        assert d.memory_bandwidth == pytest.approx(900 * units.GBYTE_PER_S)


def test_a100_numbers():
    c = load_profile("dgx-a100")
    d = c.device
    assert d.peak_flops["tf32"] == pytest.approx(156e12) and d.peak_flops["bf16"] == pytest.approx(312e12)
    assert d.vector_flops["bf16"] == pytest.approx(39e12) and d.vector_flops["fp16"] == pytest.approx(78e12)
    assert "tf32" not in d.vector_flops                                  # tf32 exists only on tensor cores
    assert d.memory_bytes == 81920 * units.MIB
    assert d.memory_bandwidth == pytest.approx(2039e9)
    assert c.intra.bandwidth == pytest.approx(600e9 / 2)                 # 600 GB/s bidirectional
    assert c.inter.bandwidth == pytest.approx(200e9 / 8)                 # one HDR 200 Gb/s NIC per GPU


def test_h100_memory_is_what_nvml_reports_not_decimal_80gb():
    d = load_profile("dgx-h100").device
    assert d.memory_bytes == pytest.approx(81559 * units.MIB, rel=1e-4)
    assert d.memory_bytes > 80 * units.GB * 0.99                          # not the 74.5 GiB of a decimal reading
    assert "fp8" in d.peak_flops and "fp8" not in d.vector_flops


def test_aws_p3_ethernet_is_shared_by_eight_gpus():
    c = load_profile("aws-p3")
    assert c.inter.bandwidth * c.devices_per_node == pytest.approx(25 * units.GBIT_PER_S)
    assert c.inter.latency > 5 * load_profile("dgx1-v100").inter.latency  # TCP, no RDMA


def test_gpu_2013_kepler_cluster():
    c = load_profile("gpu-2013")
    assert c.num_devices == 64 and c.devices_per_node == 4
    assert set(c.device.peak_flops) == {"fp64", "fp32"}                   # no fp16 arithmetic on Kepler
    assert c.device.peak_flops["fp32"] == pytest.approx(3.52e12)
    assert c.device.memory_bytes == pytest.approx(0.9 * 5 * units.GIB)   # ECC on takes 10%
    fdr_data_rate = 4 * 14.0625 * 64 / 66 * units.GBIT_PER_S            # 4x FDR after 64b/66b
    assert c.inter.bandwidth * c.devices_per_node == pytest.approx(fdr_data_rate, rel=1e-3)
    assert c.intra.bandwidth == pytest.approx(8 * units.GBYTE_PER_S)     # PCIe 2.0 x16
    assert c.intra.topology == "pcie-tree"


def test_piz_daint():
    c = load_profile("piz-daint")
    assert c.devices_per_node == 1 and c.num_devices == 5320
    assert c.inter.topology == "dragonfly"
    f = c.inter.fabric
    assert f.nodes_per_router == 4 and f.routers_per_group == 96 and f.global_links == 10
    assert f.global_bandwidth == pytest.approx(37.5 * units.GBIT_PER_S)
    assert c.device.peak_flops["fp16"] == pytest.approx(18.7e12)
    assert c.tier(64) is c.inter and c.tier(1) is c.intra


def test_cpu_cluster_socket_is_the_device():
    c = load_profile("cpu-cluster")
    d = c.device
    assert c.devices_per_node == 2
    assert d.peak_flops["fp32"] == pytest.approx(28 * 2.7e9 * 64)       # 2 AVX-512 FMA x 16 lanes x 2
    assert d.peak_flops["fp64"] == pytest.approx(d.peak_flops["fp32"] / 2)
    assert d.memory_bandwidth == pytest.approx(6 * 2933e6 * 8, rel=1e-3)
    assert d.memory_bytes == 96 * units.GIB
    leaf = c.inter.fabric.levels[0]
    assert c.inter.fabric.kind == "fat-tree" and leaf.fanout == 44
    assert leaf.oversubscription == pytest.approx(22 / 18, rel=1e-4)
    assert c.inter.bandwidth * c.devices_per_node == pytest.approx(100 * units.GBIT_PER_S)


# --- bad profile files: one-line SpecError naming file, field and reason --------------------

GOOD = """\
name: p
device:
  peak_tflops: {fp32: 10}
  memory_gib: 16
  memory_bandwidth_gbytes_per_s: 700
intra_node: {latency_us: 5, bandwidth_gbytes_per_s: 20}
"""


def _write(tmp_path, text):
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    return path


def test_good_minimal_profile_loads(tmp_path):
    c = load_profile(_write(tmp_path, GOOD))
    assert c.device.peak_flops["fp32"] == 10e12 and c.device.memory_bytes == 16 * units.GIB
    assert c.intra.bandwidth == 20e9 and c.inter is None


@pytest.mark.parametrize("text,field,reason", [
    (GOOD.replace("latency_us: 5,", "latency_us: 5, topology: hypercube,"),
     "intra_node.topology", "unknown topology 'hypercube'"),
    (GOOD.replace("bandwidth_gbytes_per_s: 20", "bandwidth_gbytes_per_s: -20"),
     "intra_node.bandwidth_gbytes_per_s", "must be positive"),
    (GOOD.replace("latency_us: 5", "latency_us: -1"), "intra_node.latency_us", "must be non-negative"),
    ("name: p\nintra_node: {latency_us: 5, bandwidth_gbytes_per_s: 20}\n", "device", "missing required field"),
    ("name: p\ndevice: 3\nintra_node: {latency_us: 5, bandwidth_gbytes_per_s: 20}\n", "device", "must be a mapping"),
    (GOOD.replace("device:\n", "device: {}\n").replace("  peak_tflops: {fp32: 10}\n  memory_gib: 16\n"
                                                        "  memory_bandwidth_gbytes_per_s: 700\n", ""),
     "device.peak_tflops", "missing required field"),
    (GOOD.replace("{fp32: 10}", "{fp32: 10"), "line", "malformed YAML"),
    (GOOD.replace("bandwidth_gbytes_per_s: 20", "bandwidth_gbytes_per_s: 20, bandwidth_gbits_per_s: 160"),
     "intra_node", "not both"),
    (GOOD + "nodes: 4\n", "inter_node", "needs an inter_node link tier"),
    (GOOD.replace("{fp32: 10}", "{fp33: 10}"), "device.peak_tflops.fp33", "unknown key 'fp33'"),
    (GOOD.replace("memory_gib: 16", "memory_gb: 16"), "device.memory_gb", "unknown field"),
    # network keys: used by the topology that names them, refused elsewhere (issue 32)
    (GOOD.replace("latency_us: 5,", "latency_us: 5, oversubscription: 10,"), "intra_node",
     "oversubscription is given per switch level"),
    (GOOD.replace("latency_us: 5,", "latency_us: 5, topology: fat-tree,"), "intra_node.topology", "joins nodes"),
    (GOOD.replace("latency_us: 5,", "latency_us: 5, dims: [4, 4],"), "intra_node.dims", "used by topology torus"),
    (GOOD + "nodes: 4\ninter_node: {latency_us: 5, bandwidth_gbytes_per_s: 20, topology: fat-tree, dims: [2, 2]}\n",
     "inter_node.dims", "used by topology torus only, not by fat-tree"),
    (GOOD + "nodes: 4\ninter_node: {latency_us: 5, bandwidth_gbytes_per_s: 20, topology: fat-tree,"
            " levels: [{fanout: 2, oversubscription: 0.5}]}\n", "inter_node.levels[0].oversubscription",
     "must be a number >= 1"),
    (GOOD + "nodes: 4\ninter_node: {latency_us: 5, bandwidth_gbytes_per_s: 20, topology: torus, dims: [2, 2]}\n",
     "inter_node.link_bandwidth_gbytes_per_s", "missing required field"),
    (GOOD + "nodes: 4\ninter_node: {latency_us: 5, bandwidth_gbytes_per_s: 20, topology: dragonfly}\n",
     "inter_node.nodes_per_router", "missing required field"),
])
def test_bad_profile_gives_one_line_spec_error(tmp_path, text, field, reason):
    path = _write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_profile(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path)) and field in message and reason in message


def test_unknown_profile_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as info:
        load_profile("no-such-profile")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("no-such-profile") and "no such profile" in message and "dgx1-p100" in message
