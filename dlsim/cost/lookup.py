"""Kernel times from measured tables: exact hits, interpolation between neighbours, marked extrapolation.

`MeasuredKernelTimes` implements `dlsim.cost.pricing.KernelTimes` over three tables that
`dlsim calibrate compute` measures (`dlsim.io.kernel_tables` reads them):

GEMM ``C[m×n] = A[m×k]·B[k×n]`` (``count`` of them batched), per data type.
  * exact (dtype, m, n, k, count) → **measured**.
  * inside the calibration grid (rows with ``set = grid``), by default: local linear regression of
    ``log t`` on ``(log m, log n, log k)`` over the 32 nearest measured shapes of every set (grid,
    odd, model), tricube-weighted (`dlsim.cost.gemm_local`) → **interpolated**. Chosen over the grid
    cell's interpolant (below) because it averages the measurement noise of single rows and sees
    the off-grid shapes; measured on held-out shapes in reports/validation-cpu.md.
  * ``gemm_method="multilinear"``: multilinear interpolation of the log throughput ``log(F/t)`` in
    ``(log m, log n, log k)`` over the 8 corners of the enclosing grid cell → **interpolated**
    (algorithms.md §8.3, "interpolate efficiency, not time": with a constant π, log efficiency and
    log throughput differ by a constant, and since ``log F`` is itself multilinear the interpolant
    reproduces ``log t`` at the corners). Only the two grid neighbours of each dimension take part,
    so a kernel switch between two sizes bends the estimate only inside its cell. Corners missing
    from the grid (the calibrator skips the largest products) are left out and the remaining
    weights renormalised; under half the weight present, or a dimension beyond the grid's largest
    value (its coordinate clamped to the edge: throughput saturates), the answer is
    **extrapolated** — for either method, the cell decides whether a shape is inside the grid.
  * no grid cell: the nearest measured shape in log space, scaled by FLOPs (same throughput)
    → **extrapolated**. ``count`` > 1 without a batched row: count × the single-GEMM time →
    **extrapolated**.
  Measured error of the interpolant on held-out shapes: see reports/validation-cpu.md
  (`dlsim validate kernels`).

Convolution per pass and algorithm, keyed by geometry (channels, image, kernel, stride, padding,
dilation, groups) and batch n. Exact → measured; the same geometry at neighbouring batch sizes:
``log t`` linear in ``log n`` → interpolated; beyond the measured batch sizes, time per sample of
the nearest → extrapolated; an unmeasured geometry → None (pricing then falls back to the
im2col GEMMs, then to the roofline). The algorithm is the profile's default one (the one the
framework runs unless told otherwise, e.g. oneDNN on a CPU), or the fastest measured when no
default is set.

Memory-bound kernels (norms, pooling, element-wise, softmax, dropout, embedding, loss) per
(op type, pass, dtype), keyed by the bytes and FLOPs dlsim's cost model assigns the pass. Exact
(bytes, FLOPs) → measured (the median when several shapes share them); between measured sizes
``log t`` linear in ``log bytes`` → interpolated; above the largest the largest's effective
bandwidth, below the smallest its time (a launch-bound floor) → extrapolated.

Optimizer steps are rows of the memory table with pass ``step``, op the optimizer and signature
``adam|p<parameters>|t<tensors>``: an exact (parameters, tensors) → measured; otherwise the
optimizer's curve over the bytes the step moves (`dlsim.cost.memory.optimizer_step_traffic`),
as for any memory-bound kernel.

Every estimate's note names the table and the rows it came from.
"""

from __future__ import annotations

import bisect
import math
import re
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

from dlsim.cost.conv_methods import ConvGeometry, geometry_from_dict
from dlsim.cost.gemm_local import LocalGemmModel, nearest_shapes
from dlsim.cost.layers import Gemm, PassCost
from dlsim.cost.memory import optimizer_step_traffic
from dlsim.results import Estimate, Source

GEMM_COLUMNS = ("dtype", "m", "n", "k", "count", "time_s", "iqr_s", "repeats", "set")
CONV_SHAPE_FIELDS = ("c_in", "h", "w", "c_out", "k_h", "k_w", "stride_h", "stride_w", "pad_h", "pad_w",
                     "dil_h", "dil_w", "groups")
CONV_COLUMNS = ("dtype", "pass", "algorithm", "n", *CONV_SHAPE_FIELDS, "time_s", "iqr_s", "workspace_bytes",
                "repeats", "set")
