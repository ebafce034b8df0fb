"""Passes walked beside the communication stream, as the simulator's per-device streams run
them (`dlsim.plan.iteration`, `dlsim.plan.syncplan`): data-parallel buckets queued as the backward
pass makes them ready, ZeRO-3 parameter gathers ahead of their units, compute slowed by the device's
overlap slowdown while a collective is in flight.
"""

from __future__ import annotations

from collections.abc import Sequence

from dlsim.cost.overlap import overlap_cost
from dlsim.plan.evaluate.periodic import TOLERANCE, Walked, periodic_walk
from dlsim.plan.evaluate.affine import (COLLECTIVE as _COLLECTIVE, COMPUTE as _COMPUTE, OVERLAP as _OVERLAP,
                                        OVERLAP_QUEUED as _OVERLAP_QUEUED, SNAP, Pieces, on_piece, walk_affine)
from dlsim.plan.evaluate.wavefront import chunk_of, op_steps
from dlsim.plan.evaluate.records import replicas
from dlsim.plan.expertparallel import EP
from dlsim.plan.spatial import SPATIAL
from dlsim.plan.evaluate.leansteps import (DURATION, GROUP, KIND, MESSAGES, NBYTES, OP, UNIT, LeanStep,
                                           sigma as step_sigma)
from dlsim.plan.zero import GATHER_PREFETCH


_NONE: dict = {}  # no unit changes, no launches (read, never written)


