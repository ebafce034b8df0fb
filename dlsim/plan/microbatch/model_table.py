"""A benchmark table from the cost model, for devices without a measured convolution table.

For every convolution layer, pass, applicable method (`dlsim.cost.conv_methods`) and micro-batch size
of the policy: workspace = the method's buffers; time = roofline (`dlsim.cost.roofline`) with the
profile's device numbers: the method's matrix-product FLOPs on the matrix units (tensor cores), the
rest (direct convolution, FFT and Winograd transforms) on the vector units, its bytes at memory
bandwidth, one launch overhead per kernel. Rows are tagged ``source="model"``.
"""

from __future__ import annotations

from typing import Sequence

from dlsim.cost.conv_methods import METHODS, PASSES, ConvGeometry, applicable, geometry_from_dict, method_pass_cost
from dlsim.cost.layers import layer_cost
from dlsim.cost.roofline import roofline_time
from dlsim.plan.microbatch.configs import Kernel
from dlsim.plan.microbatch.table import BenchTable
from dlsim.spec.cluster import Device
from dlsim.spec.model import Model
from dlsim.units import DTYPE_BYTES


def conv_layers(model: Model) -> list[tuple[str, ConvGeometry]]:
    """(name, per-sample geometry with n = 1) of every conv2d layer, in model order."""
    return [(layer.name, geometry_from_dict(layer_cost(layer, 1).conv)) for layer in model.layers
            if layer.type == "conv2d"]


def method_time_s(method: str, pass_name: str, g: ConvGeometry, device: Device, dtype: str) -> tuple[float, int]:
    """(roofline seconds, workspace bytes) of one method's pass at batch g.n."""
    c = method_pass_cost(method, pass_name, g, DTYPE_BYTES[dtype])
    rest = c.flops - c.matmul_flops
    if c.matmul_flops > 0:
        share = c.matmul_flops / c.flops
        t = roofline_time(c.matmul_flops, c.bytes * share, device, dtype, matrix=True, kernels=1).seconds
        if rest > 0 or c.kernels > 1:
            t += roofline_time(rest, c.bytes * (1 - share), device, dtype, matrix=False, kernels=c.kernels - 1).seconds
    else:
        t = roofline_time(c.flops, c.bytes, device, dtype, matrix=False, kernels=c.kernels).seconds
    return t, c.workspace_bytes


def model_bench_table(model: Model, device: Device, sizes: Sequence[int], dtype: str | None = None,
                      layers: Sequence[str] | None = None) -> BenchTable:
    """Modelled (algorithm, micro-batch size) → (time, workspace) rows for the model's convolutions
    (all of them, or those named in `layers`), at the micro-batch `sizes` (see `policies.batch_sizes`)."""
    dtype = dtype or model.dtype
    cache: dict[tuple, tuple[float, int]] = {}
    rows = []
    for name, g in conv_layers(model):
        if layers is not None and name not in layers:
            continue
        for p in PASSES:
            for method in METHODS:
                if applicable(method, g):
                    continue
                for b in sizes:
                    key = (g.signature, p, method, b)
                    if key not in cache:
                        cache[key] = method_time_s(method, p, g.with_batch(b), device, dtype)
                    t, ws = cache[key]
                    rows.append((name, p, Kernel(method, b, t, float(ws))))
    return BenchTable.from_rows(rows, source="model", origin=f"roofline model of {device.name}")
