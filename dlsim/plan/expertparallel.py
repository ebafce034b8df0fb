"""Expert parallelism: mixture-of-experts layers with their experts spread over `ep` ranks.

GShard (Lepikhin et al. 2021, §2.2 and §3.2) and Megatron-Core's MoE (its all-to-all token
dispatcher): the experts of every `moe` layer are split over an expert-parallel group of `ep`
data-parallel ranks (E/ep experts each), so each rank holds 1/ep of the expert weights. Each
micro-batch's forward pass runs the router on the rank's own tokens, then an all-to-all
*dispatch* sends every routed token copy to the rank holding its expert, the experts run on what
they received, and an all-to-all *combine* returns the outputs; the backward pass runs the same
two all-to-alls on the gradients in reverse order. Both are priced by `dlsim.cost.collectives`
(all-to-all over the ep group's ranks on the topology: node-aware across nodes), with the send
buffer of the busiest rank, ⌈u·R·k⌉·D elements (`dlsim.cost.moe_routing`: the step waits for the
rank with the most tokens, which receives and returns u = min(imbalance, capacity) times the mean
volume). Under tensor parallelism the tp ranks hold the same tokens and each dispatches 1/tp of
them (Megatron-Core's all-to-all dispatcher with its tp split), so the volume per rank is /tp.

Overlap (`Strategy.ep_overlap`, Megatron-Core's ``--moe-shared-expert-overlap``; DeepSeek-V3 §3.2.1):
the shared experts do not depend on routing, so they run beside the dispatch forward and beside
the combine's gradient backward; otherwise every all-to-all blocks the compute stream.

Groups (ranks laid out as `dlsim.plan.comm.Layout`): the ep group of data-parallel rank d is the
ep consecutive data-parallel ranks of its block (ep divides dp); the expert weights' gradients are
all-reduced over the expert-data-parallel group, the dp/ep ranks holding the same experts
(same d mod ep), not over the whole data-parallel group (Megatron-Core's expert data parallelism).
ZeRO 1 and 2 shard each parameter's optimizer state (and gradients) over the ranks holding it: the
dense ones over dp, the routed experts' over the expert-data-parallel group (reduce-scatter and
all-gather there). Not modelled with expert parallelism (refused by `dlsim.spec.strategy`): ZeRO-3,
hybrid sharding, gradient compression, context parallelism, layer groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from dlsim.cost.layers import MOE_ROUTED_GEMMS, LayerCost, PassCost
from dlsim.cost.moe_routing import routing
from dlsim.cost.pricing import KernelTimes, price_pass
from dlsim.errors import SpecError
from dlsim.plan.dataparallel import Bucket, make_buckets
from dlsim.plan.tensorparallel import Collective
from dlsim.plan.zero import model_state_bytes, optimizer_share
from dlsim.spec.cluster import Device
from dlsim.spec.model import Layer, Model
from dlsim.units import DTYPE_BYTES

EP, EDP = "ep", "edp"
"""Group kinds: the expert-parallel group (all-to-alls) and the expert-data-parallel group (expert
gradients)."""


@dataclass(frozen=True)
class ExpertPlan:
    """How one `moe` layer runs on the busiest expert rank of its group (module doc).

    `router_forward` / `router_backward`: seconds of the router (GEMM and softmax/top-k) before the
    dispatch (forward) and after the dispatch's gradient (backward); `shared_forward` /
    `shared_backward`: seconds of the shared experts' GEMMs; `params`: the layer's parameters on
    this device (router, E/ep routed experts, shared experts; /tp under tensor parallelism), of
    which `expert_params` belong to routed experts (reduced over the expert-data-parallel group);
    `load` and `dropped`: `dlsim.cost.moe_routing`; `overlap`: the shared experts run beside the
    dispatch (forward) and the combine's gradient (backward)."""

    ep: int
    dispatch: Collective
    combine: Collective
    router_forward: float
    router_backward: float
    shared_forward: float
    shared_backward: float
    params: int
    expert_params: int
    load: float
    dropped: float
    overlap: bool = False