class StreamWalk:
    """Step lists run beside a device's communication stream (a part of `Timing`)."""

    def _walk(self, steps: list[LeanStep], stage: int, launches: dict[int, Sequence[float]], gathers: list[float] | None,
              queue_start: float = 0.0) -> tuple[float, float, float]:
        """Run a step list beside the communication stream from time 0 (`walk_steps`); returns (pass
        seconds, time the queue empties after the pass start, seconds compute was slowed)."""
        now, busy, slowed, _ = self.walk_steps(steps, stage, launches, gathers, 0.0, queue_start, 0.0)
        return now, max(busy, now), slowed

    def _walk_kept(self, steps: list[LeanStep], stage: int, launches: dict[int, Sequence[float]],
                   queue_start: float) -> tuple[float, float, float]:
        """`_walk` without gathers, kept by what it reads (the priced program, the launches, the queue's
        start): the stages of a deep pipeline end alike."""
        key = ("walk kept", id(steps), id(launches), queue_start) + self._stage_key(stage)
        got = self._programs_of.get(key)
        if got is None:
            got = self._programs_of[key] = (self._walk(steps, stage, launches, None, queue_start), steps, launches)
        return got[0]  # type: ignore[index]

    def _program(self, steps: list[LeanStep], stage: int) -> tuple[tuple[int, float, float, bool, int], ...]:
        """`steps` priced once for `walk_steps` (which runs them many times): per step (kind, kernel
        seconds, collective seconds — for an overlap what `overlap_cost` adds beside the kernels —,
        whether a collective queues behind the communication stream, parameter unit)."""
        key = ("program", id(steps)) + self._stage_key(stage)
        got = self._programs_of.get(key)
        if got is not None:
            return got
        tp_ranks = self.tpg(stage)
        same_tier = self._same_tier.get(stage)
        if same_tier is None:
            same_tier = self._same_tier[stage] = self.s.dp > 1 and self.s.tp > 1 and \
                self.pricer.tier(tp_ranks) == self.pricer.tier(self.dpg(stage))
        out = []
        priced: dict[tuple, float] = {}  # a pass's repeated collectives (one per layer) priced once
        for st in steps:
            kind, group = st[KIND], st[GROUP]
            if kind == "compute":
                out.append((_COMPUTE, st[DURATION], 0.0, False, st[UNIT]))
                continue
            c = self._step_price(st, tp_ranks, stage, priced)
            if kind == "collective":
                queued = same_tier if group not in (EP, SPATIAL) else \
                    self._ep_queued(stage) if group == EP else self._spatial_queued(stage)
                out.append((_COLLECTIVE, 0.0, c, queued, st[UNIT]))
            elif group == SPATIAL:  # a halo beside the interior, on the communication stream (FIFO)
                out.append((_OVERLAP_QUEUED, st[DURATION], c, True, st[UNIT]))
            else:
                extra, exposed = overlap_cost(st[DURATION], c, step_sigma(st, self.sigma))
                out.append((_OVERLAP, st[DURATION], extra + exposed, False, st[UNIT]))
        program = self._programs_of[key] = tuple(out)  # a tuple of tuples: the garbage collector leaves it alone
        self.ev._keep.append(steps)  # the key holds its id: keep it alive as long as the program
        return program

    def _step_price(self, st: LeanStep, tp_ranks: list[int], stage: int, priced: dict[tuple, float]) -> float:
        """Seconds of step `st`'s collective on `stage`, remembered in `priced` (one step list's:
        a pass repeats its collectives layer after layer)."""
        key = (st[OP], st[NBYTES], st[GROUP], st[MESSAGES])
        c = priced.get(key)
        if c is None:
            c = priced[key] = self.price(st[OP], st[NBYTES], self._ranks(st, tp_ranks, stage), st[MESSAGES])
        return c

    def _stage_key(self, stage: int) -> tuple:
        """What a priced program of `stage` depends on besides its steps: the tiers and ranks per node
        of the stage's tensor- and data-parallel groups (`Evaluator.stage_groups`; `Evaluator._price`
        prices a collective by those), so that the stages of a deep pipeline share their programs;
        the stage itself where a step may run over another group (expert-parallel, context-parallel,
        spatial), whose ranks depend on the stage. Kept per strategy (`_stage_keys`)."""
        got = self._stage_keys.get(stage)
        if got is None:
            s = self.s
            if s.ep > 1 or s.cp > 1 or s.spatial > 1:
                got = ("stage", stage, s.dp, s.tp, s.pp, s.domain, s.ep, s.collective)
            else:
                got = (self.ev.stage_groups(s, stage)[2], s.dp > 1, s.tp, s.collective)
            self._stage_keys[stage] = got
        return got

    def walk_steps(self, steps: list[LeanStep], stage: int, launches: dict[int, Sequence[float]],
                   gathers: list[float] | None, now: float, busy: float, first_dep: float,
                   ready_at: list[float] | None = None) -> tuple[float, float, float, float]:
        """Run a step list from time `now` beside the communication stream, busy until `busy` (the
        simulator's per-device streams, `dlsim.plan.iteration` and `dlsim.plan.syncplan`): `launches`
        maps a step position to the collective durations it enqueues when it ends; `gathers` (ZeRO-3,
        or the updated parameters' gathers of `gathers_in_forward`) the all-gather of each parameter
        unit, which the unit's first step waits for. Gathers are prefetched `GATHER_PREFETCH` units
        ahead (`dlsim.plan.syncplan.OpHooks`): the pass's first units are enqueued once `first_dep`, the
        end of the previous pass on this device (at or before the pass's start), has passed, each later
        unit's behind what the stream holds when the unit `GATHER_PREFETCH` before it starts (a unit
        whose gather is None is kept gathered since its forward pass, FSDP2's, and waits for none); with
        `ready_at`, each unit's gather ends then instead (dispatched before the pass, `gathers_in_forward`).
        Compute runs slowed by σ while the stream is busy; a tensor-parallel
        collective on the data-parallel link tier waits for the queue that holds its ports. Returns
        (end, stream busy until, seconds compute was slowed, end of the first step).

        Kept by what it reads (the priced program's content, the launches', the gathers and the
        times; not with `ready_at`): candidates that differ in nothing a pass reads walk it alike, and
        a pass's first start in a pipeline is often the start `Timing._chunk` walked it from."""
        if ready_at is None:
            key = ("walked", self._program_name(steps, stage), self._launches_name(launches) if launches else -1,
                   tuple(gathers) if gathers is not None else None, now, busy, first_dep)
            got = self._programs_of.get(key)
            if got is None:
                got = self._programs_of[key] = self._walk_steps(steps, stage, launches, gathers, now, busy, first_dep,
                                                                None)
            return got  # type: ignore[return-value]
        return self._walk_steps(steps, stage, launches, gathers, now, busy, first_dep, ready_at)

    def _walk_steps(self, steps: list[LeanStep], stage: int, launches: dict[int, Sequence[float]],
                    gathers: list[float] | None, now: float, busy: float, first_dep: float,
                    ready_at: list[float] | None) -> tuple[float, float, float, float]:
        """`walk_steps`, walked."""
        sigma = self.sigma
        s1 = 1 + sigma
        program = self._program(steps, stage)
        slowed = 0.0
        first_end = -1.0
        # where the parameter unit changes (the same positions for every walk of the program)
        changes = self._unit_changes(steps) if gathers is not None or ready_at is not None else _NONE
        order = self._unit_order(steps) if gathers is not None else ()
        where = self._unit_index(steps) if gathers is not None else None
        launched = launches or _NONE
        ready: dict[int, float] = {}  # unit -> when its gather ends
        for pos, (kind, d, c, queued, st_unit) in enumerate(program):
            if pos in changes:
                if ready_at is not None:
                    busy = max(busy, ready_at[st_unit])
                    now = max(now, ready_at[st_unit])
                else:
                    j = where[st_unit]
                    for q in range(j, min(len(order), j + 1 + GATHER_PREFETCH)):
                        u = order[q]
                        if u in ready:
                            continue
                        g = gathers[u]
                        if g is None:  # kept gathered since its forward pass (`dlsim.plan.fsdp`)
                            ready[u] = now
                            continue
                        busy = max(busy, first_dep if q <= GATHER_PREFETCH else now) + g
                        ready[u] = busy
                    now = max(now, ready[st_unit])
            if kind == _COMPUTE:
                if busy > now and sigma > 0:
                    window = busy - now
                    if d * s1 <= window:
                        slowed += d * sigma
                        now += d * s1
                    else:
                        done = window / s1
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
            elif kind == _OVERLAP_QUEUED:  # the kernels now, the exchange once the stream is free; the next step
                if busy > now:             # waits for both
                    busy += c
                    now = max(now + d, busy)
                else:
                    extra, exposed = overlap_cost(d, c, sigma)
                    busy = now + c
                    now += d + extra + exposed
            else:
                now += d + c  # overlap: its kernels and what the collective beside them adds (`_program`)
            if first_end < 0:
                first_end = now
            if pos in launched:
                for dur in launched[pos]:
                    busy = max(busy, now) + dur
        return now, busy, slowed, first_end if first_end >= 0 else now

    def _spatial_queued(self, stage: int) -> bool:
        """Whether a spatial group's blocking collective shares its link tier (ports) with the gradient
        reductions queued on the communication stream."""
        return replicas(self.s) > 1 and self.pricer.tier(self.lay.cp_group(0, 0, stage)) == \
            self.pricer.tier(self.dpg(stage))

    def _unit_order(self, steps: list[LeanStep]) -> tuple[int, ...]:
        """The parameter units of a step list in step order (cached with its priced program)."""
        key = ("units", id(steps))
        got = self._programs_of.get(key)
        if got is None:
            got = self._programs_of[key] = tuple(dict.fromkeys(st[UNIT] for st in steps if st[UNIT] >= 0))
        return got  # type: ignore[return-value]

    def _unit_changes(self, steps: list[LeanStep]) -> dict[int, int]:
        """The positions in `steps` where the parameter unit changes (a step of a unit other than the
        last one met), with the unit entered (cached with the priced program)."""
        key = ("unit changes", id(steps))
        got = self._programs_of.get(key)
        if got is None:
            got, unit = {}, None
            for pos, st in enumerate(steps):
                if st[UNIT] >= 0 and st[UNIT] != unit:
                    got[pos] = unit = st[UNIT]
            self._programs_of[key] = got
        return got  # type: ignore[return-value]

    def _unit_index(self, steps: list[LeanStep]) -> dict[int, int]:
        """Each parameter unit's position in `_unit_order` (kept with it)."""
        key = ("unit index", id(steps))
        got = self._programs_of.get(key)
        if got is None:
            got = self._programs_of[key] = {u: i for i, u in enumerate(self._unit_order(steps))}
        return got  # type: ignore[return-value]

    def _programs(self, parts: list[tuple], c: list[float]) -> tuple[list[list[float]], list[float], list[float]]:
        """`_walk_programs`, kept by what it reads: the schedule, the passes' content names per chunk
        (`_alike`), the transfers and ZeRO-1/2's first gathers (candidates that differ in nothing the
        walk reads, such as a recomputation that re-runs nothing, share it)."""
        s = self.s
        alike, reps, names = self._alike(parts)
        first = (tuple(self.first_busy), tuple((k, tuple(x)) for k, x in sorted(self.first_ready.items()))) \
            if self.first_ready else ()
        key = ("programs walked", s.schedule, s.pp, s.num_microbatches, s.virtual_stages,
               tuple(names[a] for a in alike), tuple(c), first)
        got = self._programs_of.get(key)
        if got is None:
            got = self._programs_of[key] = self._walk_programs(parts, c, alike, reps, names)
        return got  # type: ignore[return-value]

    def _walk_programs(self, parts: list[tuple], c: list[float], alike: list[int], reps: list[int],
                       names: list[int]) -> tuple[list[list[float]], list[float], list[float]]:
        """ZeRO-2/3: every stage's op order (`pipeline_walk`), each pass walked (`walk_steps`) beside the
        stage's communication stream, which carries over from pass to pass as the simulator's does (a
        backward pass's reductions delay the next pass's gathers, slow its kernels, and the last ones
        end the iteration). Returns (ends[r][local chunk] of the last backward passes, when each
        stage's stream empties, each stage's seconds inside its passes).

        A pass's end and stream depend only on its priced steps, launches and gathers and on the
        stream's and previous pass's times relative to its start: they are memoised by those, with
        chunks whose priced passes are alike (the same blocks on different stages) sharing one entry
        (`_alike`), and the ops are run in the schedule's dependency order (`wavefront.op_steps`),
        the op-by-op walk's order, to the bit."""
        s = self.s
        p, v = s.pp, s.virtual_stages
        trace: list[tuple[list, list, list]] = []  # per stage and op: stream busy after, duration, pass key
        # what a pass's content name determines is kept by the evaluator, shared by every candidate
        # whose chunks price alike (`_alike`): the pieces of the passes' closed forms and the passes
        # walked step by step once (the memos of passes by relative times are this walk's: the times
        # of another candidate's passes seldom repeat)
        shared = self._programs_of.get(("pass pieces",))
        if shared is None:
            shared = self._programs_of[("pass pieces",)] = (Pieces(), set())
        pieces, walked = shared
        memos: dict[tuple, dict] = {}
        first_busy, first_ready = self.first_busy, self.first_ready
        walk_steps = self.walk_steps
        # per chunk: ZeRO-1/2's first-micro-batch gathers, the floor of relative times (earlier is alike:
        # done by the start), whether the previous pass's end matters (every pass gathers), and per kind
        # (backward, forward) the memo of its passes, shared by the chunks whose passes are alike
        info = []
        for k, x in enumerate(parts):
            gathering = bool(x[5]) and x[4] is not None
            keyed = gathering and bool(x[4])
            name = names[alike[k]]
            info.append((not x[5] and bool(x[4]), -sum(x[4][:1 + GATHER_PREFETCH]) if keyed else 0.0, keyed,
                         tuple(memos.setdefault((name, forward, gathering), {}) for forward in (False, True)),
                         (alike[k], False, gathering), (alike[k], True, gathering)))

        def run_pass(key: tuple, scale: float = 0.0, missed: bool = False) -> tuple[float, float]:
            """(end, stream busy until) of a pass from its start, keyed by what it depends on: its
            chunk's passes (`_alike`), kind, whether it gathers, when the stream is free and the previous
            pass ended (relative to its start); `missed`: the caller found no memo of it."""
            a, forward, gathering_, q, dep = key
            k = reps[a]
            memo = info[k][3][forward]
            sub = (q, dep) if info[k][2] else q
            got = None if missed else memo.get(sub)
            if got is None:
                line = (names[a], forward, gathering_)
                got = pieces.get(line, q, dep, scale)
                if got is None:
                    r = k % p
                    fwd, rec, bwd, launches, all_gathers, _, bwd_gathers = parts[k]
                    if forward:
                        programs = [(fwd, {}, all_gathers if gathering_ else None)]
                    else:
                        programs = ([(rec, {}, None)] if rec else []) + [(bwd, launches, bwd_gathers if gathering_ else None)]
                    if line not in walked:  # the pass's first start walked as it is (most passes of a
                        walked.add(line)    # short pipeline start once or twice)
                        now = 0.0
                        for steps, ls, gs in programs:
                            now, q, _, _ = walk_steps(steps, r, ls, gs, now, q, dep if gs is not None else 0.0)
                        got = (now, q)
                    else:  # a new piece of the pass's closed form (`affine`)
                        end, busy, cons = walk_affine([(self._program(x, r), ls, g,
                                                        self._unit_order(x) if g is not None else ())
                                                       for x, ls, g in programs], self.sigma, q, dep)
                        pieces.add(line, q, dep, end, busy, cons)
                        got = (end[0] + end[1] * q + end[2] * dep, busy[0] + busy[1] * q + busy[2] * dep)
                memo[sub] = got
            return got

        state: list[list[float]] = [[], [], []]  # per stage: stream busy until, end of the last pass, inside

        # per slot of an op (`wavefront.Structure.ops`: 2k backward, 2k + 1 forward of global chunk k,
        # 2K + k its micro-batch 0's forward): the memo of its passes, the floor of its relative
        # times, whether the previous pass's end keys them, the pass key's first fields, the pieces of
        # its passes' closed form (`Pieces.of`); no memo for ZeRO-1/2's micro-batch 0 forwards, which
        # wait for the updated parameters' first gathers
        K = len(parts)
        slots: list[tuple] = [()] * (3 * K)
        for k, (special, floor, keyed, memo, bkey, fkey) in enumerate(info):
            for forward, head in ((False, bkey), (True, fkey)):
                slots[2 * k + forward] = (memo[forward], floor, keyed, head,
                                          pieces.of((names[alike[k]], forward, head[2])))
            slots[2 * K + k] = (None, 0.0, False, None, None) if special else slots[2 * k + 1]

        def walk(m: int, record: bool) -> Walked:
            st, rows = op_steps(s.schedule, p, m, v)
            E = [0.0] * (st.n + 1)
            transfers = list(c) + [0.0]
            busy_at, prev_at, inside = [0.0] * p, [0.0] * p, [0.0] * p
            state[:] = [busy_at, prev_at, inside]
            trace[:] = [([], [], []) for _ in range(p)] if record else []
            for j, prev, dep, trans, r, slot in rows:
                t = E[prev]
                x = E[dep] + transfers[trans]
                if x > t:
                    t = x
                busy = busy_at[r]
                memo, floor, keyed, head, found = slots[slot]
                key = None
                if memo is None:
                    # ZeRO-1/2's updated parameters, gathered from the iteration's start: micro-batch 0 only
                    k = chunk_of(slot, K)
                    end, q, _, _ = walk_steps(parts[k][0], r, {}, None, 0.0, max(0.0, busy - t, first_busy[r] - t),
                                              0.0, [y - t for y in first_ready[k]])
                else:
                    # passes are time-invariant: keyed by relative times (a stream idle before the start and
                    # the previous pass's end, from which the first gathers are issued, long before it are alike)
                    rel = busy - t
                    if rel < floor:
                        rel = floor
                    if keyed:
                        dep_rel = prev_at[r] - t
                        if dep_rel < floor:
                            dep_rel = floor
                        sub = (rel, dep_rel)
                    else:
                        dep_rel = 0.0
                        sub = rel
                    got = memo.get(sub)
                    if got is None and found:
                        # the piece found last (`Pieces.get`'s first test): most passes the memo misses
                        # differ from one it holds by the rounding of their times alone
                        got = on_piece(found[0], rel, dep_rel, -SNAP * t)
                        if got is not None:
                            memo[sub] = got
                    if got is None or record:
                        key = head + (rel, dep_rel)
                        if got is None:
                            got = run_pass(key, t, True)
                    end, q = got
                busy_at[r] = t + q
                prev_at[r] = E[j] = t + end
                inside[r] += end
                if record:
                    tr = trace[r]
                    tr[0].append(t + q)
                    tr[1].append(end)
                    tr[2].append((key, floor, busy - t) if key is not None else None)
            last = [[E[i] for i in ids] for ids in st.last]
            if not record:
                return Walked(last, [])
            o = st.offsets
            return Walked(last, [E[o[r]:o[r + 1]] for r in range(p)], constant=(tuple(d for _, d, _ in trace),),
                          drifting=(tuple(busy for busy, _, _ in trace),))

        # a long pipeline walked through its periodic regime (every pass's seconds repeating too): the
        # seconds inside passes and the stream's last reductions extended; a stream that falls further
        # behind every period (the reductions outlast the passes) only where no pass notices by the end
        ext = periodic_walk(s.schedule, p, s.num_microbatches, v, lambda m: walk(m, True))
        if ext is not None and not self._drift_unseen(ext, trace, run_pass):
            ext = None
        if ext is None:
            last = walk(s.num_microbatches, False).last
            return last, list(state[0]), list(state[2])
        busy_at, _, inside = state
        more = [ext.periods * sum(trace[r][1][i] for i in ext.period_ops[r]) for r in range(p)]
        return ext.last, [busy_at[r] + ext.periods * ext.rates[0][r] for r in range(p)], \
            [inside[r] + more[r] for r in range(p)]

    def _alike(self, parts: list[tuple]) -> tuple[list[int], list[int], list[int]]:
        """Per global chunk an id shared by the chunks whose passes walk alike (the same priced steps,
        launches and gathers: `walk_steps` reads nothing else), per id its first chunk and the name of
        its content, the same for every candidate of the evaluator (`_programs` keys by it). A chunk's
        passes (`Timing._chunk`) and priced programs are kept by the evaluator, so their content is
        named once per chunk, stage and layout and the name reused by every candidate."""
        s, cache = self.s, self._programs_of
        p = s.pp
        names = cache.setdefault(("alike names",), {})
        ids: dict[int, int] = {}
        alike, reps = [], []
        for k, part in enumerate(parts):
            r = k % p
            key = ("alike", id(part)) + self._stage_key(r)
            got = cache.get(key)
            if got is None:
                fwd, rec, bwd, launches, gathers, every_pass, bwd_gathers = part
                sig = (self._program_name(fwd, r), self._program_name(rec, r) if rec else (),
                       self._program_name(bwd, r), self._launches_name(launches),
                       tuple(gathers) if gathers is not None else None, every_pass,
                       tuple(bwd_gathers) if bwd_gathers is not None else None)
                got = cache[key] = (part, names.setdefault(sig, len(names)))  # the part kept alive: its id is named
            name = got[1]
            a = ids.get(name)
            if a is None:
                a = ids[name] = len(reps)
                reps.append(k)
            alike.append(a)
        return alike, reps, list(ids)

    def _program_name(self, steps: list[LeanStep], stage: int) -> int:
        """The content of `steps`' priced program (`_program`) named by a number, the same for every
        program of equal content (kept with the program: each is read once, however many chunks
        and candidates share it)."""
        key = ("program name", id(steps)) + self._stage_key(stage)
        got = self._programs_of.get(key)
        if got is None:
            names = self._programs_of.setdefault(("program names",), {})
            got = self._programs_of[key] = names.setdefault(tuple(self._program(steps, stage)), len(names))
        return got  # type: ignore[return-value]

    def _launches_name(self, launches: dict[int, Sequence[float]]) -> int:
        """The content of a backward pass's bucket launches named by a number (`_program_name`'s rule);
        the dict is kept alive with its name (its id is the key)."""
        key = ("launches name", id(launches))
        got = self._programs_of.get(key)
        if got is None:
            names = self._programs_of.setdefault(("launches names",), {})
            sig = tuple((pos, tuple(d)) for pos, d in sorted(launches.items()))
            got = self._programs_of[key] = (launches, names.setdefault(sig, len(names)))
        return got[1]  # type: ignore[index]

    def _drift_unseen(self, ext, trace: list, run_pass) -> bool:
        """Whether the extension's streams hold: a stream that keeps pace with its passes (moving on λ
        per period) repeats; one that falls further behind (more than λ) holds if every pass of a
        period ends, and leaves the stream busy for as long after its start, with the stream as far
        behind as at the iteration's end (passes end no earlier and the stream's backlog grows no
        less with more backlog: equal at both ends, equal in between)."""
        latest = max(max(row) for row in ext.last)
        tol = TOLERANCE * latest / (ext.periods + 1)
        for r, rate in enumerate(ext.rates[0]):
            drift = rate - ext.lam
            if abs(drift) <= tol:
                continue
            if drift < 0:
                return False  # the stream catches up: its backlog runs out at some point
            for i in ext.period_ops[r]:
                rec = trace[r][2][i]
                if rec is None:
                    return False
                key, floor, behind = rec
                later = max(floor, behind + ext.periods * drift)
                end, q = run_pass(key)
                end2, q2 = run_pass(key[:3] + (later,) + key[4:])
                if abs(end2 - end) > tol or abs((q2 - later) - (q - key[3])) > tol:
                    return False
        return True
