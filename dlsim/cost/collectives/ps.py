"""Parameter server with S shards: p workers push gradients and pull parameters (S002 §6.2;
Dean et al. 2012 DistBelief, Li et al. OSDI 2014; Dryden's single-server cost 2pα + 2pnβ + pnγ, S003).

Workers are ranks 0..p−1 and the shard servers ranks p..p+S−1; shard s owns n/S bytes. The
exchange runs in S rounds; in round i worker w talks to shard (w + i) mod S, so a worker sends (or
receives) one message per round and a shard serves c = ⌈p/S⌉ workers per round, one after the
other on its port (S(s) apart, plus the reduction when pushing):

    push  S·[T(n/S) + r(n/S) + (c−1)·(S(n/S) + r(n/S))]
    pull  S·[T(n/S) + (c−1)·S(n/S)]
    parameter-server allreduce = push + pull

With S = 1 and Hockney T (S = T) this is exactly Dryden's 2pα + 2pnβ + pnγ. The survey's remark that
a PS costs about T_tree (S002 §6.2) holds for the sharded, tree-like variants, not for one server.
"""

from __future__ import annotations

from dlsim.cost.collectives.costs import Costs
from dlsim.cost.collectives.schedule import Schedule, ScheduleBuilder


def _per_round(p, shards: int):
    return (p + shards - 1) // shards


def push_time(n, p, c: Costs, shards: int = 1):
    s, k = n / shards, _per_round(p, shards)
    return shards * (c.step(s, True) + (k - 1) * (c.gap(s) + c.r(s)))


def pull_time(n, p, c: Costs, shards: int = 1):
    s, k = n / shards, _per_round(p, shards)
    return shards * (c.step(s) + (k - 1) * c.gap(s))


def ps_allreduce_time(n, p, c: Costs, shards: int = 1):
    return push_time(n, p, c, shards) + pull_time(n, p, c, shards)


def _add_push(b: ScheduleBuilder, n: float, p: int, shards: int, step: int) -> int:
    for i in range(shards):
        for w in range(p):
            b.send(step + i, w, p + (w + i) % shards, n / shards, reduce=True)
    return step + shards


def _add_pull(b: ScheduleBuilder, n: float, p: int, shards: int, step: int) -> int:
    for i in range(shards):
        for w in range(p):
            b.send(step + i, p + (w + i) % shards, w, n / shards)
    return step + shards


def push_schedule(n: float, p: int, shards: int) -> Schedule:
    b = ScheduleBuilder("push", "sharded", n, p + shards)
    _add_push(b, n, p, shards, 0)
    return b.build(workers=p, shards=shards)


def pull_schedule(n: float, p: int, shards: int) -> Schedule:
    b = ScheduleBuilder("pull", "sharded", n, p + shards)
    _add_pull(b, n, p, shards, 0)
    return b.build(workers=p, shards=shards)


def ps_allreduce_schedule(n: float, p: int, shards: int) -> Schedule:
    b = ScheduleBuilder("allreduce", "parameter-server", n, p + shards)
    _add_pull(b, n, p, shards, _add_push(b, n, p, shards, 0))
    return b.build(workers=p, shards=shards)