MEMORY_COLUMNS = ("dtype", "op", "pass", "signature", "bytes", "flops", "time_s", "iqr_s", "repeats", "set")
GEMM_METHODS = ("local", "multilinear", "nearest")
"""How a GEMM between measured shapes is priced: local linear regression over the nearest measured shapes
(`dlsim.cost.gemm_local`, the default), the grid cell's multilinear interpolant, or the nearest shape
scaled by FLOPs (the last two kept to compare on held-out shapes)."""
SETS = ("grid", "model", "heldout", "odd")
"""Why a row was measured: the generic calibration grid, the shapes of a model, a held-out check, the
calibration's off-power-of-two GEMM shapes (`dlsim.calibrate.compute_plan.odd_gemms`; not used by the
grid interpolant)."""
CONV_PASSES = ("forward", "backward_data", "backward_weight")
MIN_CORNER_WEIGHT = 0.5
_STEP = re.compile(r"^(\w+)\|p(\d+)\|t(\d+)$")


@dataclass(frozen=True)
class GemmRow:
    dtype: str
    m: int
    n: int
    k: int
    count: int
    time_s: float
    iqr_s: float = 0.0
    repeats: int = 1
    set: str = "grid"

    @property
    def key(self) -> tuple:
        return (self.dtype, self.m, self.n, self.k, self.count)


def conv_shape(c_in: int, h: int, w: int, c_out: int, k_h: int, k_w: int, stride_h: int = 1, stride_w: int = 1,
               pad_h: int = 0, pad_w: int = 0, dil_h: int = 1, dil_w: int = 1, groups: int = 1) -> ConvGeometry:
    """A convolution's geometry without its batch size (the CONV_SHAPE_FIELDS columns), as a
    `ConvGeometry` of one sample: the key of the convolution table."""
    return ConvGeometry(1, c_in, h, w, c_out, k_h, k_w, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups)


CHANNELS_LAST = "+channels_last"
"""Suffix of a convolution table row's algorithm when the input was stored channels-last (NHWC)."""


def shape_of(geometry: dict) -> ConvGeometry:
    """The table key of `LayerCost.conv` (`dlsim.cost.layers._conv2d`)."""
    return geometry_from_dict(geometry).with_batch(1)


@dataclass(frozen=True)
class ConvRow:
    dtype: str
    pass_name: str
    algorithm: str
    n: int
    shape: ConvGeometry
    time_s: float
    iqr_s: float = 0.0
    workspace_bytes: float = 0.0
    repeats: int = 1
    set: str = "model"

    @property
    def key(self) -> tuple:
        return (self.dtype, self.pass_name, self.algorithm, self.n, self.shape)


@dataclass(frozen=True)
class MemoryRow:
    dtype: str
    op: str
    pass_name: str
    signature: str
    bytes: float
    flops: float
    time_s: float
    iqr_s: float = 0.0
    repeats: int = 1
    set: str = "model"

    @property
    def key(self) -> tuple:
        return (self.dtype, self.op, self.pass_name, self.signature)


def record(row: GemmRow | ConvRow | MemoryRow) -> dict[str, str]:
    """A row as CSV fields (the *_COLUMNS names), numbers written exactly enough to round-trip."""
    def num(v: float) -> str:
        return str(int(v)) if float(v).is_integer() and abs(v) < 2**53 else f"{v:.9g}"
    if isinstance(row, GemmRow):
        values = [row.dtype, row.m, row.n, row.k, row.count, row.time_s, row.iqr_s, row.repeats, row.set]
        return {c: v if isinstance(v, str) else num(v) for c, v in zip(GEMM_COLUMNS, values)}
    if isinstance(row, ConvRow):
        s = row.shape
        values = [row.dtype, row.pass_name, row.algorithm, row.n, *(getattr(s, f) for f in CONV_SHAPE_FIELDS),
                  row.time_s, row.iqr_s, row.workspace_bytes, row.repeats, row.set]
        return {c: v if isinstance(v, str) else num(v) for c, v in zip(CONV_COLUMNS, values)}
    values = [row.dtype, row.op, row.pass_name, row.signature, row.bytes, row.flops, row.time_s, row.iqr_s,
              row.repeats, row.set]
    return {c: v if isinstance(v, str) else num(v) for c, v in zip(MEMORY_COLUMNS, values)}


