"""DeepSpeed's TrainSchedule (microsoft/DeepSpeed@8164ea9 deepspeed/runtime/pipe/schedule.py) executed
with its blocking exchanges (pipe/p2p.py: dist.send / dist.recv, each completing only once both ends
have reached it) finishes in the 1F1B closed form (m + p - 1)(t_f + t_b) on uniform stages: its
alternating even/odd steps add no idle time, which is why the deepspeed stack keeps dlsim's 1f1b
schedule (stacks/deepspeed.yaml notes). The step generator below is the schedule's, transcribed."""

from __future__ import annotations

import pytest

from dlsim.plan.pipeline import closed_form_iteration, one_f_one_b


def _train_schedule(m: int, p: int, s: int) -> list[tuple]:
    """Stage s's instructions in order (TrainSchedule.steps and _step_to_micro_batch)."""
    out, prev = [], -1
    valid = lambda i: 0 <= i < m  # noqa: E731
    for t in range(2 * (m + p - 1)):
        if t % 2 == s % 2:  # even step on an even stage, odd on odd: a forward step
            mb, fwd = (t - t % 2) // 2 - s // 2, True
        elif t % 2 == 0:  # even step, odd stage
            mb, fwd = t // 2 - p + (s + 1) // 2, False
        else:  # odd step, even stage
            mb, fwd = (t - 1) // 2 - p + 1 + s // 2, False
        if fwd:
            if valid(mb) and s > 0:
                out.append(("recv", s - 1, ("act", mb)))
            if valid(prev) and s > 0:
                out.append(("send", s - 1, ("grad", prev)))
        else:
            if valid(prev) and s < p - 1:
                out.append(("send", s + 1, ("act", prev)))
            if valid(mb) and s < p - 1:
                out.append(("recv", s + 1, ("grad", mb)))
        if valid(mb):
            out.append(("F" if fwd else "B", mb))
        prev = mb
    return out


def _run(programs: list[list[tuple]], t_f: float, t_b: float) -> float:
    """Each stage runs its instructions in order; a send and its receive complete together, when the
    later of the two ends reaches it (a rendezvous, free of transfer time)."""
    p = len(programs)
    pc, clock = [0] * p, [0.0] * p
    waiting: dict[tuple, tuple[int, float]] = {}  # an exchange -> (the stage blocked in it, since when)
    moved = True
    while moved:
        moved = False
        for s in range(p):
            while pc[s] < len(programs[s]):
                op = programs[s][pc[s]]
                if op[0] in ("F", "B"):
                    clock[s] += t_f if op[0] == "F" else t_b
                    pc[s] += 1
                    moved = True
                    continue
                kind, peer, tag = op
                key = (s, peer, tag) if kind == "send" else (peer, s, tag)
                first = waiting.setdefault(key, (s, clock[s]))
                if first[0] == s:  # this end is first: blocked until the peer arrives
                    break
                end = max(clock[s], waiting.pop(key)[1])
                clock[s] = clock[peer] = end
                pc[s] += 1
                pc[peer] += 1
                moved = True
    assert all(pc[s] == len(programs[s]) for s in range(p)), "deadlock"
    return max(clock)


@pytest.mark.parametrize("p, m", [(2, 1), (4, 4), (4, 8), (12, 1), (12, 24), (35, 40)])
def test_train_schedule_runs_in_the_1f1b_closed_form(p, m):
    programs = [_train_schedule(m, p, s) for s in range(p)]
    for s in range(p):  # the same per-stage order as 1F1B
        assert [op for op in programs[s] if op[0] in ("F", "B")] == [(o.kind, o.microbatch) for o in one_f_one_b(p, m, s)]
    assert _run(programs, 1.0, 2.0) == pytest.approx(closed_form_iteration("1f1b", p, m, 1, 1.0, 2.0), rel=1e-12)
