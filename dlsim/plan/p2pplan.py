"""Pipeline transfers of the iteration graph: activations forward and gradients backward between
consecutive chunks, emitted after every device's program (`dlsim.plan.iteration`).

Each (sender, receiver) device pair has a channel; its sends run in the sender's program order.
Without `Strategy.p2p_overlap` every exchange blocks the sender too: its next kernel waits for the
send to finish (Megatron-LM's p2p_communication: batched isend/irecv, wait, device synchronise).
With scatter-gather (`dlsim.plan.pipeline.scatter_gather`) a replicated boundary is sent as 1/tp
slices and all-gathered over the receiver's tensor-parallel group before its kernels use it.
"""

from __future__ import annotations

from typing import Any

from dlsim.plan.pipeline import BACKWARD, FORWARD, scatter_gather
from dlsim.plan.taskgraph import COMM


def emit_transfers(b: Any) -> None:
    """Every pipeline transfer of the iteration built by `b` (a `dlsim.plan.iteration._Builder` whose
    device programs are emitted: its first and last task of every forward and backward pass)."""
    s = b.s
    channels: dict[tuple, int] = {}
    routes: dict[tuple, tuple] = {}  # what a send between two positions of so many bytes always is
    after: dict[int, int] = {}  # a compute task -> the next task of its stream (blocking sends)
    if not s.p2p_overlap:
        for stream in b.cstream:
            order = b.g.orders[stream]
            after.update(zip(order, order[1:]))
    for stage in range(b.p):
        for d in b.dps:
            for t in b.tps:
                for op in b.ops[stage]:
                    k = op.chunk * b.p + stage
                    i = op.microbatch
                    if op.kind == FORWARD and k < b.K - 1:
                        src, dst = b.fwd_last[(d, t, k, i)], b.fwd_first[(d, t, k + 1, i)]
                        _send(b, channels, routes, after, (d, t, stage), (d, t, (k + 1) % b.p), b.boundary[k],
                              src, dst, ("SF", k, i))
                    elif op.kind == BACKWARD and k > 0:
                        src, dst = b.bwd_last[(d, t, k, i)], b.bwd_first[(d, t, k - 1, i)]
                        _send(b, channels, routes, after, (d, t, stage), (d, t, (k - 1) % b.p), b.boundary[k - 1],
                              src, dst, ("SB", k, i))


def _route(b: Any, channels: dict, a: tuple, dest: tuple, nbytes: float) -> tuple:
    """(sender device, receiver device, ranks, channel stream, whether re-gathered, bytes sent, bytes
    re-gathered, priced estimate, tier, ports, flow, source) of a send from position `a` to `dest`; its
    channel stream and ports are made when first needed, in the order the sends first need them."""
    lay = b.x.layout
    da, db = b.dev[a], b.dev[dest]
    ra, rb = lay.rank(*a), lay.rank(*dest)
    ch = channels.get((da, db))
    if ch is None:
        ch = channels[(da, db)] = b.g.add_stream(f"rank{ra}->rank{rb} p2p", da, "link")
    gather = scatter_gather(b.s) and nbytes > 0
    full, nbytes = nbytes, nbytes / b.s.tp if gather else nbytes
    priced = b.p2p_cache.get((nbytes, ra, rb))
    if priced is None:
        priced = b.p2p_cache[(nbytes, ra, rb)] = (b.x.pricer.p2p(nbytes, ra, rb), b.x.pricer.tier([ra, rb]))
    est, tier = priced
    flow = b._flow(ra, rb, tier, b.x.pricer.wire(nbytes, tier)) if b._flows() and nbytes > 0 else ((), 0.0, 0.0)
    ports = (b.port(da, tier, "out"), b.port(db, tier, "in"))
    return da, db, ra, rb, ch, gather, nbytes, full, est, tier, ports, flow, est.source.value


def _send(b: Any, channels: dict, routes: dict, after: dict[int, int], a: tuple, dest: tuple, nbytes: float,
          src_task: int, dst_task: int, label: tuple) -> None:
    route = routes.get((a, dest, nbytes))
    if route is None:
        route = routes[(a, dest, nbytes)] = _route(b, channels, a, dest, nbytes)
    da, db, ra, rb, ch, gather, nbytes, full, est, tier, ports, flow, source = route
    tid = b.g.add(f"send {label[0][1]} chunk{label[1]} mb{label[2]}", da, ch, est.seconds, COMM, [src_task],
                  source=est.source, ports=ports, label=label, cross_stage=True, flow=flow,
                  info={"op": "send", "bytes": nbytes, "from_rank": ra, "to_rank": rb, "tier": tier,
                        "source": source, "to_task": dst_task})
    if src_task in after:  # a blocking exchange: the sender goes on once its send is done
        b.g.tasks[after[src_task]].deps.append(tid)
    if gather:  # the slices re-gathered over the receiver's tp group before its kernels use them
        stream = channels.get((da, db, "gather"))  # per channel, in the sender's order like the sends
        if stream is None:
            stream = channels[(da, db, "gather")] = b.g.add_stream(f"rank{ra}->rank{rb} gathers", db, "comm")
        tid = b.collective(f"allgather {label[0][1]} chunk{label[1]} mb{label[2]}", "allgather", full, "tp", dest,
                           ("sg",) + label, stream, [tid], label)
    b.g.tasks[dst_task].deps.append(tid)
