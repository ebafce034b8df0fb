"""A parallelisation strategy: how one training iteration is spread over devices (frozen data).

One glossary everywhere (YAML keys, fields, CLI flags): `dp`, `tp`, `pp`, `microbatch_size`,
`num_microbatches`, `global_batch`, `schedule`. Inside, every size is in bytes. `make_strategy`
validates user input once and raises `SpecError` naming the field and the limit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal, Optional, get_type_hints

from pydantic import BeforeValidator, Field, create_model

from dlsim.errors import SpecError
from dlsim.spec.ops import LOSS_KERNELS
from dlsim.spec.strategy_values import (COMPRESSIONS, DEFAULT_BUCKET_BYTES, DEFAULT_FIRST_BUCKET_BYTES, FSDP_UNITS,
                                         FUSIONS, GRAD_ACCUMULATIONS, JITTERS, OFFLOADS, OPTIMIZER_IMPLS, OPTIMIZERS,
                                         PARALLEL_MODES, PIPELINE_SPLITS, RECOMPUTE, SCHEDULES, SYNCS, VALUE_BITS,
                                         ZERO_GRAD_REDUCES)
from dlsim.spec.typed import Count, Fraction, NonNegativeInt, Positive, Record, Seq, as_tuple, fail, validate


@dataclass(frozen=True)
class LayerGroup:
    """Layers `first`..`last` (inclusive, model order) run `parallel` = data, model, channel or filter
    (`PARALLEL_MODES`).

    Krizhevsky 2014 ("One weird trick for parallelizing convolutional neural networks"): the
    convolutions data-parallel, the fully connected layers model-parallel over the same devices.
    Dryden et al. SC'19 ("Channel and filter parallelism for large-scale CNN training"): a layer's
    convolution split by its input channels or its filters, chosen per layer.
    """

    first: str
    last: str
    parallel: str


@dataclass(frozen=True)
class Compression:
    """Gradient compression of data-parallel traffic (reference/algorithms.md §7).

    kind: none, fp16, qsgd (`bits` per element, one norm per `bucket_elements`), topk (keep a
    `density` fraction of (index, value) pairs, values of `value_bits` bits: 32 plain, fewer
    quantised with one fp32 scale per `bucket_elements`, SparCML's quantised top-k "TopK_Q4"), 1bit
    (sign + two reconstruction floats per column, Seide et al. 2014). `error_feedback` keeps the
    residual (one more gradient copy).
    """

    kind: str = "none"
    bits: int = 4
    density: float = 0.01
    bucket_elements: int = 512
    error_feedback: bool = True
    value_bits: int = 32


@dataclass(frozen=True)
class Variability:
    """Run-time jitter and stragglers, drawn from a seeded generator.

    Every compute task's time is multiplied by a factor with mean 1 and coefficient of variation
    `jitter_cv` (distribution `jitter`); a `straggler_fraction` of the devices (chosen by the seed)
    is `straggler_slowdown` times slower; `device_slowdown` gives (rank, factor) pairs explicitly
    (heterogeneous devices).
    """

    jitter: str = "none"
    jitter_cv: float = 0.0
    straggler_fraction: float = 0.0
    straggler_slowdown: float = 1.0
    device_slowdown: tuple[tuple[int, float], ...] = ()
    seed: int = 0

    @property
    def active(self) -> bool:
        return (self.jitter != "none" and self.jitter_cv > 0) or (
            self.straggler_fraction > 0 and self.straggler_slowdown != 1.0) or bool(self.device_slowdown)


@dataclass(frozen=True)
class Strategy:
    """dp × tp × pp devices; `num_microbatches` micro-batches of `microbatch_size` per replica.

    Pipeline: `schedule` gpipe | 1f1b | interleaved (`virtual_stages` model chunks per device),
    `stage_partition` layers per chunk (None: as `pipeline_split` cuts them, `PIPELINE_SPLITS`). Data parallel: `sync` allreduce | ps |
    async | ssp (`staleness` s for ssp; `ps_shards` servers; pull every `fetch_every`, push every
    `push_every` steps; `iterations` simulated per worker), `collective` algorithm or auto,
    gradient buckets of `bucket_size` bytes (the first `first_bucket_size`), `overlap` with
    backpropagation. `recompute` none | full | selective | selective_layer | selective_op (`RECOMPUTE`;
    full: a checkpoint every `recompute_layers` transformer layers, i.e. repeated block instances);
    `zero` stage 0-3.
    `sequence_parallel` splits the layers between tensor-parallel regions along the sequence
    (Korthikanti et al. 2022). `tp_async_backward` runs the input-gradient all-reduce (or
    reduce-scatter) of column-parallel layers beside their weight-gradient kernels and sequence
    parallelism's input re-gather beside their input-gradient kernels (Megatron-LM's
    `--async-tensor-model-parallel-allreduce`, on by default there). `p2p_overlap` lets a pipeline
    stage go on computing while its sends travel; off, every exchange blocks the sender until its
    send is done (Megatron-LM's default: `--overlap-p2p-communication` off). `p2p_scatter_gather`
    sends a replicated stage boundary as 1/tp slices, one per tensor-parallel rank, and all-gathers
    them at the receiver (Narayanan et al. SC'21 §4.1). `ep` is the expert-parallel degree: the experts of every
    mixture-of-experts layer spread over ep data-parallel ranks, tokens dispatched to them and
    combined back by all-to-alls, expert gradients reduced over the dp·cp/ep ranks holding the same
    experts (`dlsim.plan.expertparallel`); `ep_overlap` runs the shared experts beside those
    all-to-alls (Megatron-Core's --moe-shared-expert-overlap). `fused_kernels` names the stack's fused kernels
    (`FUSIONS`; none assumed), `loss_kernel` its cross-entropy (`LOSS_KERNELS`, `dlsim.cost.loss`),
    `grad_accumulation` how each micro-batch's weight gradient is added into the gradient buffer.
    `cp` is the context-parallel degree: each of `cp` ranks holds 1/cp of every sequence (two of
    its 2·cp chunks, Megatron-LM's causal load balancing) and runs ring attention over the cp
    group (`dlsim.plan.contextparallel`); gradients are reduced over dp x cp. `hybrid_shard`
    shards the ZeRO stage's model states within each node and replicates them across nodes
    (PyTorch FSDP HYBRID_SHARD; `zero: 3` is FSDP's FULL_SHARD, `zero: 1` Megatron-LM's
    distributed optimizer): reduce-scatter and all-gather over the node's dp ranks, the shard's
    gradients all-reduced across nodes (`dlsim.plan.zero`). `offload` moves activations, the
    optimizer state or both to host memory over the device's host link (`dlsim.plan.offload`).
    `optimizer_impl` says how the optimizer step runs: fused, PyTorch's foreach ops or a per-tensor
    loop (`dlsim.cost.memory.optimizer_step_traffic`). `grad_reduce_dtype` is the dtype of the
    gradient buffer the data-parallel reduction runs on (fp32 in Megatron-LM's
    ``--accumulate-allreduce-grads-in-fp32``, FSDP2's ``reduce_dtype``; empty: fp32 for an fp32
    accumulation, else the training dtype, `dlsim.plan.dataparallel.reduce_element_bytes`): bucket
    bytes follow it, ZeRO-3's parameter gathers stay in the training dtype; gradient memory and the
    tied embedding's all-reduce follow the buffer itself, fp32 for an fp32 accumulation even when the
    wire carries `grad_reduce_dtype` (DeepSpeed's BF16_Optimizer: `buffer_element_bytes`).
    `zero_grad_reduce` is the collective ZeRO-1 reduces the gradients with: ``reduce_scatter`` (each
    rank receives its shard's sum, ZeRO §5.1) or ``allreduce`` (the whole buffer summed on every rank,
    each then steps on its shard: DeepSpeed 0.6.5's BF16_Optimizer under the pipeline engine); only
    with zero 1 and no hybrid sharding (`dlsim.plan.zero.gradient_collective`).
    `fsdp_units` cuts ZeRO-3's parameter units by bucket size (``bucket``) or, as torchtitan wraps
    FSDP2, one per transformer block with a root unit for the rest, the root and the last block kept
    gathered from forward to backward (``block``); `fsdp_copies` runs FSDP2's all-gather copy-out on
    the compute stream and its reduce-scatter copy-in on the reduction stream (`dlsim.plan.fsdp`).
    Both apply to zero 3 only and are inert at other stages.
    `param_gather_overlap` runs ZeRO-1/2's all-gather of the updated parameters beside the next
    iteration's first forward pass, each bucket's gather waited for by its first layer
    (Megatron-Core's ``--overlap-param-gather``, apex DistributedFusedAdam's ``overlap_param_sync``;
    `dlsim.plan.zero.gathers_in_forward`). `tp_comm_overlap` overlaps sequence parallelism's
    all-gathers and reduce-scatters with the GEMMs beside them, as Transformer Engine's userbuffers
    run them (NeMo's ``ub_tp_comm_overlap``, Megatron-Core's ``--tp-comm-overlap``): ring exchange,
    pipelined chunks, bulk overlap in the backward (`dlsim.plan.tpoverlap`); it needs sequence
    parallelism (tp >= 2). True runs Transformer Engine's default userbuffer configuration (no
    ``ub_tp_comm_overlap_cfg``); a name (`TP_OVERLAP_CONFIGS`) runs a recipe's configuration: SM
    counts, SM margins and two-chunk rings per GEMM. `spatial` is the spatial-parallel degree: the `spatial`
    ranks of a sample group split every image by height and width (a grid with `spatial_w` ranks
    along the width, 0: the squarest), convolutions exchanging halos with their neighbours, beside
    the interior's compute with `halo_overlap` (Dryden et al. IPDPS'19, `dlsim.plan.spatial`);
    with dp > 1 the sample × spatial hybrid, gradients reduced over dp x spatial. `stack` names the software stack whose values the stack-owned fields took (`dlsim.spec.stack`;
    empty: every field as given).
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    microbatch_size: int = 1
    num_microbatches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    sync: str = "allreduce"
    staleness: int = 0
    ps_shards: int = 1
    fetch_every: int = 1
    push_every: int = 1
    iterations: int = 20
    collective: str = "auto"
    bucket_size: float = DEFAULT_BUCKET_BYTES
    first_bucket_size: float = DEFAULT_FIRST_BUCKET_BYTES
    overlap: bool = True
    recompute: str = "none"
    zero: int = 0
    compression: Compression = field(default_factory=Compression)
    variability: Variability = field(default_factory=Variability)
    stage_partition: tuple[int, ...] | None = None
    pipeline_split: str = "balanced"
    layer_groups: tuple[LayerGroup, ...] = ()
    optimizer: str = "adam"
    dtype: str | None = None
    sequence_parallel: bool = False
    tp_async_backward: bool = False
    p2p_overlap: bool = True
    p2p_scatter_gather: bool = False
    fused_kernels: tuple[str, ...] = ()
    loss_kernel: str = "single_pass"
    recompute_layers: int = 1
    ep: int = 1
    ep_overlap: bool = False
    grad_accumulation: str = "autograd"
    cp: int = 1
    hybrid_shard: bool = False
    offload: str = "none"
    optimizer_impl: str = "fused"
    grad_reduce_dtype: str = ""
    zero_grad_reduce: str = "reduce_scatter"
    fsdp_units: str = "bucket"
    fsdp_copies: bool = False
    param_gather_overlap: bool = False
    tp_comm_overlap: bool | str = False
    spatial: int = 1
    spatial_w: int = 0
    halo_overlap: bool = True
    stack: str = ""

    @property
    def global_batch(self) -> int:
        return self.dp * self.microbatch_size * self.num_microbatches

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp * self.domain

    @property
    def domain(self) -> int:
        """Ranks that split each sample: the context-parallel ranks of a sequence or the spatial
        ranks of an image (one of the two is 1); the rank layout's sample-group axis."""
        return self.cp * self.spatial

    @property
    def dp_cp(self) -> int:
        """Ranks holding the same parameters: gradients are reduced (and ZeRO shards spread) over
        dp x cp (Megatron-LM's data-parallel group with context parallelism), dp x spatial."""
        return self.dp * self.domain

    @property
    def chunks(self) -> int:
        """Model chunks in the whole pipeline: pp · virtual_stages."""
        return self.pp * self.virtual_stages

    def to_dict(self) -> dict[str, Any]:
        c, v = self.compression, self.variability
        return {
            "dp": self.dp, "tp": self.tp, "pp": self.pp, "microbatch_size": self.microbatch_size,
            "num_microbatches": self.num_microbatches, "global_batch": self.global_batch,
            "schedule": self.schedule, "virtual_stages": self.virtual_stages, "sync": self.sync,
            "staleness": self.staleness, "ps_shards": self.ps_shards, "fetch_every": self.fetch_every,
            "push_every": self.push_every, "iterations": self.iterations, "collective": self.collective,
            "bucket_size_bytes": self.bucket_size, "first_bucket_size_bytes": self.first_bucket_size,
            "overlap": self.overlap, "recompute": self.recompute, "zero": self.zero,
            "compression": {"kind": c.kind, "bits": c.bits, "density": c.density,
                            "bucket_elements": c.bucket_elements, "error_feedback": c.error_feedback,
                            "value_bits": c.value_bits},
            "variability": {"jitter": v.jitter, "jitter_cv": v.jitter_cv,
                            "straggler_fraction": v.straggler_fraction,
                            "straggler_slowdown": v.straggler_slowdown,
                            "device_slowdown": [list(p) for p in v.device_slowdown], "seed": v.seed},
            "stage_partition": list(self.stage_partition) if self.stage_partition else None,
            "pipeline_split": self.pipeline_split,
            "layer_groups": [{"first": g.first, "last": g.last, "parallel": g.parallel} for g in self.layer_groups],
            "optimizer": self.optimizer, "dtype": self.dtype,
            "sequence_parallel": self.sequence_parallel, "tp_async_backward": self.tp_async_backward,
            "p2p_overlap": self.p2p_overlap, "p2p_scatter_gather": self.p2p_scatter_gather,
            "fused_kernels": list(self.fused_kernels), "loss_kernel": self.loss_kernel, "ep": self.ep, "ep_overlap": self.ep_overlap,
            "recompute_layers": self.recompute_layers, "grad_accumulation": self.grad_accumulation,
            "cp": self.cp, "hybrid_shard": self.hybrid_shard, "offload": self.offload,
            "optimizer_impl": self.optimizer_impl, "grad_reduce_dtype": self.grad_reduce_dtype or None,
            "zero_grad_reduce": self.zero_grad_reduce, "fsdp_units": self.fsdp_units, "fsdp_copies": self.fsdp_copies,
            "param_gather_overlap": self.param_gather_overlap, "tp_comm_overlap": self.tp_comm_overlap,
            "spatial": self.spatial, "spatial_w": self.spatial_w, "halo_overlap": self.halo_overlap,
            "stack": self.stack,
        }


class CompressionRecord(Record):
    """`Compression` as a user writes it (`dlsim.spec.typed`)."""

    kind: Literal[COMPRESSIONS] = "none"  # type: ignore[valid-type]
    bits: Annotated[int, Field(ge=1, le=16)] = 4
    density: Fraction = 0.01
    bucket_elements: Count = 512
    error_feedback: bool = True
    value_bits: Literal[VALUE_BITS] = 32  # type: ignore[valid-type]


class VariabilityRecord(Record):
    """`Variability` as a user writes it."""

    jitter: Literal[JITTERS] = "none"  # type: ignore[valid-type]
    jitter_cv: Annotated[float, Field(ge=0.0, le=10.0)] = 0.0
    straggler_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    straggler_slowdown: Annotated[float, Field(ge=1)] = 1.0
    device_slowdown: Seq[Annotated[tuple[NonNegativeInt, Positive], BeforeValidator(as_tuple)]] = ()
    seed: NonNegativeInt = 0


class LayerGroupRecord(Record):
    first: str
    last: str
    parallel: Literal[PARALLEL_MODES]  # type: ignore[valid-type]


DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
TP_OVERLAP_CONFIGS = ("llama3.1-70b", "llama3.1-405b", "gpt3-175b")
"""`tp_comm_overlap`'s named userbuffer configurations: the ``ub_tp_comm_overlap_cfg`` of NVIDIA's
dgxc-benchmarking recipes of those models (`dlsim.plan.tpoverlap.CONFIGS`)."""
GRAD_REDUCE_DTYPES = ("", "fp32", "bf16", "fp16")
"""`grad_reduce_dtype`: empty for the default (fp32 for an fp32 accumulation, else the training dtype)."""


def _tp_overlap(value: Any) -> Any:
    if isinstance(value, bool) or value in TP_OVERLAP_CONFIGS:
        return value
    raise fail(f"must be true, false or a userbuffer configuration ({', '.join(TP_OVERLAP_CONFIGS)}), got {value!r}")


_RANGES: dict[str, Any] = {
    **{name: Count for name in ("dp", "tp", "pp", "cp", "ep", "microbatch_size", "num_microbatches", "virtual_stages",
                                "ps_shards", "fetch_every", "push_every", "iterations", "recompute_layers", "spatial")},
    "spatial_w": NonNegativeInt, "staleness": NonNegativeInt, "zero": Annotated[int, Field(ge=0, le=3)], "bucket_size": Positive, "first_bucket_size": Positive,
    "schedule": Literal[SCHEDULES], "sync": Literal[SYNCS], "recompute": Literal[RECOMPUTE],
    "optimizer": Literal[OPTIMIZERS], "offload": Literal[OFFLOADS], "grad_accumulation": Literal[GRAD_ACCUMULATIONS],
    "optimizer_impl": Literal[OPTIMIZER_IMPLS], "grad_reduce_dtype": Literal[GRAD_REDUCE_DTYPES],
    "zero_grad_reduce": Literal[ZERO_GRAD_REDUCES], "fsdp_units": Literal[FSDP_UNITS], "loss_kernel": Literal[LOSS_KERNELS],
    "pipeline_split": Literal[PIPELINE_SPLITS],
    "tp_comm_overlap": Annotated[bool | Literal[TP_OVERLAP_CONFIGS], BeforeValidator(_tp_overlap)],
    "stack": Annotated[str, Field(max_length=4096)],
    "dtype": Optional[Literal[DTYPES]], "fused_kernels": Seq[Literal[FUSIONS]],
    "stage_partition": Optional[Seq[Count]], "layer_groups": Seq[LayerGroupRecord],
    "compression": CompressionRecord, "variability": VariabilityRecord,
}
"""The range or the choices of each strategy field; a field not named here is checked against its type in
`Strategy` (so a new field is validated, strictly typed, from the moment it exists)."""


def _record() -> type[Record]:
    hints = get_type_hints(Strategy)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Strategy):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        fields[f.name] = (_RANGES.get(f.name, hints[f.name]),
                          dataclasses.asdict(default) if dataclasses.is_dataclass(default) else default)
    return create_model("StrategyRecord", __base__=Record, __doc__="A `Strategy`'s fields as a user gives them.",
                        **fields)


StrategyRecord = _record()


class _BatchRecord(Record):
    dp: Count = 1
    global_batch: Count | None = None
    microbatch_size: Count | None = None
    num_microbatches: Count | None = None


PIPELINED_MICROBATCH = 1
"""The micro-batch size of a pipelined strategy given only its global batch: one sample per
micro-batch, as Megatron-LM's pipelined examples run (NVIDIA/Megatron-LM examples/
pretrain_gpt_distributed_with_mp.sh --micro-batch-size 1): many micro-batches fill the pipeline."""


def _batch_sizes(dp: int, microbatch_size: int | None, num_microbatches: int | None,
                 global_batch: int | None, pp: int = 1) -> tuple[int, int]:
    """(microbatch_size, num_microbatches) from any two of the three, checked against the third; a
    global batch alone gives one micro-batch per replica, or with a pipeline (`pp` > 1) micro-batches
    of `PIPELINED_MICROBATCH` samples."""
    validate(_BatchRecord, {"dp": dp, "global_batch": global_batch, "microbatch_size": microbatch_size,
                            "num_microbatches": num_microbatches})
    if global_batch is None:
        return microbatch_size or 1, num_microbatches or 1
    per_replica, rest = divmod(global_batch, dp)
    if rest:
        raise SpecError(f"global_batch {global_batch} is not divisible by dp {dp} (remainder {rest})",
                        field="global_batch")
    if microbatch_size is None and num_microbatches is None:
        if pp > 1 and per_replica % PIPELINED_MICROBATCH == 0:
            return PIPELINED_MICROBATCH, per_replica // PIPELINED_MICROBATCH
        return per_replica, 1
    if microbatch_size is None:
        mbs, rest = divmod(per_replica, num_microbatches)  # type: ignore[arg-type]
        if rest:
            raise SpecError(f"global_batch {global_batch} / dp {dp} = {per_replica} samples is not divisible by "
                            f"num_microbatches {num_microbatches} (remainder {rest})", field="global_batch")
        return mbs, num_microbatches  # type: ignore[return-value]
    if num_microbatches is None:
        m, rest = divmod(per_replica, microbatch_size)
        if rest or m == 0:
            raise SpecError(f"global_batch {global_batch} / dp {dp} = {per_replica} samples is not a multiple of "
                            f"microbatch_size {microbatch_size}", field="global_batch")
        return microbatch_size, m
    if dp * microbatch_size * num_microbatches != global_batch:
        raise SpecError(f"global_batch {global_batch} != dp {dp} x microbatch_size {microbatch_size} x "
                        f"num_microbatches {num_microbatches} = {dp * microbatch_size * num_microbatches}",
                        field="global_batch")
    return microbatch_size, num_microbatches


def make_strategy(*, global_batch: int | None = None, microbatch_size: int | None = None,
                  num_microbatches: int | None = None, **fields: Any) -> Strategy:
    """Validate and build a `Strategy`; any two of the batch sizes determine the third. A sweep or a
    search builds the same strategy many times: the last `_MADE` are kept by `_exact_key` (a pure
    function of the values and their types; errors are raised again, never kept)."""
    key = _exact_key(dict(fields, global_batch=global_batch, microbatch_size=microbatch_size,
                          num_microbatches=num_microbatches))
    if key is not None and key in _MADE:
        return _MADE[key]
    s = _make_strategy(global_batch, microbatch_size, num_microbatches, fields)
    if key is not None:
        if len(_MADE) >= MADE_KEPT:
            _MADE.pop(next(iter(_MADE)))
        _MADE[key] = s
    return s


MADE_KEPT = 4096
_MADE: dict[tuple, Strategy] = {}


def _exact_key(fields: dict[str, Any]) -> tuple | None:
    """`fields` as a key that tells apart what validation tells apart: the names in their order, the
    values and their types (and a tuple's items' types: 1, 1.0 and True are equal in Python, not to the
    validator); None where a value is neither a scalar nor a tuple of scalars (lists, mappings, records:
    validated every time)."""
    values = tuple(fields.values())
    types = tuple(map(type, values))
    inner: tuple = ()
    if not _SCALARS.issuperset(types):
        for v, t in zip(values, types):
            if t is not tuple:
                if t not in _SCALARS:
                    return None
                continue
            items = tuple(map(type, v))
            if not _SCALARS.issuperset(items):
                return None
            inner += (items,)
    return tuple(fields), values, types, inner


_SCALARS = frozenset({int, float, str, bool, type(None)})


def _make_strategy(global_batch: int | None, microbatch_size: int | None, num_microbatches: int | None,
                   fields: dict[str, Any]) -> Strategy:
    known = StrategyRecord.model_fields
    for key in fields:
        if key not in known:
            raise SpecError(f"unknown strategy field (known: {', '.join(sorted({*known, 'global_batch'}))})",
                            field=key)
    pp = fields.get("pp", 1)
    mbs, m = _batch_sizes(fields.get("dp", 1), microbatch_size, num_microbatches, global_batch,
                          pp if isinstance(pp, int) and not isinstance(pp, bool) else 1)
    s = Strategy(**fields, microbatch_size=mbs, num_microbatches=m)
    return validate_strategy(s)


def _check_expert_parallel(s: Strategy) -> None:
    """ep: the expert-parallel degree, a divisor of dp (the experts of every mixture-of-experts layer
    spread over ep data-parallel ranks; whether it divides the experts is checked against the model)."""
    if s.ep == 1:
        return
    if s.dp % s.ep:
        raise SpecError(f"ep {s.ep} does not divide dp {s.dp} (expert parallelism spreads the experts over "
                        f"data-parallel ranks)", field="ep")
    if s.sync != "allreduce":
        raise SpecError(f"expert parallelism needs sync allreduce, got {s.sync}", field="ep")
    if s.zero == 3:
        raise SpecError("expert parallelism with ZeRO stage 3 is not modelled (use zero 0, 1 or 2 with ep > 1)",
                        field="ep")
    if s.layer_groups:
        raise SpecError("expert parallelism cannot be combined with layer_groups", field="ep")
    if s.hybrid_shard:
        raise SpecError("expert parallelism with hybrid sharding is not modelled (use hybrid_shard false with ep > 1)",
                        field="ep")
    if s.compression.kind != "none":
        raise SpecError("expert parallelism with gradient compression is not modelled (use compression none)",
                        field="ep")
    if s.cp > 1:
        raise SpecError("expert parallelism with context parallelism is not modelled (use cp 1 with ep > 1)",
                        field="ep")


def _check_spatial(s: Strategy) -> None:
    """spatial: the ranks splitting each image (`dlsim.plan.spatial`), with sample parallelism (dp)
    and pipelines; not beside tensor, context or expert parallelism or layer groups (each field's own
    range is `StrategyRecord`'s)."""
    if s.spatial_w and s.spatial % s.spatial_w:
        raise SpecError(f"spatial_w {s.spatial_w} does not divide spatial {s.spatial}", field="spatial_w")
    if s.spatial == 1:
        return
    for name, other in (("tp", s.tp), ("cp", s.cp), ("ep", s.ep)):
        if other > 1:
            raise SpecError(f"spatial parallelism with {name} > 1 is not modelled (use {name} 1 with spatial > 1)",
                            field="spatial")
    if s.layer_groups:
        raise SpecError("spatial parallelism splits every image layer; it cannot be combined with layer_groups",
                        field="spatial")
    if s.sync != "allreduce":
        raise SpecError(f"spatial parallelism needs sync allreduce, got {s.sync}", field="spatial")


def _normalized(s: Strategy, rec: Any) -> Strategy:
    """`s` with its sequences as tuples and its nested records as the dataclasses (lists and tuples, mappings
    and dataclasses are accepted alike); scalars stay as given."""
    changes: dict[str, Any] = {}
    for name in ("fused_kernels", "stage_partition"):
        if getattr(s, name) is not None and type(getattr(s, name)) is not tuple:
            changes[name] = getattr(rec, name)
    if type(s.layer_groups) is not tuple or not all(isinstance(g, LayerGroup) for g in s.layer_groups):
        changes["layer_groups"] = tuple(LayerGroup(**dict(g)) for g in rec.layer_groups)
    if not isinstance(s.compression, Compression):
        changes["compression"] = Compression(**dict(rec.compression))
    v = s.variability
    if not isinstance(v, Variability) or type(v.device_slowdown) is not tuple or \
            not all(type(p) is tuple for p in v.device_slowdown):
        changes["variability"] = Variability(**dict(rec.variability))
    return replace(s, **changes) if changes else s


def validate_strategy(s: Strategy) -> Strategy:
    """`s` checked: each field's type and range (`StrategyRecord`), then the rules between fields; raises
    `SpecError` naming the first bad field. Returns `s` with lists as tuples (`_normalized`)."""
    s = _normalized(s, validate(StrategyRecord, s, from_attributes=True))
    if s.virtual_stages > 1 and s.schedule != "interleaved":
        raise SpecError(f"virtual_stages {s.virtual_stages} needs schedule interleaved", field="virtual_stages")
    if s.schedule == "interleaved":
        if s.pp < 2:
            raise SpecError("the interleaved schedule needs pp >= 2", field="schedule")
        if s.num_microbatches % s.pp:
            raise SpecError(f"the interleaved schedule needs num_microbatches ({s.num_microbatches}) divisible by "
                            f"pp ({s.pp}) (Megatron-LM)", field="num_microbatches")
    if s.sync != "allreduce" and s.zero:
        raise SpecError(f"zero {s.zero} needs sync allreduce, got {s.sync}", field="zero")
    if s.compression.kind != "none" and s.zero:
        raise SpecError(f"compression {s.compression.kind} needs zero 0 (sharded gradients are reduce-scattered "
                        f"uncompressed)", field="compression")
    if s.stage_partition is not None and len(s.stage_partition) != s.chunks:
        raise SpecError(f"needs {s.chunks} entries (pp x virtual_stages), got {len(s.stage_partition)}",
                        field="stage_partition")
    if s.layer_groups and s.pp > 1:
        raise SpecError("layer_groups (data / model / channel / filter per layer group) need pp = 1", field="layer_groups")
    if s.layer_groups and s.tp > 1 and any(g.parallel == "model" for g in s.layer_groups):
        raise SpecError("layer_groups with tp > 1 choose channel or filter splits inside the tp groups; model groups "
                        "are split over the dp devices and need tp = 1", field="layer_groups")
    if s.sequence_parallel and s.tp < 2:
        raise SpecError("sequence parallelism splits tensor-parallel regions and needs tp >= 2", field="sequence_parallel")
    if s.tp_comm_overlap and not s.sequence_parallel:
        needs = f"tp >= 2 and sequence_parallel; tp is {s.tp}" if s.tp < 2 else "sequence_parallel (off here)"
        raise SpecError(f"overlaps sequence parallelism's all-gathers and reduce-scatters with their GEMMs and needs "
                        f"{needs}", field="tp_comm_overlap")
    _check_expert_parallel(s)
    _check_spatial(s)
    if s.hybrid_shard and not s.zero:
        raise SpecError("hybrid sharding shards a ZeRO stage's states within a node: needs zero 1, 2 or 3",
                        field="hybrid_shard")
    if s.zero_grad_reduce != "reduce_scatter" and (s.zero != 1 or s.hybrid_shard):
        raise SpecError(f"{s.zero_grad_reduce} of the gradients applies to zero 1 without hybrid sharding (got zero "
                        f"{s.zero}{', hybrid_shard' if s.hybrid_shard else ''})", field="zero_grad_reduce")
    if s.offload != "none" and s.sync != "allreduce":
        raise SpecError(f"offload needs sync allreduce, got {s.sync}", field="offload")
    if s.offload in ("activations", "both") and s.recompute in ("selective_layer", "selective_op"):
        raise SpecError(f"activation offload with recompute {s.recompute} is not modelled (none, selective or full)",
                        field="offload")
    if s.cp > 1 and s.sync != "allreduce":
        raise SpecError(f"context parallelism needs sync allreduce, got {s.sync}", field="cp")
    if s.cp > 1 and s.layer_groups:
        raise SpecError("context parallelism splits the sequence of every layer; it cannot be combined with layer_groups", field="cp")
    return s
