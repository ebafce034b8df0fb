"""Tensor-parallel communication overlapped with its GEMMs, as Transformer Engine's userbuffers run it.

With sequence parallelism a column-parallel GEMM (Megatron-Core's ``qkv`` and ``fc1``: Transformer
Engine's LayerNormLinear and LayerNormMLP) all-gathers its sequence-sharded input and a row-parallel
one (``proj``, ``fc2``: Linear) reduce-scatters its output (`dlsim.plan.tensorparallel`). With
``ub_tp_comm_overlap`` (NeMo) / ``--tp-comm-overlap`` (Megatron-LM) each of those collectives runs
beside the GEMM it feeds or drains, split into steps (NVIDIA/TransformerEngine@08a85d3, v1.10:
transformer_engine/pytorch/csrc/comm_gemm_overlap.h; which GEMM goes beside which collective in
module/layernorm_linear.py, linear.py, layernorm_mlp.py; the methods and their defaults in
module/base.py ``initialize_ub``). With g the seconds of one GEMM chunk and c of one communication
step (all chunks equal, so the steps below are the exact dependency graph's time):

* ring exchange (``qkv_fprop``, ``fc1_fprop`` gathering the input; ``proj_dgrad``, ``fc2_dgrad``
  gathering the output gradient, `UbufP2PCommOverlap::split_overlap_ag`): the gathered operand's
  n = tp row blocks are multiplied one after another; while block i is multiplied, the block received
  last goes on to the next rank and the next one comes from the previous rank (1/tp of the gathered
  tensor per step, copy engines: ``use_ce`` is TE's default, and the GEMM keeps every SM,
  ``set_sm_margin`` 0). Block i + 1 waits for its exchange, the exchanges follow one another:

      T_ring = (n − 1)·max(g, c) + g = max(n·g, (n − 1)·c + g)

  With ``aggregate`` (``_aggregate2``, a recipe's choice) the ring runs two chunks at a time: each
  rank first swaps its block with its pair partner (one 1/tp step of c₁ seconds, nothing beside it),
  then k = tp/2 GEMMs of two blocks (G₂ seconds each) beside k − 1 exchanges of two blocks (C₂)
  with the ranks two away:

      T_ring2 = c₁ + (k − 1)·max(G₂, C₂) + G₂ = c₁ + max(k·G₂, (k − 1)·C₂ + G₂)

  (an odd tp has no pairs: the plain ring).

* pipelined (``proj_fprop``, ``fc2_fprop``, `UbufCommOverlap::split_overlap_rs`): the GEMM's
  output features in N = ``num_splits`` chunks; chunk i's reduce-scatter (1/N of the output) starts
  when its GEMM ends, beside chunk i + 1's GEMM. With ``set_sm_margin`` 1 the GEMM runs on the SMs the
  communication kernels leave (``_math_sms`` = S − ``num_sm`` of the device's S), so one chunk takes
  its priced time × S/(S − num_sm); without it (TE's default) the GEMM is launched on all S SMs and
  slowed beside each step as the bulk GEMMs below are (σ_b):

      T_pipe = g + (N − 1)·max(g, c) + c = max(N·g + c, g + N·c)

* bulk (`UbufCommOverlap::bulk_overlap`; ``qkv_dgrad``, ``fc1_dgrad``: the input all-gather the
  weight gradient needs, beside the input-gradient GEMM; ``qkv_wgrad``, ``fc1_wgrad``: the input
  gradient's reduce-scatter beside the weight-gradient GEMM): one collective of m seconds beside one
  GEMM of G seconds launched on all S SMs (``set_sm_margin`` 0) while the communication kernels hold
  ``num_sm``: the GEMM progresses at (S − num_sm)/S while both run, the overlap slowdown
  σ_b = num_sm/(S − num_sm) of `dlsim.cost.overlap`:

      T_bulk = G + o·σ_b/(1 + σ_b) + max(0, m − G·(1 + σ_b)),   o = min(m, G·(1 + σ_b))

Per-chunk GEMMs are priced like every GEMM (`dlsim.cost.pricing.gemm_seconds`: the measured tables,
else the roofline), FP8 ones as `dlsim.plan.fp8` prices them; a communication step as dlsim prices that
point-to-point transfer (the ring's slowest hop) or collective over the tensor-parallel group; under FP8 the all-gather buffers hold
FP8 (TE ``fp8_buf`` for the all-gathers), the reduce-scatters BF16. A device without an SM count in
its profile takes its general overlap slowdown σ (`Device.overlap_slowdown`) beside every
userbuffer step but the copy-engine exchanges, and no SM margin. The userbuffers themselves are
allocated once per process (``initialize_ub``: one buffer of the local sequence × micro-batch ×
hidden per communicator) and counted as the device's workspace. Not modelled: the memory traffic
the copy engines add beside the ring's GEMMs and atomic GEMMs (no configuration below uses them).

The configuration (`CONFIGS`): Transformer Engine's defaults (``tp_comm_overlap`` true: what
Megatron-LM's ``--tp-comm-overlap`` and NeMo's ``ub_tp_comm_overlap`` run without a configuration of
their own) or a recipe's ``ub_tp_comm_overlap_cfg`` by name (`dlsim.spec.strategy.TP_OVERLAP_CONFIGS`):
NVIDIA's dgxc-benchmarking recipes of Llama 3.1 70B and 405B and of GPT-3 175B on H100.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping, Sequence

from dlsim.cost.layers import Gemm, layer_cost
from dlsim.cost.overlap import overlap_cost
from dlsim.cost.pricing import KernelTimes, gemm_seconds
from dlsim.plan.tensorparallel import Collective, shard_cost
from dlsim.spec.cluster import Device
from dlsim.spec.model import Model
from dlsim.units import DTYPE_BYTES

RING, PIPELINE, BULK = "ring_exchange", "pipeline", "bulk"


@dataclass(frozen=True)
class Userbuffer:
    """One userbuffer communicator's configuration (TE ``initialize_ub``'s ``ub_cfgs`` entry):
    `method`, the SMs its communication kernels take (`num_sm`), whether the GEMM leaves them to it
    (`set_sm_margin`), the pipelined method's chunks (`num_splits`), whether its buffer holds FP8
    under FP8 training (`fp8_buf`) and whether a ring runs two chunks at a time (`aggregate`)."""

    method: str
    num_sm: int
    set_sm_margin: bool = False
    num_splits: int = 0
    fp8_buf: bool = False
    aggregate: bool = False


_ALL_GATHERS = ("qkv_fprop", "qkv_dgrad", "proj_dgrad", "fc1_fprop", "fc1_dgrad", "fc2_dgrad")
_METHODS = {"qkv_fprop": RING, "fc1_fprop": RING, "proj_dgrad": RING, "fc2_dgrad": RING, "proj_fprop": PIPELINE,
            "fc2_fprop": PIPELINE, "qkv_dgrad": BULK, "qkv_wgrad": BULK, "fc1_dgrad": BULK, "fc1_wgrad": BULK}


def _default(name: str) -> Userbuffer:
    """Transformer Engine's configuration of one communicator when none is given
    (NVIDIA/TransformerEngine@08a85d3 transformer_engine/pytorch/module/base.py ``initialize_ub``
    ``get_default_config``): ring exchanges on 1 SM, the others on 16, no SM margin, 4 pipelined
    chunks, no aggregation, copy-engine exchanges, FP8 buffers for the all-gathers."""
    method = _METHODS[name]
    return Userbuffer(method, 1 if method == RING else 16, False, 4 if method == PIPELINE else 0,
                      name in _ALL_GATHERS)


def _recipe(changes: Mapping[str, tuple]) -> Mapping[str, Userbuffer]:
    """A recipe's configuration: TE's defaults updated per communicator with (num_sm, set_sm_margin,
    aggregate) as ``initialize_ub`` updates them (a pipelined communicator keeps 4 splits and BF16
    buffers: every recipe below sets num_splits 4, and TE takes ``fp8_buf`` of a pipeline only where
    the recipe asks for it, which none does)."""
    return MappingProxyType({name: replace(_default(name), num_sm=sm, set_sm_margin=margin, aggregate=agg)
                             for name, (sm, margin, agg) in changes.items()})


_LLAMA_70B = {"qkv_fprop": (1, False, False), "qkv_dgrad": (4, False, False), "qkv_wgrad": (24, False, False),
              "proj_fprop": (24, True, False), "proj_dgrad": (1, False, False), "fc1_fprop": (1, False, False),
              "fc1_dgrad": (2, False, False), "fc1_wgrad": (4, False, False), "fc2_fprop": (16, True, False),
              "fc2_dgrad": (1, False, False)}
CONFIGS: Mapping[bool | str, Mapping[str, Userbuffer]] = MappingProxyType({
    True: MappingProxyType({name: _default(name) for name in _METHODS}),
    "llama3.1-70b": _recipe(_LLAMA_70B),
    "llama3.1-405b": _recipe({**_LLAMA_70B, "qkv_fprop": (1, False, True), "qkv_dgrad": (2, False, False),
                              "proj_fprop": (24, True, False), "proj_dgrad": (1, False, True),
                              "fc1_fprop": (1, False, True), "fc1_wgrad": (2, False, False),
                              "fc2_fprop": (8, True, False), "fc2_dgrad": (1, False, True)}),
    "gpt3-175b": _recipe({**_LLAMA_70B, "qkv_wgrad": (8, False, False), "fc2_fprop": (20, True, False),
                          "fc2_dgrad": (1, False, True)}),
})
"""The userbuffer configuration by `tp_comm_overlap` value: True, Transformer Engine's defaults
(`_default`); a name, that recipe's ``ub_tp_comm_overlap_cfg`` (methods, ``num_sm``, ``set_sm_margin``,
``num_splits``, ``aggregate``) in NVIDIA/dgxc-benchmarking@35a9aec llama3.1/llama3.1_70b.yaml,
llama3.1/llama3.1_405b.yaml and nemo_megatron/gpt3_175b_hydra.yaml (its rings give no ``num_sm``: TE's 1).
``use_ce`` (copy-engine exchanges) and ``fp8_buf`` (the all-gathers') are TE's defaults, which no recipe
overrides; NVIDIA/NeMo@e938df3 megatron_gpt_model.py ``initialize_ub_func`` passes the configuration
to ``initialize_ub``."""
USERBUFFERS = CONFIGS["llama3.1-70b"]
"""The configuration NeMo 24.09 ran Llama 3.1 70B with (the megatron-core stack's)."""
CONFIG_SOURCES: Mapping[bool | str, str] = MappingProxyType({
    True: "NVIDIA/TransformerEngine@08a85d3 module/base.py initialize_ub defaults",
    "llama3.1-70b": "NVIDIA/dgxc-benchmarking@35a9aec llama3.1/llama3.1_70b.yaml ub_tp_comm_overlap_cfg",
    "llama3.1-405b": "NVIDIA/dgxc-benchmarking@35a9aec llama3.1/llama3.1_405b.yaml ub_tp_comm_overlap_cfg",
    "gpt3-175b": "NVIDIA/dgxc-benchmarking@35a9aec nemo_megatron/gpt3_175b_hydra.yaml ub_tp_comm_overlap_cfg",
})


@dataclass(frozen=True)
class ChunkedGemm:
    """One GEMM of a layer run in `chunks` beside the steps of the collective it `replaces`
    (userbuffer `buffer`, its `method`): `whole` the GEMM's seconds inside the layer's pass (what the
    chunks replace there), `chunk` one chunk's seconds on the SMs it keeps, `step` one communication
    step, `slowdown` the GEMM's slowdown beside a step (None: the device's σ), `first` an aggregated
    ring's pair exchange before its first chunk (None: none)."""

    buffer: str
    method: str
    replaces: Collective
    whole: float
    chunk: float
    chunks: int
    step: Collective
    slowdown: float | None
    first: Collective | None = None

    @property
    def forward(self) -> bool:
        return self.buffer.endswith("_fprop")

    def seconds(self, step: float, sigma: float = 0.0, first: float = 0.0) -> float:
        """The closed form of the module docstring: the chunks and the steps of `step` seconds each,
        with the device's σ `sigma` where the chunk has no slowdown of its own; an aggregated ring's
        pair exchange (`first`) takes `first` seconds before its first chunk."""
        s = sigma if self.slowdown is None else self.slowdown
        beside = self.chunk + sum(overlap_cost(self.chunk, step, s))
        if self.method == RING:
            return (first if self.first is not None else 0.0) + (self.chunks - 1) * beside + self.chunk
        if self.method == PIPELINE:
            return self.chunk + (self.chunks - 1) * beside + step
        return beside


def _split(g: Gemm, dim: int, parts: int) -> Gemm:
    dims = [g.m, g.n, g.k]
    dims[dim] = max(1, -(-dims[dim] // parts))
    return Gemm(dims[0], dims[1], dims[2], g.count)


def _roles(layer_type: str, role: str) -> tuple[str, str]:
    """(column buffer prefix, row buffer prefix) of a layer: an attention is both (qkv, proj)."""
    if layer_type == "attention" and role == "attention":
        return "qkv", "proj"
    if layer_type == "linear" and role == "column":
        return "fc1", ""
    if layer_type == "linear" and role == "row":
        return "", "fc2"
    return "", ""


def _plan(e, cost) -> list[tuple[str, Collective, Gemm, str]]:
    """(buffer, the collective it replaces, the GEMM beside it, the pass's budget) of one layer."""
    col, row = _roles(e.type, e.tp.role)
    out = []
    fwd, bx, bw = cost.forward.gemms, cost.backward_data.gemms, cost.backward_weight.gemms
    if col and e.tp.before and e.tp.before[0].op == "allgather" and fwd:
        out.append((f"{col}_fprop", e.tp.before[0], fwd[0], "forward"))
    if row and e.tp.after_fwd and e.tp.after_fwd[0].op == "reduce_scatter" and fwd:
        out.append((f"{row}_fprop", e.tp.after_fwd[0], fwd[-1], "forward"))
    if e.backward.seconds > 0:
        for c in e.tp.before_bwd:
            if row and c.op == "allgather" and not c.overlap and bx and e.backward_data.seconds > 0:
                out.append((f"{row}_dgrad", c, bx[0], "dgrad"))
            elif col and c.overlap == "dgrad" and bx and e.backward_data.seconds > 0:
                out.append((f"{col}_dgrad", c, bx[-1], "dgrad"))
        for c in e.tp.after_bwd:
            if col and c.overlap == "wgrad" and bw and e.backward_weight.seconds > 0:
                out.append((f"{col}_wgrad", c, bw[-1], "wgrad"))
    return out


def add_tp_overlap(entries: Sequence, model: Model, device: Device, dtype: str, tables: KernelTimes | None = None,
                   fused: frozenset[str] = frozenset(), fp8: bool = False, head: frozenset[str] = frozenset(),
                   config: bool | str = True) -> tuple:
    """`entries` (`dlsim.plan.layertable.LayerEntry` of a sequence-parallel table) with `tp_overlap`
    set on every attention and linear layer whose sequence-parallel collectives Transformer Engine
    overlaps (`_plan`; not the layers in `head`, the output projection Megatron runs outside TE), and
    the userbuffers' bytes as their workspace. `fp8`: the projection GEMMs run in FP8 (`dlsim.plan.fp8`);
    `config`: the userbuffer configuration (`CONFIGS`, by the strategy's ``tp_comm_overlap``)."""
    buffers = CONFIGS[config]
    sms = device.sm_count
    fp8_bytes = 1.0 / DTYPE_BYTES[dtype]
    per_row = sum(DTYPE_BYTES[dtype] * (fp8_bytes if fp8 and u.fp8_buf else 1.0) for u in buffers.values())
    cache: dict[tuple, tuple] = {}
    out = []
    for e in entries:
        layer = model.layers[e.index]
        if e.tp_degree < 2 or e.experts is not None or layer.name in head or e.forward.seconds <= 0 \
                or e.tp.role not in ("attention", "column", "row") or layer.type not in ("attention", "linear"):
            out.append(e)
            continue
        key = (layer.type, tuple(sorted((k, repr(v)) for k, v in layer.attrs.items())), layer.in_shapes,
               e.batch, e.tp_degree, e.tp, e.forward, e.backward, e.backward_weight, e.ring)
        got = cache.get(key)
        if got is None:
            cost = shard_cost(layer, layer_cost(layer, e.batch, dtype, fused), e.tp, e.tp_degree, e.batch)
            got = cache[key] = _chunked(e, cost, device, "fp8" if fp8 else dtype, None if fp8 else tables, sms,
                                        fp8_bytes if fp8 else 1.0, buffers)
        if not got:
            out.append(e)
            continue
        tokens = math.prod(layer.in_shapes[0][:-1])
        width = layer.out_shape[-1] if e.tp.role == "row" else layer.in_shapes[0][-1]
        out.append(replace(e, tp_overlap=got, workspace=max(e.workspace, e.batch * tokens * width * per_row)))
    return tuple(out)


def _chunked(e, cost, device: Device, gdtype: str, tables: KernelTimes | None, sms: int,
             fp8_scale: float, buffers: Mapping[str, Userbuffer]) -> tuple[ChunkedGemm, ...]:
    """The chunked GEMMs of one layer (`add_tp_overlap`), each pass's replaced GEMMs at most its time."""
    ring = e.ring
    budget = {"forward": e.forward.seconds - (ring.forward_core if ring else 0.0),
              "dgrad": e.backward_data.seconds - (ring.backward_core if ring else 0.0),
              "wgrad": e.backward_weight.seconds}
    tp = e.tp_degree
    out = []
    for buffer, c, g, part in _plan(e, cost):
        u = buffers[buffer]
        whole = min(gemm_seconds(g, device, gdtype, tables), max(budget[part], 0.0))
        budget[part] -= whole
        scale = fp8_scale if u.fp8_buf else 1.0
        first = None
        if u.method == RING and u.aggregate and tp % 2 == 0:  # two blocks at a time after a pair exchange
            chunks, piece = tp // 2, _split(g, 0, tp // 2)
            first = Collective("sendrecv", c.nbytes * scale / tp, f"{buffer} pair exchange", group=c.group)
            step = Collective("sendrecv", 2 * c.nbytes * scale / tp, f"{buffer} ring exchange x2", group=c.group)
        elif u.method == RING:
            chunks, piece = tp, _split(g, 0, tp)
            step = Collective("sendrecv", c.nbytes * scale / tp, f"{buffer} ring exchange", group=c.group)
        elif u.method == PIPELINE:
            chunks, piece = u.num_splits, _split(g, 1, u.num_splits)
            step = Collective("reduce_scatter", c.nbytes / u.num_splits, f"{buffer} reduce-scatter chunk", group=c.group)
        else:
            chunks, piece = 1, g
            step = Collective(c.op, c.nbytes * scale, f"{buffer} bulk {c.op}", group=c.group)
        chunk = whole if piece is g else gemm_seconds(piece, device, gdtype, tables)
        if u.set_sm_margin and sms > u.num_sm:
            chunk *= sms / (sms - u.num_sm)
        if u.method == RING:  # copy-engine exchanges; the GEMM keeps its SMs
            slowdown: float | None = 0.0
        elif u.method == PIPELINE and u.set_sm_margin:
            slowdown = 0.0 if sms > u.num_sm else None  # its SMs left to the communication: in `chunk`
        else:
            slowdown = u.num_sm / (sms - u.num_sm) if sms > u.num_sm else None
        out.append(ChunkedGemm(buffer, u.method, c, whole, chunk, chunks, step, slowdown, first))
    return tuple(out)


def tp_overlap_note(entries: Sequence, device: Device, config: bool | str = True) -> str:
    """What the record says of the overlap ('' when no layer has it) under userbuffer configuration `config`."""
    layers = sum(1 for e in entries if e.tp_overlap)
    if not layers:
        return ""
    sms = (f"GEMMs beside communication kernels run on the SMs those leave ({device.sm_count} SMs)"
           if device.sm_count else "no SM count in the profile: the device's overlap slowdown beside the "
                                   "reduce-scatters and bulk collectives, no SM margin")
    return (f"tensor-parallel overlap (Transformer Engine userbuffers, {CONFIG_SOURCES[config]}): {layers} layers' "
            f"all-gathers and reduce-scatters chunked beside their GEMMs (ring exchange, pipelined, bulk); {sms}")
