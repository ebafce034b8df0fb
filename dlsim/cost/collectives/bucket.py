"""Collectives on token-bucket ports: the bucket carried through the steps of a schedule.

On a shaped port (`dlsim.cost.p2p`, `LinkTier.burst` b > 0) a message's time depends on the
tokens B its sender's port holds when it starts: x bytes (the message's payload, s − 1 in LogGP)
take the shaped time D(x, B) = max(x/R, (x − B)·G) to leave, and the port then holds
min(b, B + D/G − x) tokens, refilling at 1/G up to b. A collective call starts with every port
full (the ports were idle before the call). Two uses:

* `PortBuckets`: the per-rank token state the replay executors (`replay.py`) carry from message
  to message. A message of x bytes started at t from a port last drained at t₀ with B₀ tokens
  finds B = min(b, B₀ + (t − t₀)/G); c shared messages (one sender, one step) leave together:
  message i of sorted payloads x_1 ≤ … ≤ x_c arrives at

      t + L + 2o + (c − 1)·g + D(X_i, B),   X_i = Σ_{j<i} x_j + (c − i + 1)·x_i

  (the processor sharing of `replay.py` with the byte time D in place of X·G; Hockney: α for
  L + 2o and for g). The port is busy until t + (c − 1)·g + max(o, g + D(Σx, B)) for LogGP,
  t + c·α + D(Σx, B) for Hockney, the sum of the S(s) of `replay.py` when b = 0.

* closed forms for lock-step algorithms in which every port has the same history (ring,
  recursive doubling, Rabenseifner) and for the Open MPI binomial allreduce, evaluated as a
  recursion over the steps (the per-step sum of the unshaped closed forms no longer applies: a
  port that sent in step k − 1 starts step k with fewer tokens). With step k lasting
  d_k = L + 2o + D(x_k, B_k) + γ·s_k (γ only where the step reduces), the tracked port holds

      B_{k+1} = min(b, B_k + d_k/G − x_k)      if it sent in step k
      B_{k+1} = min(b, B_k + d_k/G)            if the step's senders were other, full ports
                                               (the fold step of recursive doubling, Rabenseifner)

  and the call takes Σ_k d_k. These equal `replay.replay_steps` on the schedules (tests).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from dlsim.cost.collectives.bits import bmtree_children, ceil_log2, floor_log2
from dlsim.cost.collectives.costs import Costs
from dlsim.cost.p2p import PointToPoint


class PortBuckets:
    """Token state of every (rank, tier) send port during one replay; ports start full."""

    def __init__(self, costs: Costs):
        self.costs = costs
        self.state: dict[tuple[int, bool], tuple[float, float]] = {}

    def model(self, intra: bool) -> PointToPoint:
        return self.costs.intra if intra else self.costs.main

    def send(self, rank: int, intra: bool, start: float, payloads: list[float]) -> tuple[list[float], float]:
        """Arrival offsets (after `start`) of the messages with `payloads` that `rank` starts at
        `start` (one message, or one sender's shared group; module doc), and its port's busy time."""
        m = self.model(intra)
        c = len(payloads)
        last, since = self.state.get((rank, intra), (m.burst, -np.inf))
        tokens = float(m.refill(last, start - since)) if np.isfinite(since) else m.burst
        order = sorted(range(c), key=lambda i: payloads[i])
        offsets = [0.0] * c
        before = 0.0
        for rank_in, i in enumerate(order):
            x = payloads[i]
            cumulative = before + (c - rank_in) * x
            offsets[i] = m.fixed_time() + (c - 1) * m.fixed_gap() + float(m.shaped_time(cumulative, tokens))
            before += x
        total = before
        drained = float(m.shaped_time(total, tokens))
        self.state[(rank, intra)] = (float(m.tokens_after(total, tokens)), start + drained)
        if m.model == "loggp":
            busy = (c - 1) * m.fixed_gap() + max(m.overhead, m.gap + drained)
        else:
            busy = c * m.fixed_gap() + drained
        return offsets, busy


def shaped(costs: Costs, intra: bool = False) -> bool:
    """Whether the tier a collective uses is token-bucket shaped."""
    return (costs.intra if intra else costs.main).shaped


def lockstep_time(costs: Costs, steps, intra: bool = False):
    """Σ_k d_k over `steps` (module doc), vectorised.

    `steps`: (active, nbytes, reduce, sends) per step, each broadcastable over the points: `active`
    whether the point has this step, `nbytes` the message size, `reduce` whether the receiver
    combines it, `sends` whether the tracked port sends (else the step's senders are full ports).
    """
    m = costs.intra if intra else costs.main
    tokens = None
    total = 0.0
    for active, nbytes, reduce, sends in steps:
        s = np.asarray(nbytes, dtype=float)
        x = m.payload(s)
        start_tokens = m.burst if tokens is None else tokens
        own = m.shaped_time(x, start_tokens)
        fresh = m.shaped_time(x, m.burst)
        d = m.fixed_time() + np.where(sends, own, fresh) + np.where(reduce, costs.r(s), 0.0)
        after = np.where(sends, np.minimum(m.burst, start_tokens + d / m.gap_per_byte - x),
                         m.refill(start_tokens, d))
        tokens = np.where(active, after, start_tokens)
        total = total + np.where(active, d, 0.0)
    return total


def ring_steps(n, p, reduce_steps: bool, gather_steps: bool):
    """The 2(p − 1) (or p − 1) steps of the ring allreduce (reduce-scatter, allgather), chunks n/p."""
    p = np.asarray(p)
    k_max = int(np.max(p)) - 1
    out = []
    if reduce_steps:
        out += [(k < p - 1, n / p, True, True) for k in range(k_max)]
    if gather_steps:
        out += [(k < p - 1, n / p, False, True) for k in range(k_max)]
    return out


def _fold(p):
    q = 2 ** floor_log2(p)
    return floor_log2(q), (np.asarray(p) != q)


def recursive_doubling_steps(n, p):
    K, f = _fold(p)
    steps = [(f, n, True, False)]
    steps += [(k < K, n, True, True) for k in range(int(np.max(K)))]
    return steps + [(f, n, False, True)]


def rabenseifner_steps(n, p):
    """Fold in, recursive halving (n/2, n/4, …, n/2^K), recursive doubling (n/2^K, …, n/2), fold out."""
    K, f = _fold(p)
    k_max = int(np.max(K))
    steps = [(f, n, True, False)]
    steps += [(k < K, n / 2.0 ** (k + 1), True, True) for k in range(k_max)]
    # doubling step j of K sends n·2^j / 2^K: index the steps from the end so every K ends together
    steps += [(j >= k_max - K, n * 2.0 ** (j - (k_max - K)) / 2.0 ** K, False, True) for j in range(k_max)]
    return steps + [(f, n, False, True)]


def openmpi_allreduce_time(n, p: int, costs: Costs):
    """Open MPI allreduce algorithm 2 on shaped ports (`trees.py`): the binomial reduce (every
    non-root rank sends once, from a full port: K·[T(n) + γn]) then the bmtree broadcast, step m
    lasting the slowest node v of depth m (popcount m): L + 2o + (c_v − 1)·g + D(c_v·x, B_v),
    where B_v is v's port refilled since its reduce send at step tz(v) (its lowest set bit)."""
    m = costs.main
    x = m.payload(np.asarray(n, dtype=float))
    K = ceil_log2(p)
    d_reduce = m.fixed_time() + m.shaped_time(x, m.burst) + costs.r(n)
    tokens_after_send = m.tokens_after(x, m.burst)
    drained = m.shaped_time(x, m.burst)
    now = K * d_reduce
    by_depth: dict[int, list[int]] = defaultdict(list)
    for v in range(p):
        by_depth[bin(v).count("1")].append(v)
    for depth in sorted(by_depth):
        step = None
        for v in by_depth[depth]:
            c = len(bmtree_children(v, p))
            if not c:
                continue
            if v == 0:
                tokens = m.burst
            else:
                sent = (v & -v).bit_length() - 1
                tokens = m.refill(tokens_after_send, now - (sent * d_reduce + drained))
            t = m.fixed_time() + (c - 1) * m.fixed_gap() + m.shaped_time(c * x, tokens)
            step = t if step is None else np.maximum(step, t)
        if step is not None:
            now = now + step
    return now
