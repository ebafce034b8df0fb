"""Passes walked beside the communication stream, as the simulator's per-device streams run
them (`dlsim.plan.iteration`, `dlsim.plan.syncplan`): data-parallel buckets queued as the backward
pass makes them ready, ZeRO-3 parameter gathers ahead of their units, compute slowed by the device's
overlap slowdown while a collective is in flight.
"""

from __future__ import annotations


from dlsim.cost.overlap import overlap_cost
from dlsim.plan.expertparallel import (EP)
from dlsim.plan.pipeline import FORWARD
from dlsim.plan.templates import Step
from dlsim.plan.evaluate.pipeline import pipeline_walk


_COMPUTE, _COLLECTIVE, _OVERLAP = 0, 1, 2  # step kinds of a priced program (`StreamWalk._program`)


class StreamWalk:
    """Step lists run beside a device's communication stream (a part of `Timing`)."""

    def _walk(self, steps: list[Step], stage: int, launches: dict[int, list[float]], gathers: list[float] | None,
              queue_start: float = 0.0) -> tuple[float, float, float]:
        """Run a step list beside the communication stream from time 0 (`walk_steps`); returns (pass
        seconds, time the queue empties after the pass start, seconds compute was slowed)."""
        now, busy, slowed, _ = self.walk_steps(steps, stage, launches, gathers, 0.0, queue_start, 0.0)
        return now, max(busy, now), slowed

    def _program(self, steps: list[Step], stage: int) -> list[tuple[int, float, float, bool, int]]:
        """`steps` priced once for `walk_steps` (which runs them many times): per step (kind, kernel
        seconds, collective seconds — for an overlap what `overlap_cost` adds beside the kernels —,
        whether a collective queues behind the communication stream, parameter unit)."""
        s = self.s
        key = ("program", id(steps), stage, s.dp, s.tp, s.pp, s.cp, s.ep, s.collective)
        got = self._programs_of.get(key)
        if got is not None:
            return got
        tp_ranks = self.tpg(stage)
        same_tier = self._same_tier.get(stage)
        if same_tier is None:
            same_tier = self._same_tier[stage] = self.s.dp > 1 and self.s.tp > 1 and \
                self.pricer.tier(tp_ranks) == self.pricer.tier(self.dpg(stage))
        out = []
        for st in steps:
            if st.kind == "compute":
                out.append((_COMPUTE, st.duration, 0.0, False, st.unit))
                continue
            c = self.price(st.collective.op, st.collective.nbytes, self._ranks(st, tp_ranks, stage))
            if st.kind == "collective":
                queued = same_tier if st.group != EP else self._ep_queued(stage)
                out.append((_COLLECTIVE, 0.0, c, queued, st.unit))
            else:
                extra, exposed = overlap_cost(st.duration, c, self.sigma)
                out.append((_OVERLAP, st.duration, extra + exposed, False, st.unit))
        self._programs_of[key] = out
        self.ev._keep.append(steps)  # the key holds its id: keep it alive as long as the program
        return out

    def walk_steps(self, steps: list[Step], stage: int, launches: dict[int, list[float]],
                   gathers: list[float] | None, now: float, busy: float, first_dep: float,
                   first_gather: float | None = None) -> tuple[float, float, float, float]:
        """Run a step list from time `now` beside the communication stream, busy until `busy` (the
        simulator's per-device streams, `dlsim.plan.iteration` and `dlsim.plan.syncplan`): `launches`
        maps a step position to the collective durations it enqueues when it ends; `gathers` (ZeRO-3)
        the all-gather of each parameter unit, which the unit's first step waits for. A unit's gather is
        enqueued behind what the stream holds once the previous unit's first step has ended (the first
        unit's once `first_dep`, the end of the previous pass's first step, has passed): at most two
        units gathered at a time; `first_gather`, when given, is when the first unit's gather ends
        (issued before the pass started). Compute runs slowed by σ while the stream is busy; a tensor-parallel
        collective on the data-parallel link tier waits for the queue that holds its ports. Returns
        (end, stream busy until, seconds compute was slowed, end of the first step)."""
        sigma = self.sigma
        program = self._program(steps, stage)
        slowed = 0.0
        unit = None
        dep = first_dep  # what the next unit's gather waits for
        unit_first = False
        first_end = -1.0
        ahead = -1  # a unit whose gather is already queued
        nxt = {}
        if gathers is not None and not launches:  # nothing queued between a unit's gather and the next one's:
            order = [st.unit for st in steps if st.unit >= 0]  # it is queued once the unit's first step ends
            nxt = {a: b for a, b in zip(order, order[1:]) if a != b}
        for pos, (kind, d, c, queued, st_unit) in enumerate(program):
            if gathers is not None and st_unit >= 0 and st_unit != unit:
                if unit is None and first_gather is not None:
                    busy = max(busy, first_gather)
                elif st_unit != ahead:
                    busy = max(busy, dep) + gathers[st_unit]
                unit = st_unit
                now = max(now, busy)
                unit_first = True
            if kind == _COMPUTE:
                if busy > now and sigma > 0:
                    window = busy - now
                    if d * (1 + sigma) <= window:
                        slowed += d * sigma
                        now += d * (1 + sigma)
                    else:
                        done = window / (1 + sigma)
                        slowed += window - done
                        now = busy + (d - done)
                else:
                    now += d
            elif kind == _COLLECTIVE:
                if queued and busy > now:  # waits for the bucket holding the ports, delays the rest
                    busy += c
                    now = busy
                else:
                    now += c
            else:
                now += d + c  # overlap: its kernels and what the collective beside them adds (`_program`)
            if unit_first:
                dep, unit_first = now, False
                if unit in nxt:
                    ahead = nxt[unit]
                    busy = max(busy, dep) + gathers[ahead]  # type: ignore[index]
            if first_end < 0:
                first_end = now
            if launches:
                for dur in launches.get(pos, ()):
                    busy = max(busy, now) + dur
        return now, busy, slowed, first_end if first_end >= 0 else now

    def _programs(self, parts: list[tuple], c: list[float]) -> tuple[list[list[float]], list[float], list[float]]:
        """ZeRO-2/3: every stage's op order (`pipeline_walk`), each pass walked (`walk_steps`) beside the
        stage's communication stream, which carries over from pass to pass as the simulator's does (a
        backward pass's reductions delay the next pass's gathers, slow its kernels, and the last ones
        end the iteration). Returns (ends[r][local chunk] of the last backward passes, when each
        stage's stream empties, each stage's seconds inside its passes)."""
        s = self.s
        p = s.pp
        state = [(0.0, 0.0) for _ in range(p)]  # per stage: stream busy until, end of the last pass's first step
        inside = [0.0] * p
        memo: dict[tuple, tuple[float, float, float]] = {}

        first_unit: dict[tuple, int] = {}  # (chunk, kind) -> the pass's first parameter unit (-1: none)

        def run_op(r: int, op, k: int, t: float) -> float:
            busy, dep = state[r]
            fwd, rec, bwd, launches, gathers = parts[k]
            # passes are time-invariant: keyed by relative times, a stream idle before the start and a
            # first gather (issued once the previous pass's first step ended) done before it are alike
            gather = None
            if gathers:
                unit = first_unit.get((k, op.kind))
                if unit is None:
                    steps = fwd if op.kind == FORWARD else bwd
                    unit = first_unit[(k, op.kind)] = next((st.unit for st in steps if st.unit >= 0), -1)
                if unit >= 0:
                    gather = max(0.0, max(busy, dep) - t + gathers[unit])
            key = (k, op.kind, max(0.0, busy - t), gather)
            got = memo.get(key)
            if got is None:
                q = key[2]
                if op.kind == FORWARD:
                    end, q, _, first = self.walk_steps(fwd, r, {}, gathers, 0.0, q, 0.0, gather)
                else:
                    now, first = 0.0, -1.0
                    if rec:
                        now, q, _, first = self.walk_steps(rec, r, {}, None, now, q, 0.0)
                    end, q, _, first_b = self.walk_steps(bwd, r, launches, gathers, now, q, 0.0, gather)
                    first = first if rec else first_b
                got = memo[key] = (end, q, first)
            end, q, first = got
            state[r] = (t + q, t + first)
            inside[r] += end
            return t + end

        last = pipeline_walk(s.schedule, p, s.num_microbatches, s.virtual_stages, (), (), c, run_op)
        return last, [state[r][0] for r in range(p)], inside