def expert_plan(layer: Layer, cost: LayerCost, batch: int, dtype: str, ep: int, tp: int, device: Device,
                tables: KernelTimes | None, overlap: bool = False) -> ExpertPlan | None:
    """The `ExpertPlan` of a `moe` layer under `ep` (None for other layers or ep = 1). `cost` is the
    layer's per-device cost (after tensor-parallel sharding, degree `tp`)."""
    if layer.type != "moe" or ep == 1:
        return None
    a, (steps, d) = layer.attrs, layer.in_shapes[0]
    r = routing(a, batch * steps, ep)
    nbytes = r.pairs * d * DTYPE_BYTES[dtype] / tp
    dispatch = Collective("alltoall", nbytes, f"EP dispatch of {layer.name}", group=EP)
    combine = Collective("alltoall", nbytes, f"EP combine of {layer.name}", group=EP)

    def seconds(p: PassCost, gemms: slice, parts: slice, name: str) -> float:
        sub = PassCost(gemms=p.gemms[gemms], kind="gemm", parts=p.parts[parts])
        sub = PassCost(flops=sub.matmul_flops + sum(x[2].flops for x in sub.parts), gemms=sub.gemms, kind="gemm",
                       kernels=len(sub.gemms) + len(sub.parts), parts=sub.parts)
        if not sub.gemms:
            return 0.0
        return price_pass(sub, "moe", name, device, dtype, tables).seconds

    shared = slice(MOE_ROUTED_GEMMS, None)
    router_f = seconds(cost.forward, slice(0, 1), slice(0, 1), "forward")
    router_b = seconds(cost.backward_data, slice(0, 1), slice(-1, None), "backward_data") + \
        seconds(cost.backward_weight, slice(0, 1), slice(0, 0), "backward_weight")
    shared_f = seconds(cost.forward, shared, slice(0, 0), "forward")
    shared_b = seconds(cost.backward_data, shared, slice(0, 0), "backward_data") + \
        seconds(cost.backward_weight, shared, slice(0, 0), "backward_weight")
    weights = _expert_weights(a, d)
    held = layer.params - (r.experts - r.local_experts) * weights
    return ExpertPlan(ep, dispatch, combine, router_f, router_b, shared_f, shared_b, held // tp,
                      r.local_experts * weights // tp, r.load, r.dropped, overlap)


def _expert_weights(a: Any, d: int) -> int:
    gated = a["activation"] in ("swiglu", "geglu")
    f = a["ffn_hidden"]
    return (3 if gated else 2) * d * f + ((((2 if gated else 1) * f) + d) if a["bias"] else 0)


def ep_group(layout: Any, ep: int, dp_rank: int, tp_rank: int, stage: int) -> list[int]:
    """The expert-parallel group of a position: the ep consecutive data-parallel ranks of its block."""
    first = dp_rank - dp_rank % ep
    return [layout.rank(first + i, tp_rank, stage) for i in range(ep)]


def edp_group(layout: Any, ep: int, dp_rank: int, tp_rank: int, stage: int) -> list[int]:
    """The expert-data-parallel group: the data-parallel ranks holding the same experts (the same
    index modulo ep), over which expert gradients are reduced."""
    return [layout.rank(d, tp_rank, stage) for d in range(dp_rank % ep, layout.dp, ep)]


def check_expert_parallel(model: Model, ep: int) -> None:
    """ep > 1 needs mixture-of-experts layers whose expert counts it divides (one line otherwise)."""
    if ep == 1:
        return
    moe = [layer for layer in model.layers if layer.type == "moe"]
    if not moe:
        raise SpecError(f"ep {ep} needs a model with mixture-of-experts layers; {model.name} has none", field="ep")
    for layer in moe:
        if layer.attrs["experts"] % ep:
            raise SpecError(f"ep {ep} does not divide the {layer.attrs['experts']} experts of layer {layer.name!r}",
                            field="ep")


def expert_buckets(entries: Sequence[Any], buckets: list[Bucket], s: Any, element_bytes: int,
                   param_scale: float = 1.0) -> list[Bucket]:
    """Gradient buckets of a chunk with its routed experts' gradients apart: the layers' other
    parameters in data-parallel buckets, the experts' in buckets reduced over the expert-data-parallel
    group (none when that group is one rank), in reduction (backward) order. `buckets` are the
    chunk's buckets without expert parallelism, returned unchanged when no entry has experts."""
    if s.ep == 1 or not any(e.experts is not None for e in entries):
        return buckets
    dense = [(e.index, (e.params - (e.experts.expert_params if e.experts else 0)) * element_bytes)
             for e in entries if e.params > 0 and e.tp_degree == s.tp]
    experts = [(e.index, e.experts.expert_params * element_bytes) for e in entries if e.experts is not None]
    out = make_buckets(dense, s.bucket_size, s.first_bucket_size, param_scale=param_scale) if s.dp > 1 else []
    if s.dp // s.ep > 1:
        out += make_buckets(experts, s.bucket_size, s.first_bucket_size, EDP, param_scale)
    # backward order: the bucket completed first (its earliest layer the latest) reduced first
    return sorted(out, key=lambda b: -b.ready_after)


def expert_notes(entries: Sequence[Any]) -> list[str]:
    """One line per distinct routing of the table's expert-parallel layers, for the result's notes."""
    seen = {}
    for e in entries:
        if e.experts is not None:
            seen.setdefault((e.experts.ep, e.experts.load, e.experts.dropped), []).append(e.name)
    return [f"mixture of experts ({len(names)} layer{'s' if len(names) > 1 else ''}): the busiest of ep {ep} ranks runs {load:g}x the mean routed "
            f"tokens" + (f" and drops {dropped:.1%} of those routed to it (capacity)" if dropped > 0 else "")
            for (ep, load, dropped), names in seen.items()]


def expert_params_of(entries: Sequence[Any]) -> int:
    """Routed experts' parameters among `entries` (per device)."""
    return sum(e.experts.expert_params for e in entries if e.experts is not None)


def expert_states(states: dict[str, float], expert: float, dtype: str, optimizer: str, zero: int, shard: int,
                  ep: int, grad_bytes: float | None = None) -> dict[str, float]:
    """`states` (`model_state_bytes` of parameters ZeRO-sharded over `shard` ranks) with the states of
    `expert` of those parameters sharded over the expert-data-parallel shard/ep ranks instead: the
    distributed optimizer shards each parameter over the ranks that hold it (Megatron-Core's expert
    data parallelism)."""
    if not expert or not zero or ep == 1:
        return states
    over_dp = model_state_bytes(expert, dtype, optimizer, zero, shard, grad_bytes)
    over_edp = model_state_bytes(expert, dtype, optimizer, zero, max(shard // ep, 1), grad_bytes)
    return {k: states[k] - over_dp[k] + over_edp[k] for k in states}


def updated_params(dense: float, expert: float, zero: int, shard: int, ep: int) -> float:
    """Parameters a device's optimizer step updates: 1/shard of the dense ones and 1/(shard/ep) of its
    routed experts' under ZeRO, all of them without."""
    return dense * optimizer_share(zero, shard) + expert * optimizer_share(zero, max(shard // ep, 1))
