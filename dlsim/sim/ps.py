"""Parameter-server training over many iterations: synchronous (BSP), asynchronous (Downpour /
Hogwild-style) and stale-synchronous (SSP) workers, with contention at the servers.

reference/algorithms.md §6. W workers (the data-parallel replicas, each computing one iteration in
the time the one-replica simulation gives, times its straggler factor and a jitter draw) and S
server shards (shard j holds M/S of the M parameter bytes, on its own node of the inter-node
tier). A worker pulls every `fetch_every` iterations and pushes every `push_every` (Dean et al.,
NIPS 2012, Downpour SGD): one message per shard, each holding the worker's NIC and the shard's
NIC for its point-to-point time (store-and-forward at the ports, so many workers pushing to one
shard queue up). A shard applies pushed gradients one at a time (`update_time` each) and serves a
pull after the updates already queued. Clocks (Ho et al., NIPS 2013): worker i may start iteration
c only if c − min_j c_j ≤ s; BSP is s = 0 with each worker's push applied before its clock ticks,
ASP is s = ∞. The staleness of an applied gradient is the number of updates other workers applied
to the shard between this worker's pull and this update (Dean et al. 2012; Zhang et al., IJCAI
2016); under BSP a round's pushes are one aggregated update (synchronous SGD), so staleness counts
rounds instead: 0, or the iterations since the last pull when `fetch_every` > 1. Throughput is per
worker clock: each worker's samples over its own finishing time, summed (a fast worker does not
wait for a straggler under ASP, so its rate is its own).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from dlsim.plan.comm import CommPricer, Layout
from dlsim.plan.variability import draw, rank_slowdowns
from dlsim.results import Estimate
from dlsim.results_sim import AsyncResult
from dlsim.spec.strategy import Strategy

UNBOUNDED = 1 << 60


@dataclass(frozen=True)
class PSInputs:
    """One worker's iteration compute time, the model bytes, the shard update time, and pricing."""

    model: str
    cluster: str
    strategy: Strategy
    iteration_compute: float
    model_bytes: float
    update_time: Estimate
    pricer: CommPricer
    layout: Layout
    notes: tuple[str, ...] = ()


def simulate_ps(x: PSInputs) -> AsyncResult:
    """Run `strategy.iterations` iterations on every worker (see the module docstring)."""
    s = x.strategy
    W, S, n = s.dp, s.ps_shards, s.iterations
    bound = {"ps": 0, "ssp": s.staleness}.get(s.sync, UNBOUNDED)
    env = simpy.Environment()
    worker_ranks = [x.layout.rank(w, 0, 0) for w in range(W)]
    total = x.layout.dp * x.layout.tp * x.layout.pp
    per_node = x.layout.devices_per_node
    server_ranks = [(total // per_node + 1 + j) * per_node for j in range(S)]
    shard_bytes = x.model_bytes / S
    msg = [[x.pricer.p2p(shard_bytes, worker_ranks[w], server_ranks[j]).seconds for j in range(S)] for w in range(W)]
    w_out = [simpy.Resource(env, 1) for _ in range(W)]
    w_in = [simpy.Resource(env, 1) for _ in range(W)]
    s_out = [simpy.Resource(env, 1) for _ in range(S)]
    s_in = [simpy.Resource(env, 1) for _ in range(S)]
    s_cpu = [simpy.Resource(env, 1) for _ in range(S)]
    slow = rank_slowdowns(s.variability, W)
    jitter = draw(s.variability, np.random.default_rng([s.variability.seed, 3]), (W, n))
    clock = [0] * W
    version = [0] * S
    read = [[0] * S for _ in range(W)]
    pulled_at = [0] * W
    finish = [0.0] * W
    staleness: dict[int, int] = {}
    compute_s, wait_s, comm_s = [0.0] * W, [0.0] * W, [0.0] * W
    state = {"gate": env.event(), "updates": 0}

    def transfer(first: simpy.Resource, second: simpy.Resource, seconds: float):
        with first.request() as a:
            yield a
            with second.request() as b:
                yield b
                yield env.timeout(seconds)

    def push(w: int, j: int, sent: simpy.Event, it: int):
        yield from transfer(w_out[w], s_in[j], msg[w][j])
        sent.succeed()
        with s_cpu[j].request() as req:
            yield req
            stale = it - pulled_at[w] if bound == 0 else version[j] - read[w][j]
            staleness[stale] = staleness.get(stale, 0) + 1
            yield env.timeout(x.update_time.seconds)
            version[j] += 1

    def pull(w: int, j: int):
        with s_cpu[j].request() as req:
            yield req
            read[w][j] = version[j]
        yield from transfer(s_out[j], w_in[w], msg[w][j])

    def worker(w: int):
        for it in range(n):
            start = env.now
            while clock[w] - min(clock) > bound:
                yield state["gate"]
            wait_s[w] += env.now - start
            if it % s.fetch_every == 0:
                pulled_at[w] = it
                start = env.now
                yield simpy.AllOf(env, [env.process(pull(w, j)) for j in range(S)])
                comm_s[w] += env.now - start
            seconds = x.iteration_compute * slow.get(w, 1.0) * float(jitter[w, it])
            yield env.timeout(seconds)
            compute_s[w] += seconds
            if (it + 1) % s.push_every == 0 or it == n - 1:
                start = env.now
                sent = [env.event() for _ in range(S)]
                pushes = [env.process(push(w, j, sent[j], it)) for j in range(S)]
                # BSP: the clock ticks once the update is applied; otherwise once the NIC has sent it
                yield simpy.AllOf(env, pushes if bound == 0 else sent)
                comm_s[w] += env.now - start
                state["updates"] += 1
            clock[w] += 1
            gate, state["gate"] = state["gate"], env.event()
            gate.succeed()
        finish[w] = env.now

    procs = [env.process(worker(w)) for w in range(W)]
    env.run(simpy.AllOf(env, procs))
    finished = env.now
    env.run()  # let updates still in flight land (their staleness counts)
    return AsyncResult(x.model, x.cluster, s.to_dict(), s.sync, W, s.microbatch_size * s.num_microbatches * s.push_every,
                       finished, state["updates"], tuple([n] * W), tuple(compute_s), tuple(wait_s), tuple(comm_s),
                       staleness, x.iteration_compute, x.notes, tuple(finish))
