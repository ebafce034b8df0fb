"""Held-out kernel shapes: GEMMs and convolutions the calibration did not measure, to check the lookup.

* GEMMs: (m, n, k) drawn log-uniformly (seeded) between the smallest and largest value of each axis
  of the calibration grid, every dimension off the grid (not a grid value), products no larger
  than the grid's largest: the lookup must interpolate in all three dimensions.
* Anchors (`nearest_measured`): for each held-out GEMM, the measured table shapes nearest to it. Timed
  beside the held-out shapes in the same passes, they say how far the machine now is from the machine at
  calibration (a shared VM's speed moves by several percent over minutes), so an error can be split into
  drift and lookup.
* Convolutions, two kinds: a measured geometry at a batch size that was not measured (the lookup
  interpolates or scales in the batch size), and a geometry absent from the table (output
  channels × 3/2; pricing falls back to the im2col GEMMs in the GEMM table).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Iterable, Sequence

from dlsim.cost.layers import Gemm
from dlsim.cost.conv_methods import ConvGeometry
from dlsim.cost.gemm_local import nearest_shapes
from dlsim.cost.lookup import ConvRow, GemmRow
from dlsim.spec.model import Layer, build_model

MAX_HELDOUT_MACS = 4 * 10**9


def heldout_gemms(rows: Iterable[GemmRow], dtype: str, count: int, seed: int = 0) -> list[Gemm]:
    """`count` GEMM shapes off the grid of `rows` (set "grid", count 1) but inside its hull."""
    grid = [r for r in rows if r.set == "grid" and r.count == 1 and r.dtype == dtype]
    if not grid:
        return []
    axes = [sorted({getattr(r, d) for r in grid}) for d in "mnk"]
    max_flops = max(2.0 * r.m * r.n * r.k for r in grid)
    on_grid = [set(a) for a in axes]
    rng = random.Random(seed)
    out: list[Gemm] = []
    seen = set()
    for _ in range(count * 200):
        if len(out) == count:
            break
        dims = []
        for axis, taken in zip(axes, on_grid):
            lo, hi = axis[0], axis[-1]
            value = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
            dims.append(value if value not in taken else None)
        if None in dims:
            continue
        g = Gemm(*dims)
        if g.flops <= max_flops and (g.m, g.n, g.k) not in seen:
            seen.add((g.m, g.n, g.k))
            out.append(g)
    return out


def nearest_measured(rows: Iterable[GemmRow], shapes: Sequence[Gemm], dtype: str, count: int) -> list[list[Gemm]]:
    """For each of `shapes`, the `count` measured single GEMMs of `dtype` in `rows` nearest to it in
    (log m, log n, log k), nearest first (the distance the lookup's neighbours are chosen by)."""
    measured = sorted({(r.m, r.n, r.k) for r in rows if r.count == 1 and r.dtype == dtype and r.time_s > 0})
    return [[Gemm(*d) for d in nearest_shapes(measured, g.m, g.n, g.k, count)] for g in shapes]


def conv_layer(shape: ConvGeometry) -> Layer:
    """A dlsim conv2d layer (no bias) with a table row's geometry."""
    s = shape
    entry = {"name": "conv", "type": "conv2d", "out_channels": s.c_out, "kernel": [s.k_h, s.k_w],
             "stride": [s.stride_h, s.stride_w], "padding": [s.pad_h, s.pad_w], "dilation": [s.dil_h, s.dil_w],
             "groups": s.groups, "bias": False}
    return build_model("heldout-conv", "fp32", (s.c_in, s.h, s.w), "tensor", [entry]).layers[0]


def heldout_convs(rows: Sequence[ConvRow], algorithm: str | None, count: int, seed: int = 0,
                  max_work: float = MAX_HELDOUT_MACS) -> list[tuple[str, ConvGeometry, int, str]]:
    """(pass, shape, batch, kind) tuples: kind "new-batch" (a measured geometry at an unmeasured batch
    size) or "new-geometry" (output channels × 3/2, not in the table). Kernels above `max_work`
    multiply-accumulates are skipped to keep the check short."""
    rows = [r for r in rows if algorithm is None or r.algorithm == algorithm]
    batches: dict[tuple[str, ConvGeometry], set[int]] = {}
    for r in rows:
        batches.setdefault((r.pass_name, r.shape), set()).add(r.n)
    keys = sorted(batches, key=lambda k: (k[0], k[1].signature))
    rng = random.Random(seed)
    rng.shuffle(keys)
    known = {shape for _, shape in batches}
    out: list[tuple[str, ConvGeometry, int, str]] = []
    def macs(s: ConvGeometry, n: int) -> float:
        return s.with_batch(n).macs
    for pass_name, shape in keys:
        if len(out) >= count:
            break
        ns = sorted(batches[(pass_name, shape)])
        n = next((b for b in range(ns[0] + 1, ns[-1]) if b not in ns), ns[-1] + 1)
        if macs(shape, n) <= max_work:
            out.append((pass_name, shape, n, "new-batch"))
        c_out = shape.c_out * 3 // 2
        wider = replace(shape, c_out=c_out)
        if shape.groups == 1 and wider not in known and macs(wider, ns[0]) <= max_work and len(out) < count:
            out.append((pass_name, wider, ns[0], "new-geometry"))
    return out
