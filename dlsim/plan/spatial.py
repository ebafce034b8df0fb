"""Spatial parallelism: every image split by height and width over `spatial` ranks, convolutions
run as a domain decomposition with halo exchanges (Dryden, Maruyama, Moon, Benson, Yang, Snir, Van
Essen, "Improving strong-scaling of CNN training by exploiting finer-grained parallelism", IPDPS
2019; the seeds' S003 "Convolution is just a funny stencil operation: domain decomposition with a
halo exchange").

The `spatial` ranks of a sample group hold a p_h × p_w grid of blocks of every activation (rank
g = g_h·p_w + g_w; balanced blocks: rank g_h owns rows [g_h·H // p_h, (g_h + 1)·H // p_h)). With
`dp` such groups, the strategy is the sample × spatial hybrid: dp·spatial devices, gradients reduced
over all of them (`Strategy.dp_cp`). Per layer:

* split (convolutions, pooling, element-wise and per-channel layers, channel concatenation): each
  rank computes its block of the output. A convolution or pooling window (kernel K, stride S,
  padding P, dilation D) makes rank q's output rows [o_0, o_1) read input rows
  [o_0·S − P, (o_1 − 1)·S − P + D(K − 1)] (clipped to the image): what other ranks own of them is
  its forward halo, received from them before (or, with `halo_overlap`, while) it computes (on x,
  C_in channels). Its input-gradient rows [i_0, i_1) need the output-gradient rows
  ⌈(i_0 + P − D(K − 1))/S⌉ .. ⌊(i_1 − 1 + P)/S⌋: the backward halo (on ∂ℓ/∂y, C_out channels);
  the weight gradient uses the saved, halo-extended input. A "same" K×K convolution with stride 1
  split over p_h row blocks thus exchanges ⌊K/2⌋ rows of W/p_w columns with each neighbour (and
  corners with diagonal neighbours in a 2-D grid): 2·⌊K/2⌋·(W/p_w)·C·N elements per interior rank
  and direction in 1-D. Batch normalisation all-reduces its 2·C statistics (sum and sum of squares;
  backward: the sums of ∂ℓ/∂y and ∂ℓ/∂y·x̂) over the spatial group, as Dryden et al.'s
  spatially-distributed batch normalisation does.
* reduce (global pooling): each rank pools its block; the N·C partial results are all-reduced.
* gather (layers that need whole feature maps: flatten, fully connected layers, softmax, ...): the
  spatially split input is all-gathered, then the layer runs replicated on every rank of the group
  (its input gradient is the rank's own slice: no backward communication); everything after it too.

Each rank is priced as the busiest one (the largest block: ⌈H/p_h⌉ × ⌈W/p_w⌉ outputs): its
convolution reads the halo-extended input ((o − 1)·S + D(K − 1) + 1 rows, no padding). A halo
exchange of point-to-point messages m (bytes b_m from rank s_m to rank d_m) takes, with one send
and one receive port per rank (full duplex, messages one after another), the busiest rank's time:

    T_halo = max_r max(Σ_{m: s_m = r} T(b_m, s_m, d_m), Σ_{m: d_m = r} T(b_m, s_m, d_m))

T the point-to-point time of the pair's link tier (`dlsim.plan.comm.CommPricer.p2p`). With
`halo_overlap` (Distconv's default) the exchange runs beside the interior of the local domain, the
outputs whose windows lie inside the rank's own block; the boundary outputs follow it. Packing the
halos into contiguous buffers is not priced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Sequence

from dlsim.errors import SpecError
from dlsim.results import Estimate, Source
from dlsim.spec.model import INPUT, Layer, Model
from dlsim.spec.ops import conv_geometry
from dlsim.units import DTYPE_BYTES

SPATIAL = "spatial"
"""The group kind of spatial-parallel collectives (the layout's sample-group axis, `Layout.cp_group`)."""

WINDOWED = {"conv2d", "maxpool", "avgpool"}
"""Layers whose outputs read a window of input rows and columns: a halo."""
LOCAL = {"relu", "relu6", "gelu", "tanh", "sigmoid", "silu", "dropout", "lrn", "add", "batchnorm"}
"""Element-wise and per-channel layers: each rank computes its block alone (batch normalisation all-reduces
its statistics)."""
REDUCE = {"global_avgpool", "global_maxpool"}

Message = tuple[int, int, float]
"""(source rank, destination rank, elements per sample) of a halo exchange, ranks in the grid's order."""


def spatial_grid(degree: int, cols: int = 0) -> tuple[int, int]:
    """(p_h, p_w) of `degree` ranks: `cols` ranks along the width (0: the squarest grid, p_h ≥ p_w)."""
    if cols <= 0:
        cols = max(d for d in range(1, int(math.isqrt(degree)) + 1) if degree % d == 0)
    if degree % cols:
        raise SpecError(f"spatial_w {cols} does not divide spatial {degree}", field="spatial_w")
    return degree // cols, cols


def block(n: int, parts: int, i: int) -> tuple[int, int]:
    """Rows [start, end) of block i of n rows split into `parts` balanced blocks."""
    return i * n // parts, (i + 1) * n // parts


@dataclass(frozen=True)
class LayerSplit:
    """How one layer runs spatially split (module docstring): `role` split | reduce | gather |
    replicated; the forward and backward halo messages; the interior share of the busiest rank's
    outputs (computable without the halo); per-sample elements all-reduced forward and backward
    (batch-norm statistics, global pooling) or all-gathered before it (gather)."""

    role: str
    forward: tuple[Message, ...] = ()
    backward: tuple[Message, ...] = ()
    interior: float = 1.0
    reduce_forward: float = 0.0
    reduce_backward: float = 0.0
    gathered: float = 0.0


def _window_messages(geo_rows: tuple, geo_cols: tuple, grid: tuple[int, int], in_hw: tuple[int, int],
                     out_hw: tuple[int, int], channels_fwd: int, channels_bwd: int, backward: bool
                     ) -> tuple[tuple[Message, ...], tuple[Message, ...], float]:
    """Forward and backward halo messages of a window layer and its busiest rank's interior share."""
    (kh, sh, ph, dh), (kw, sw, pw, dw) = geo_rows, geo_cols
    p_h, p_w = grid
    (h, w), (ho, wo) = in_hw, out_hw

    def needed_in(o0: int, o1: int, k: int, s: int, p: int, d: int, n: int) -> tuple[int, int]:
        return (max(0, o0 * s - p), min(n, (o1 - 1) * s - p + d * (k - 1) + 1)) if o1 > o0 else (0, 0)

    def needed_out(i0: int, i1: int, k: int, s: int, p: int, d: int, n: int) -> tuple[int, int]:
        if i1 <= i0:
            return 0, 0
        return max(0, -(-(i0 + p - d * (k - 1)) // s)), min(n, (i1 - 1 + p) // s + 1)

    def overlap(a: tuple[int, int], b: tuple[int, int]) -> int:
        return max(0, min(a[1], b[1]) - max(a[0], b[0]))

    fwd, bwd = [], []
    for q in range(p_h * p_w):
        qh, qw = divmod(q, p_w)
        rows_out, cols_out = block(ho, p_h, qh), block(wo, p_w, qw)
        rows_in, cols_in = block(h, p_h, qh), block(w, p_w, qw)
        need_r, need_c = needed_in(*rows_out, kh, sh, ph, dh, h), needed_in(*cols_out, kw, sw, pw, dw, w)
        grad_r, grad_c = needed_out(*rows_in, kh, sh, ph, dh, ho), needed_out(*cols_in, kw, sw, pw, dw, wo)
        for r in range(p_h * p_w):
            if r == q:
                continue
            rh, rw = divmod(r, p_w)
            got = overlap(need_r, block(h, p_h, rh)) * overlap(need_c, block(w, p_w, rw))
            if got:
                fwd.append((r, q, float(got * channels_fwd)))
            got = overlap(grad_r, block(ho, p_h, rh)) * overlap(grad_c, block(wo, p_w, rw))
            if backward and got:
                bwd.append((r, q, float(got * channels_bwd)))
    # the busiest rank (block 0: the largest, ⌈·⌉ rows and columns): outputs whose window is its own
    rows_out, cols_out = block(ho, p_h, 0), block(wo, p_w, 0)
    own_r, own_c = block(h, p_h, 0), block(w, p_w, 0)
    inside_r = sum(1 for o in range(*rows_out) if needed_in(o, o + 1, kh, sh, ph, dh, h)[0] >= own_r[0]
                   and needed_in(o, o + 1, kh, sh, ph, dh, h)[1] <= own_r[1])
    inside_c = sum(1 for o in range(*cols_out) if needed_in(o, o + 1, kw, sw, pw, dw, w)[0] >= own_c[0]
                   and needed_in(o, o + 1, kw, sw, pw, dw, w)[1] <= own_c[1])
    cells = (rows_out[1] - rows_out[0]) * (cols_out[1] - cols_out[0])
    return tuple(fwd), tuple(bwd), (inside_r * inside_c / cells if cells else 1.0)


def _ceil_div(n: int, parts: int) -> int:
    return -(-n // parts)


def split_spatial(model: Model, grid: tuple[int, int]) -> tuple[Model, dict[str, LayerSplit]]:
    """The model as the busiest rank of a spatial group runs it, and every layer's `LayerSplit`."""
    p_h, p_w = grid
    if p_h * p_w == 1:
        return model, {}
    if model.input_kind != "tensor" or len(model.input_shape) != 3:
        raise SpecError(f"spatial parallelism splits images (C, H, W); model {model.name!r} takes "
                        f"{model.input_kind} input of shape {list(model.input_shape)}", field="spatial")
    _, h, w = model.input_shape
    if h < p_h or w < p_w:
        raise SpecError(f"a {p_h} x {p_w} spatial grid does not fit the {h} x {w} input", field="spatial")

    def local(shape: tuple[int, ...]) -> tuple[int, ...]:
        return (shape[0], _ceil_div(shape[1], p_h), _ceil_div(shape[2], p_w))

    split: set[str] = {INPUT}
    splits: dict[str, LayerSplit] = {}
    layers: list[Layer] = []
    for layer in model.layers:
        ins = [src in split for src in layer.inputs]
        image = len(layer.out_shape) == 3 and all(len(s) == 3 for s in layer.in_shapes)
        kind = layer.type
        if all(ins) and image and (kind in WINDOWED or kind in LOCAL or
                                   (kind == "concat" and layer.attrs.get("axis", 0) % 3 == 0)):
            role, attrs, in_shapes = "split", layer.attrs, tuple(local(s) for s in layer.in_shapes)
            fwd = bwd = ()
            interior = 1.0
            stats = 2.0 * layer.out_shape[0] if kind == "batchnorm" else 0.0
            if kind in WINDOWED:
                g = conv_geometry(dict(layer.attrs), layer.in_shapes[0])
                rows, cols = (g["kh"], g["sh"], g["ph"], g["dh"]), (g["kw"], g["sw"], g["pw"], g["dw"])
                fwd, bwd, interior = _window_messages(rows, cols, grid, layer.in_shapes[0][1:],
                                                      (g["ho"], g["wo"]), layer.in_shapes[0][0], layer.out_shape[0],
                                                      layer.inputs[0] != INPUT)
                ho, wo = _ceil_div(g["ho"], p_h), _ceil_div(g["wo"], p_w)
                # the busiest rank's convolution on its halo-extended input, without padding
                hi, wi = (ho - 1) * g["sh"] + g["dh"] * (g["kh"] - 1) + 1, (wo - 1) * g["sw"] + g["dw"] * (g["kw"] - 1) + 1
                attrs = MappingProxyType({**layer.attrs, "padding": 0, "stride": [g["sh"], g["sw"]],
                                          **({"ceil_mode": False} if "ceil_mode" in layer.attrs else {})})
                in_shapes = ((layer.in_shapes[0][0], hi, wi),)
            splits[layer.name] = LayerSplit(role, fwd, bwd, interior, stats, stats)
            split.add(layer.name)
            layers.append(replace(layer, attrs=attrs, in_shapes=in_shapes, out_shape=local(layer.out_shape)))
        elif all(ins) and kind in REDUCE and len(layer.in_shapes[0]) == 3:
            splits[layer.name] = LayerSplit("reduce", reduce_forward=float(layer.out_shape[0]))
            layers.append(replace(layer, in_shapes=(local(layer.in_shapes[0]),)))
        elif any(ins):
            gathered = float(sum(math.prod(s) for s, x in zip(layer.in_shapes, ins) if x))
            splits[layer.name] = LayerSplit("gather", gathered=gathered)
            layers.append(layer)
        else:
            splits[layer.name] = LayerSplit("replicated")
            layers.append(layer)
    return replace(model, input_shape=local(model.input_shape), layers=tuple(layers)), splits


@dataclass(frozen=True)
class HaloExchange:
    """A split window layer's halo exchanges on one device for one micro-batch (`Collective`s of op
    "halo" over the spatial group, None where there is none) and the share of its passes computed
    beside them (`overlap`: the interior's; 0: the exchange blocks before the layer)."""

    forward: object | None
    backward: object | None
    overlap: float


def add_halos(entries: Sequence, splits: dict[str, LayerSplit], dtype: str, halo_overlap: bool = True) -> tuple:
    """`entries` (`dlsim.plan.layertable.LayerEntry` of the `split_spatial` model) with the spatial
    group's collectives: halo exchanges (`LayerEntry.halo`), batch-norm statistics and global pooling
    all-reduced, gathers before the first layer that needs whole feature maps."""
    from dlsim.plan.tensorparallel import Collective
    if not splits:
        return tuple(entries)
    b = DTYPE_BYTES[dtype]
    out = []
    for e in entries:
        sp = splits[e.name]
        n = e.batch
        role = e.tp
        if sp.forward or sp.backward:
            def halo(msgs: tuple[Message, ...], why: str) -> Collective | None:
                if not msgs:
                    return None
                scaled = tuple((s, d, x * n * b) for s, d, x in msgs)
                return Collective("halo", max(sum(x for s, _, x in scaled if s == r) for r in {m[0] for m in scaled}),
                                  why, group=SPATIAL, messages=scaled)
            e = replace(e, halo=HaloExchange(halo(sp.forward, f"{e.name}'s input"),
                                             halo(sp.backward, f"{e.name}'s output gradient"),
                                             sp.interior if halo_overlap else 0.0))
        if sp.reduce_forward:
            fp32 = e.type == "batchnorm"  # statistics in fp32, pooled values in the training dtype
            nbytes = sp.reduce_forward * (4 if fp32 else n * b)
            role = replace(role, after_fwd=role.after_fwd + (
                Collective("allreduce", nbytes, f"spatial all-reduce after {e.name}", group=SPATIAL),))
        if sp.reduce_backward:
            role = replace(role, before_bwd=role.before_bwd + (
                Collective("allreduce", sp.reduce_backward * 4, f"spatial all-reduce before {e.name}'s backward",
                           group=SPATIAL),))
        if sp.gathered:
            role = replace(role, before=(Collective("allgather", sp.gathered * n * b, f"gather {e.name}'s input",
                                                    group=SPATIAL),) + role.before)
        out.append(replace(e, tp=role))
    return tuple(out)


def halo_time(messages: Sequence[tuple[int, int, float]], ranks: Sequence[int], p2p) -> Estimate:
    """T_halo of the module docstring: `messages` (group index of sender, of receiver, bytes) over the
    group `ranks`, `p2p(bytes, src rank, dst rank)` the pair's point-to-point Estimate."""
    sends: dict[int, float] = {}
    recvs: dict[int, float] = {}
    for s, d, nbytes in messages:
        t = p2p(nbytes, ranks[s], ranks[d]).seconds
        sends[s] = sends.get(s, 0.0) + t
        recvs[d] = recvs.get(d, 0.0) + t
    busiest = max(list(sends.values()) + list(recvs.values()), default=0.0)
    return Estimate(busiest, Source.MODEL, f"halo exchange of {len(messages)} messages (busiest rank's port)")
