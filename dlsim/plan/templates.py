"""Per-chunk step lists: the forward, backward and recompute pass of one model chunk for one
micro-batch, as runs of layer kernels separated by the blocking collectives tensor parallelism
puts between them (`dlsim.plan.tensorparallel`). Instantiated once per micro-batch and device by
`dlsim.plan.iteration`.

Consecutive layers without communication between them become one compute step (their kernels run
back to back on one stream, so one task with the summed time is the same timeline). A backward
pass can be split where gradient buckets become complete, so that their reduction can start
while the rest of the backward pass runs (wait-free backpropagation).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, Sequence

from dlsim.plan.expertparallel import EP
from dlsim.plan.layertable import LayerEntry
from dlsim.plan.spatial import SPATIAL
from dlsim.plan.taskgraph import COMM, COMPUTE, RECOMPUTE
from dlsim.plan.tensorparallel import Collective
from dlsim.plan.tpoverlap import BULK, PIPELINE, RING, ChunkedGemm

_NO_CHUNKS: dict = {}


class Step(NamedTuple):
    """A compute run (`duration`, of which `measured` seconds come from measured tables), a
    blocking collective (`collective` over the layer's model-parallel group `group`: "tp", or "dp"
    for model-parallel layer groups split over the data-parallel ranks), or an "overlap": a compute
    run and a collective that start together, the next step waiting for both. `buckets` lists the
    gradient buckets complete after this step; `unit` the parameter unit (ZeRO-3 / FSDP) its layers
    belong to (−1: not split by units). An overlap's kernels slow down by `slowdown` beside its
    collective (None: the device's overlap slowdown, `dlsim.cost.overlap`); with `own_stream` its
    collective runs on a stream of its own (Transformer Engine's userbuffer streams,
    `dlsim.plan.tpoverlap`), not behind the device's other communication.

    An immutable record (a named tuple: a pass's step list holds hundreds of steps and a search
    builds thousands of passes; a tuple is made in about a third of a frozen dataclass's time)."""

    kind: str
    name: str
    category: str
    duration: float = 0.0
    measured: float = 0.0
    collective: Collective | None = None
    group: str = "tp"
    buckets: tuple[int, ...] = ()
    unit: int = -1
    slowdown: float | None = None
    own_stream: bool = False

    def sigma(self, device_sigma: float) -> float:
        """The slowdown of this overlap's kernels on a device whose own is `device_sigma`."""
        return device_sigma if self.slowdown is None else self.slowdown


class StepHooks(Protocol):
    """Called while a step list is instantiated: extra dependencies before a step, and the task
    that ran it after (gradient buckets ready, parameter units to gather and release)."""

    def before(self, step: Step) -> list[int]: ...

    def after(self, step: Step, tid: int) -> None: ...


def units_of(entries: Sequence[LayerEntry], buckets) -> dict[int, int]:
    """Parameter unit of every layer of a chunk: the bucket holding it; a layer without parameters
    joins the unit of the closest earlier layer with parameters (else the closest later one)."""
    holder = {i: j for j, b in enumerate(buckets) for i in b.layers}
    out: dict[int, int] = {}
    current = next((holder[e.index] for e in entries if e.index in holder), -1)
    for e in entries:
        current = holder.get(e.index, current)
        out[e.index] = current
    return out


class _Acc:
    """A pass's `Step`s as they are made."""

    def __init__(self, category: str, lead: dict[int, float] | None = None):
        self.category = category
        self.steps: list = []
        self.first = self.last = ""  # the current run's first and last layer names, `count` of them
        self.count = 0
        self.duration = 0.0
        self.measured = 0.0
        self.unit = -1
        self.lead = lead or {}  # per parameter unit: seconds run at its first step in the pass
        self.entered: set[int] = set()

    def add(self, name: str, seconds: float, table_share: float) -> None:
        """`seconds` of kernels of layer `name`, `table_share` of them priced from measured tables."""
        if not self.count:
            self.first = name
        self.last = name
        self.count += 1
        self.duration += seconds
        self.measured += seconds * table_share

    def flush(self, buckets: tuple[int, ...] = ()) -> None:
        n = self.count
        if n or buckets:
            name = self.first if n == 1 else f"{self.first}..{self.last}" if n else "-"
            self.steps.append(Step("compute", name, self.category, self.duration, self.measured, None, "tp",
                                   buckets, self.unit))
            self.count, self.duration, self.measured = 0, 0.0, 0.0

    def collective(self, c: Collective, group: str) -> None:
        if self.count:
            self.flush()
        self.steps.append(Step("collective", c.why, COMM, 0.0, 0.0, c, group, (), self.unit))

    def overlap(self, name: str, seconds: float, table_share: float, c: Collective, group: str,
                slowdown: float | None = None, own_stream: bool = False) -> None:
        if self.count:
            self.flush()
        self.steps.append(Step("overlap", name, self.category, seconds, seconds * table_share, c, group, (),
                               self.unit, slowdown, own_stream))

    def enter(self, unit: int) -> None:
        """Start a new parameter unit (flushing the current run)."""
        if unit != self.unit:
            self.flush()
            self.unit = unit
            if unit not in self.entered:
                self.entered.add(unit)
                if self.lead.get(unit):  # FSDP2's all-gather copy-out (`dlsim.plan.fsdp`)
                    self.add(f"copy-out unit{unit}", self.lead[unit], 0.0)


class _LeanAcc(_Acc):
    """A pass's steps made as the tuples the analytic evaluator keeps (`dlsim.plan.evaluate.leansteps`:
    kind, kernel seconds, the collective's op, bytes and messages, group, buckets, unit, slowdown): the
    fields of `_Acc`'s steps that the evaluator reads, without making the steps (no names, no measured
    shares; tests/test_lean_steps.py holds the two equal)."""

    def add(self, name: str, seconds: float, table_share: float) -> None:
        self.count += 1
        self.duration += seconds

    def flush(self, buckets: tuple[int, ...] = ()) -> None:
        if self.count or buckets:
            self.steps.append(("compute", self.duration, None, 0.0, (), "tp", buckets, self.unit, None))
            self.count, self.duration = 0, 0.0

    def collective(self, c: Collective, group: str) -> None:
        if self.count:
            self.flush()
        self.steps.append(("collective", 0.0, c.op, c.nbytes, c.messages, group, (), self.unit, None))

    def overlap(self, name: str, seconds: float, table_share: float, c: Collective, group: str,
                slowdown: float | None = None, own_stream: bool = False) -> None:
        if self.count:
            self.flush()
        self.steps.append(("overlap", seconds, c.op, c.nbytes, c.messages, group, (), self.unit, slowdown))


def _group(entry: LayerEntry, tp: int, c: Collective) -> str:
    if c.group:
        return c.group
    return "tp" if entry.tp_degree == tp else "dp"


def _ring(acc: _Acc, e: LayerEntry, table_share: float, forward: bool) -> float:
    """Context parallelism: an attention's core as its KV ring (`dlsim.plan.contextparallel`): cp
    equal steps, each but the last beside the exchange of a KV block (and, backward, its gradient)
    with the ring's neighbours. Returns the core seconds emitted (0 without a ring)."""
    r = e.ring
    if r is None:
        return 0.0
    core = r.forward_core if forward else r.backward_core
    nbytes = r.kv_bytes if forward else 2 * r.kv_bytes
    why = "cp ring KV" if forward else "cp ring KV+dKV"
    for _ in range(r.cp - 1):
        acc.overlap(e.name, core / r.cp, table_share, Collective("sendrecv", nbytes, why, group="cp"), "cp")
    acc.add(e.name, core / r.cp, table_share)
    return core


def _halo(acc: _Acc, e: LayerEntry, seconds: float, table_share: float, forward: bool) -> float:
    """Spatial parallelism: a window layer's halo exchange before its pass, or beside the interior
    share of it (`dlsim.plan.spatial`). Returns the pass's seconds emitted (0 without a halo)."""
    h = e.halo
    c = None if h is None else (h.forward if forward else h.backward)
    if c is None:
        return 0.0
    if h.overlap > 0:
        acc.overlap(e.name, seconds * h.overlap, table_share, c, SPATIAL)
        acc.add(e.name, seconds * (1 - h.overlap), table_share)
    else:
        acc.collective(c, SPATIAL)
        acc.add(e.name, seconds, table_share)
    return seconds


def _chunked(acc: _Acc, e: LayerEntry, g: ChunkedGemm, tp: int) -> None:
    """A GEMM in chunks beside its collective's steps (`dlsim.plan.tpoverlap`): ring exchange, each
    chunk but the last beside one exchange; pipelined, each chunk's reduce-scatter beside the next
    chunk and the last one's alone; bulk, the whole GEMM beside the whole collective. An aggregated
    ring's pair exchange comes first, alone."""
    group = _group(e, tp, g.step)
    share = (e.forward if g.forward else e.backward).table_share
    if g.first is not None:
        acc.collective(g.first, group)
    if g.method == PIPELINE:
        acc.add(e.name, g.chunk, share)
    for _ in range(g.chunks - 1 if g.method != BULK else 1):
        acc.overlap(e.name, g.chunk, share, g.step, group, g.slowdown, True)
    if g.method == RING:
        acc.add(e.name, g.chunk, share)
    elif g.method == PIPELINE:
        acc.collective(g.step, group)


def _experts_forward(acc: _Acc, e: LayerEntry, tp: int) -> None:
    """A mixture of experts under expert parallelism (`dlsim.plan.expertparallel`): the router, the
    dispatch all-to-all (the shared experts beside it when `ExpertPlan.overlap`), the experts, the
    combine all-to-all."""
    p = e.experts
    assert p is not None
    for c in e.tp.before:
        acc.collective(c, _group(e, tp, c))
    _experts_run(acc, e, e.forward, p.router_forward, p.shared_forward, p.dispatch, p.combine, 0.0)
    for c in e.tp.after_fwd:
        acc.collective(c, _group(e, tp, c))


def _experts_backward(acc: _Acc, e: LayerEntry, tp: int, ready_at: dict[int, tuple[int, ...]] | None) -> None:
    """The backward of `_experts_forward` in reverse: the combine's gradient all-to-all (the shared
    experts' backward beside it when overlapped), the experts' backward, the dispatch's gradient
    all-to-all, the router's backward."""
    p = e.experts
    assert p is not None
    for c in e.tp.before_bwd:
        acc.collective(c, _group(e, tp, c))
    _experts_run(acc, e, e.backward, 0.0, p.shared_backward, p.combine, p.dispatch, p.router_backward)
    if ready_at and e.index in ready_at:
        acc.flush(ready_at[e.index])
    for c in e.tp.after_bwd:
        acc.collective(c, _group(e, tp, c))


def _experts_run(acc: _Acc, e: LayerEntry, total, head: float, shared: float, beside: Collective,
                 after: Collective, tail: float) -> None:
    """`head` seconds of kernels, the all-to-all `beside` (the shared experts' `shared` seconds run
    beside it when overlapped, else after it), the rest of the pass, the all-to-all `after`, then
    `tail` seconds; `total` is the pass's Estimate."""
    src, rest = total.table_share, total.seconds - head - tail
    if head:
        acc.add(e.name, head, src)
    if e.experts is not None and e.experts.overlap and shared > 0:
        acc.overlap(e.name, shared, src, beside, EP)
        rest -= shared
    else:
        acc.collective(beside, EP)
    acc.add(e.name, rest, src)
    acc.collective(after, EP)
    if tail:
        acc.add(e.name, tail, src)


def forward_steps(entries: Sequence[LayerEntry], tp: int, category: str = COMPUTE,
                  unit_of: dict[int, int] | None = None, unit_lead: dict[int, float] | None = None,
                  lean: bool = False) -> list[Step]:
    """Forward pass of a chunk (`category` recompute for a full recomputation); with `unit_of`
    (layer index → parameter unit) the pass is split where the unit changes, and `unit_lead` (unit →
    seconds, FSDP2's all-gather copy-out, `dlsim.plan.fsdp.unit_copies`) runs at each unit's first
    step. With `lean`, the steps as the analytic evaluator keeps them (`_LeanAcc`)."""
    acc = (_LeanAcc if lean else _Acc)(category, unit_lead)
    for e in entries:
        if unit_of is not None:
            acc.enter(unit_of[e.index])
        if e.experts is not None:
            _experts_forward(acc, e, tp)
            continue
        if e.tp_overlap:
            _chunked_forward(acc, e, tp)
            continue
        for c in e.tp.before:
            acc.collective(c, _group(e, tp, c))
        core = _ring(acc, e, e.forward.table_share, forward=True) if e.ring is not None else 0.0
        if e.halo is None or not _halo(acc, e, e.forward.seconds, e.forward.table_share, forward=True):
            acc.add(e.name, e.forward.seconds - core, e.forward.table_share)
        for c in e.tp.after_fwd:
            acc.collective(c, _group(e, tp, c))
    acc.flush()
    return acc.steps


def _chunked_forward(acc: _Acc, e: LayerEntry, tp: int) -> None:
    """The forward of a layer whose GEMMs run chunked beside its collectives (`LayerEntry.tp_overlap`):
    the input's all-gather in ring exchange with the first GEMM, the rest, the output's reduce-scatter
    pipelined with the last GEMM."""
    ub = {g.replaces: g for g in e.tp_overlap}
    for c in e.tp.before:
        if c in ub:
            _chunked(acc, e, ub[c], tp)
        else:
            acc.collective(c, _group(e, tp, c))
    core = _ring(acc, e, e.forward.table_share, forward=True)
    acc.add(e.name, e.forward.seconds - core - sum(g.whole for g in e.tp_overlap if g.forward),
            e.forward.table_share)
    for c in e.tp.after_fwd:
        if c in ub:
            _chunked(acc, e, ub[c], tp)
        else:
            acc.collective(c, _group(e, tp, c))


def backward_steps(entries: Sequence[LayerEntry], tp: int, ready_at: dict[int, tuple[int, ...]] | None = None,
                   unit_of: dict[int, int] | None = None, overlap: bool = False,
                   unit_lead: dict[int, float] | None = None, lean: bool = False) -> list[Step]:
    """Backward pass of a chunk, layers in reverse. `ready_at` maps a layer index to the buckets its
    backward completes; the pass is split there (and where the parameter unit changes). With
    `overlap` (asynchronous tensor-parallel backward communication) a collective flagged "dgrad"
    runs beside the ∇x GEMM of the layer's input projection and one flagged "wgrad" beside its ∇w
    GEMM (`LayerEntry.windows`); the rest of the layer's backward runs before them. `unit_lead` as
    in `forward_steps`; `lean` as there."""
    acc = (_LeanAcc if lean else _Acc)(COMPUTE, unit_lead)
    for e in reversed(entries):
        if unit_of is not None:
            acc.enter(unit_of[e.index])
        if e.experts is not None:
            _experts_backward(acc, e, tp, ready_at)
            continue
        ub = {g.replaces: g for g in e.tp_overlap} if e.tp_overlap else _NO_CHUNKS
        beside = {c.overlap: c for c in e.tp.before_bwd + e.tp.after_bwd if c.overlap
                  and not (ub and c in ub)} if overlap else _NO_CHUNKS
        placed = beside.values()
        later: list[ChunkedGemm] = []  # bulk overlaps of the input projection, after the rest
        for c in e.tp.before_bwd:
            if ub and c in ub:
                if ub[c].method == RING:  # the output gradient's all-gather beside the first ∇x GEMM
                    _chunked(acc, e, ub[c], tp)
                else:
                    later.append(ub[c])
            elif not beside or c not in placed:
                acc.collective(c, _group(e, tp, c))
        core = _ring(acc, e, e.backward.table_share, forward=False) if e.ring is not None else 0.0
        replaced = sum(g.whole for g in e.tp_overlap if not g.forward) if ub else 0.0
        if beside:  # the rest of the backward first, then the projection's ∇x and ∇w GEMMs beside collectives
            windows = [(kind, min(w, part.seconds)) for kind, w, part in
                       (("dgrad", e.windows[0], e.backward_data), ("wgrad", e.windows[1], e.backward_weight))
                       if kind in beside]
            acc.add(e.name, e.backward.seconds - core - sum(w for _, w in windows) - replaced, e.backward.table_share)
            for kind, w in windows:
                acc.overlap(e.name, w, e.backward.table_share, beside[kind], _group(e, tp, beside[kind]))
        elif e.halo is None or not _halo(acc, e, e.backward.seconds, e.backward.table_share, forward=False):
            acc.add(e.name, e.backward.seconds - core - replaced, e.backward.table_share)
        if ub:
            for g in later + [ub[c] for c in e.tp.after_bwd if c in ub]:
                _chunked(acc, e, g, tp)
        if ready_at and e.index in ready_at:
            acc.flush(ready_at[e.index])
        for c in e.tp.after_bwd:
            if (not beside or c not in placed) and not (ub and c in ub):
                acc.collective(c, _group(e, tp, c))
    acc.flush()
    return acc.steps


def selective_recompute_steps(entries: Sequence[LayerEntry], lean: bool = False) -> list[Step]:
    """The attention cores of a chunk, recomputed before its backward pass (selective recomputation);
    `lean` as in `forward_steps`."""
    acc = (_LeanAcc if lean else _Acc)(RECOMPUTE)
    for e in entries:
        if e.core.seconds > 0:
            acc.add(e.name, e.core.seconds, e.core.table_share)
    acc.flush()
    return acc.steps


def op_recompute_steps(entries: Sequence[LayerEntry], instance: dict[str, str | None],
                       lean: bool = False) -> list[Step]:
    """What torchtitan's selective_op policy recomputes of a chunk's blocks before their backward
    (`LayerEntry.op_core`, `dlsim.plan.oprecompute`); `lean` as in `forward_steps`."""
    acc = (_LeanAcc if lean else _Acc)(RECOMPUTE)
    for e in entries:
        if instance[e.name] is not None and e.op_core.seconds > 0:
            acc.add(e.name, e.op_core.seconds, e.op_core.table_share)
    acc.flush()
    return acc.steps