def bracket(axis: Sequence[float], x: float) -> tuple[list[tuple[float, float]], bool]:
    """Neighbours of `x` on a sorted axis with their weights, linear in log x: ``([(value, weight)], clamped)``.

    An exact value has weight 1; beyond the ends the end value takes it all and `clamped` is True.
    """
    if x <= axis[0] or x >= axis[-1]:
        end = axis[0] if x <= axis[0] else axis[-1]
        return [(end, 1.0)], x != end
    i = bisect.bisect_left(axis, x)
    if axis[i] == x:
        return [(x, 1.0)], False
    lo, hi = axis[i - 1], axis[i]
    w = (math.log(x) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return [(lo, 1.0 - w), (hi, w)], False


def loglog(points: Sequence[tuple[float, float]], x: float) -> tuple[float, Source, str]:
    """y(x) from sorted (x, y) points: exact, log-log linear between neighbours, or (beyond the ends)
    proportional to x above the last point and equal to the first point's y below it."""
    xs = [p[0] for p in points]
    i = bisect.bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return points[i][1], Source.MEASURED, f"{x:g}"
    if i == 0:
        return points[0][1], Source.EXTRAPOLATED, f"below smallest measured {xs[0]:g}, its time"
    if i == len(xs):
        return points[-1][1] * x / xs[-1], Source.EXTRAPOLATED, f"above largest measured {xs[-1]:g}, scaled"
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp((1 - w) * math.log(y0) + w * math.log(y1)), Source.INTERPOLATED, f"between {x0:g} and {x1:g}"


class MeasuredKernelTimes:
    """`KernelTimes` over measured GEMM, convolution and memory-bound tables (see the module docstring).

    `conv_algorithm` is the algorithm the framework runs by default (None: the fastest measured);
    `gemm_method` is one of `GEMM_METHODS` ("local", the default; "multilinear" and "nearest" are kept to
    compare the interpolants on held-out shapes).
    """

    def __init__(self, gemm: Iterable[GemmRow] = (), conv: Iterable[ConvRow] = (), memory: Iterable[MemoryRow] = (),
                 *, conv_algorithm: str | None = None, gemm_method: str = "local", origin: str = "tables"):
        if gemm_method not in GEMM_METHODS:
            raise ValueError(f"gemm_method must be one of {', '.join(GEMM_METHODS)}, got {gemm_method!r}")
        self.conv_algorithm, self.gemm_method, self.origin = conv_algorithm, gemm_method, origin
        self._gemm: dict[tuple, float] = {}
        grid: dict[str, set[tuple[int, int, int]]] = {}
        for r in gemm:
            self._gemm[r.key] = r.time_s
            if r.set == "grid" and r.count == 1:
                grid.setdefault(r.dtype, set()).add((r.m, r.n, r.k))
        self._axes = {dt: tuple(sorted({p[i] for p in pts}) for i in range(3)) for dt, pts in grid.items()}
        self._points: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
        for (dt, m, n, k, c) in self._gemm:
            self._points.setdefault((dt, c), []).append((m, n, k))
        self._local = {dt: LocalGemmModel((*p, self._gemm[(dt, *p, 1)]) for p in pts)
                       for (dt, c), pts in self._points.items() if c == 1} if gemm_method == "local" else {}
        self._conv: dict[tuple, dict[str, list[tuple[int, float]]]] = {}
        for r in conv:
            algos = self._conv.setdefault((r.dtype, r.pass_name, r.shape), {})
            algos.setdefault(r.algorithm, []).append((r.n, r.time_s))
        for algos in self._conv.values():
            for pts in algos.values():
                pts.sort()
        mem: dict[tuple, dict[tuple[float, float], list[float]]] = {}
        self._steps: dict[tuple[str, str, int, int], float] = {}
        for r in memory:
            if r.pass_name == "step" and (m := _STEP.match(r.signature)):
                self._steps[(r.dtype, m.group(1), int(m.group(2)), int(m.group(3)))] = r.time_s
            mem.setdefault((r.dtype, r.op, r.pass_name), {}).setdefault((round(r.bytes), round(r.flops)), []).append(r.time_s)
        self._mem_exact = {key: {bf: statistics.median(ts) for bf, ts in rows.items()} for key, rows in mem.items()}
        self._mem_curve: dict[tuple, list[tuple[float, float]]] = {}
        for key, rows in self._mem_exact.items():
            by_bytes: dict[float, list[float]] = {}
            for (b, _), t in rows.items():
                by_bytes.setdefault(float(b), []).append(t)
            self._mem_curve[key] = sorted((b, statistics.median(ts)) for b, ts in by_bytes.items() if b > 0)

    # --- GEMM -------------------------------------------------------------------------------

    def gemm(self, gemm: Gemm, dtype: str) -> Estimate | None:
        """Time of `gemm` (all `count` of them) in `dtype`, or None without any row for `dtype`."""
        exact = self._gemm.get((dtype, gemm.m, gemm.n, gemm.k, gemm.count))
        if exact is not None:
            return Estimate(exact, Source.MEASURED, f"gemm table: {self._label(gemm)}")
        if gemm.count > 1:
            return self._batched(gemm, dtype)
        single = self._single(gemm.m, gemm.n, gemm.k, dtype)
        if single is None:
            return None
        return single

    def _label(self, g: Gemm) -> str:
        return f"{g.m}x{g.n}x{g.k}" + (f" x{g.count}" if g.count > 1 else "")

    def _batched(self, g: Gemm, dtype: str) -> Estimate | None:
        counts = sorted(c for (dt, m, n, k, c) in self._gemm if (dt, m, n, k) == (dtype, g.m, g.n, g.k))
        if counts:
            t, source, how = loglog([(c, self._gemm[(dtype, g.m, g.n, g.k, c)]) for c in counts], g.count)
            return Estimate(t, source, f"gemm table: {self._label(g)} from batch counts {how}")
        single = self._single(g.m, g.n, g.k, dtype)
        if single is None:
            return None
        return Estimate(single.seconds * g.count, Source.EXTRAPOLATED,
                        f"{g.count} x ({single.note}, {single.source.value})")

    def _single(self, m: int, n: int, k: int, dtype: str) -> Estimate | None:
        exact = self._gemm.get((dtype, m, n, k, 1))
        if exact is not None:
            return Estimate(exact, Source.MEASURED, f"gemm table: {m}x{n}x{k}")
        if self.gemm_method in ("multilinear", "local") and dtype in self._axes:
            found = self._multilinear(m, n, k, dtype)
            if found is not None and self.gemm_method == "local" and found.source is Source.INTERPOLATED:
                return self._local_fit(m, n, k, dtype)
            if found is not None:
                return found
        return self._nearest(m, n, k, dtype)

    def _local_fit(self, m: int, n: int, k: int, dtype: str) -> Estimate:
        model = self._local[dtype]
        t, reach = model.seconds(m, n, k)
        return Estimate(t, Source.INTERPOLATED, f"gemm table: local linear fit of {model.neighbours} nearest measured "
                                                f"shapes (within ×{math.exp(reach):.2f} per dimension)")

    def _multilinear(self, m: int, n: int, k: int, dtype: str) -> Estimate | None:
        flops = 2.0 * m * n * k
        sides, clamped = [], False
        for axis, x in zip(self._axes[dtype], (m, n, k)):
            side, c = bracket(axis, x)
            sides.append(side)
            clamped = clamped or c
        total = acc = 0.0
        for mv, mw in sides[0]:
            for nv, nw in sides[1]:
                for kv, kw in sides[2]:
                    t = self._gemm.get((dtype, mv, nv, kv, 1))
                    w = mw * nw * kw
                    if t is None or w == 0:
                        continue
                    total += w
                    acc += w * math.log(2.0 * mv * nv * kv / t)
        if total == 0:
            return None
        t = flops / math.exp(acc / total)
        corners = "x".join("/".join(str(v) for v, _ in s) for s in sides)
        if clamped or total < MIN_CORNER_WEIGHT:
            why = "clamped to the grid's edge" if clamped else f"{total:.0%} of the cell measured"
            return Estimate(t, Source.EXTRAPOLATED, f"gemm grid cell {corners} ({why})")
        return Estimate(t, Source.INTERPOLATED, f"gemm grid cell {corners}")

    def _nearest(self, m: int, n: int, k: int, dtype: str) -> Estimate | None:
        points = self._points.get((dtype, 1))
        if not points:
            return None
        best = nearest_shapes(points, m, n, k, 1)[0]
        t = self._gemm[(dtype, *best, 1)] * (m * n * k) / (best[0] * best[1] * best[2])
        return Estimate(t, Source.EXTRAPOLATED, f"gemm table: nearest {best[0]}x{best[1]}x{best[2]} scaled by FLOPs")

    # --- convolution ------------------------------------------------------------------------

    def conv_algorithms(self, pass_name: str, geometry: dict, dtype: str) -> dict[str, Estimate]:
        """Every measured algorithm's estimate for this convolution pass in the input's memory format (rows of
        a channels-last input carry `CHANNELS_LAST` after the algorithm's name; the names returned are
        without it); empty when the geometry is unknown."""
        algos = self._conv.get((dtype, pass_name, shape_of(geometry)), {})
        nhwc = bool(geometry.get("channels_last"))
        out = {}
        for algo, pts in algos.items():
            if algo.endswith(CHANNELS_LAST) != nhwc:
                continue
            t, source, how = loglog(pts, geometry["n"])
            out[algo.removesuffix(CHANNELS_LAST)] = Estimate(t, source, f"conv table: {algo}, batch {how}")
        return out

    def conv(self, pass_name: str, geometry: dict, dtype: str) -> Estimate | None:
        """The default algorithm's time (or the fastest measured); None for an unmeasured geometry."""
        options = self.conv_algorithms(pass_name, geometry, dtype)
        if not options:
            return None
        if self.conv_algorithm in options:
            return options[self.conv_algorithm]
        return min(options.values(), key=lambda e: e.seconds)

    # --- memory-bound -----------------------------------------------------------------------

    def memory_bound(self, op_type: str, pass_name: str, cost: PassCost, dtype: str) -> Estimate | None:
        """Time of a bandwidth-bound pass from the op's measured curve over bytes moved."""
        key = (dtype, op_type, pass_name)
        exact = self._mem_exact.get(key, {}).get((round(cost.bytes), round(cost.flops)))
        if exact is not None:
            return Estimate(exact, Source.MEASURED, f"memory table: {op_type} {pass_name}, {cost.bytes:.0f} bytes")
        curve = self._mem_curve.get(key)
        if not curve or cost.bytes <= 0:
            return None
        t, source, how = loglog(curve, cost.bytes)
        return Estimate(t, source, f"memory table: {op_type} {pass_name}, bytes {how}")

    def optimizer_step(self, optimizer: str, params: int, tensors: int, dtype: str = "fp32") -> Estimate | None:
        """Time of one optimizer step over `params` parameters in `tensors` tensors (None: not measured)."""
        exact = self._steps.get((dtype, optimizer, params, tensors))
        if exact is not None:
            return Estimate(exact, Source.MEASURED, f"memory table: {optimizer} step, {params} parameters")
        curve = self._mem_curve.get((dtype, optimizer, "step"))
        if not curve:
            return None
        t, source, how = loglog(curve, optimizer_step_traffic(params, optimizer)[0])
        return Estimate(t, source, f"memory table: {optimizer} step, bytes {how}")

    def summary(self) -> str:
        """One line: how many rows of each table."""
        convs = sum(len(p) for a in self._conv.values() for p in a.values())
        mems = sum(len(r) for r in self._mem_exact.values())
        return f"{self.origin}: {len(self._gemm)} GEMM, {convs} convolution, {mems} memory-bound measurements"


class CacheAwareKernelTimes:
    """Cold tables (kernels timed after a cache flush) and, where calibrated, warm tables (the same
    kernels timed back to back, operands left in the caches), and the rule mixing them.

    The rule (`for_working_set`): of a training step's working set W (weights, gradients, optimizer
    state, saved activations and the largest temporary: `dlsim.cost.memory.training_working_set`) a
    last-level cache of C bytes keeps min(W, C) resident from one use to the next, so a kernel is
    priced

        t = t_warm + m · (t_cold − t_warm),   m = max(0, 1 − C / W)

    m is the step's capacity-miss share (Hill and Smith, "Evaluating associativity in CPU caches",
    IEEE Trans. Computers 38(12), 1989: once the warm-up iterations have loaded the working set, the
    misses left are capacity misses). A step that fits (W ≤ C) runs warm, as Denning's working-set
    model has it (P. J. Denning, "The working set model for program behavior", CACM 11(5), 1968); a
    step far larger than the cache runs cold, which the flushed calibration reproduces. In between,
    a cache whose insertion policy adapts to a cyclic pattern larger than itself keeps a C-sized
    part of it resident instead of thrashing (Qureshi et al., "Adaptive insertion policies for high
    performance caching", ISCA 2007), so the share of bytes that hit is C / W. No factor is fitted:
    C is the cache size read from the machine at calibration time.

    Until `for_working_set` sets the share every query is answered from the cold tables. A kernel the
    warm tables did not measure or interpolate is priced cold (noted).
    """

    def __init__(self, cold: MeasuredKernelTimes, warm: MeasuredKernelTimes | None = None,
                 cache_bytes: float | None = None, cold_share: float = 1.0):
        if not 0.0 <= cold_share <= 1.0:
            raise ValueError(f"cold_share must be in [0, 1], got {cold_share!r}")
        self.cold, self.warm, self.cache_bytes, self.cold_share = cold, warm, cache_bytes, cold_share

    @property
    def regime(self) -> str:
        """``warm``, ``cold`` or ``mixed`` (a share of each kernel priced cold)."""
        if self.warm is None or self.cold_share >= 1.0:
            return "cold"
        return "warm" if self.cold_share <= 0.0 else "mixed"

    def __getattr__(self, name: str):  # conv_algorithm, gemm_method, origin, ... of the cold tables
        return getattr(self.cold, name)

    def for_working_set(self, working_set_bytes: float) -> tuple["CacheAwareKernelTimes", str]:
        """The tables to price a step touching `working_set_bytes`, and a note saying why."""
        mib = working_set_bytes / 2**20
        if self.cache_bytes is None:
            return self, f"cache regime: cold (working set {mib:.1f} MiB; profile records no last-level cache size)"
        cache = f"last-level cache {self.cache_bytes / 2**20:.0f} MiB"
        share = max(0.0, 1.0 - self.cache_bytes / working_set_bytes) if working_set_bytes > 0 else 0.0
        if self.warm is None:
            return (CacheAwareKernelTimes(self.cold, None, self.cache_bytes, 1.0),
                    f"cache regime: cold (step working set {mib:.1f} MiB, {cache}; the profile has no warm "
                    f"tables): flushed-cache tables")
        mixed = CacheAwareKernelTimes(self.cold, self.warm, self.cache_bytes, share)
        if share <= 0.0:
            return mixed, f"cache regime: warm (step working set {mib:.1f} MiB <= {cache}): warm tables first"
        return mixed, (f"cache regime: {mixed.regime} (step working set {mib:.1f} MiB > {cache}): each kernel "
                       f"warm + {share:.2f} x (cold - warm), the share of the working set the cache cannot hold")

    def _ask(self, name: str, *args) -> Estimate | None:
        cold = getattr(self.cold, name)(*args)
        if self.regime == "cold":
            return cold
        found = getattr(self.warm, name)(*args)
        if found is None or found.source not in (Source.MEASURED, Source.INTERPOLATED):
            return None if cold is None else Estimate(cold.seconds, cold.source, f"{cold.note} (no warm row)")
        if cold is None or self.cold_share <= 0.0:
            return Estimate(found.seconds, found.source, f"warm {found.note}")
        seconds = found.seconds + self.cold_share * (cold.seconds - found.seconds)
        return Estimate(seconds, found.source, f"warm + {self.cold_share:.2f} x (cold - warm) {found.note}")

    def gemm(self, gemm: Gemm, dtype: str) -> Estimate | None:
        return self._ask("gemm", gemm, dtype)

    def conv(self, pass_name: str, geometry: dict, dtype: str) -> Estimate | None:
        return self._ask("conv", pass_name, geometry, dtype)

    def conv_algorithms(self, pass_name: str, geometry: dict, dtype: str) -> dict[str, Estimate]:
        src = self.warm if self.regime == "warm" else self.cold
        return src.conv_algorithms(pass_name, geometry, dtype) or self.cold.conv_algorithms(pass_name, geometry, dtype)

    def memory_bound(self, op_type: str, pass_name: str, cost: PassCost, dtype: str) -> Estimate | None:
        return self._ask("memory_bound", op_type, pass_name, cost, dtype)

    def optimizer_step(self, optimizer: str, params: int, tensors: int, dtype: str = "fp32") -> Estimate | None:
        return self._ask("optimizer_step", optimizer, params, tensors, dtype)

    def summary(self) -> str:
        warm = f"; warm: {self.warm.summary()}" if self.warm is not None else ""
        return f"{self.cold.summary()}{warm}"
