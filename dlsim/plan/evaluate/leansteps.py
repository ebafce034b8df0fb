"""Step lists as the evaluator keeps them: each `dlsim.plan.templates.Step` as a tuple of plain
values, the fields the evaluator reads (`Timing`, `StreamWalk`).

The evaluator keeps thousands of step lists (per chunk, pass and configuration, shared by the
candidates of a search). A `Step` is a named tuple, which Python's cyclic garbage collector tracks
for as long as it lives, and every full collection visits; a tuple of plain values (strings, numbers,
tuples of them) it stops tracking at its first collection. Timing the GPT-3 175B / 1,024 A100 search
space (`benchmarks/bench_predict.py`), the kept steps were 590,000 of the 1.67 million objects the
collector tracked at the end, and its full collections took about 15% of the CPU time.

The templates make the evaluator's step lists in this form directly (`dlsim.plan.templates`,
`lean=True`: no `Step` is made); tests/test_lean_steps.py holds them equal to the `Step`s the simulator's
templates make, field by field.
"""

from __future__ import annotations

KIND, DURATION, OP, NBYTES, MESSAGES, GROUP, BUCKETS, UNIT, SLOWDOWN = range(9)
"""Positions in a lean step: the step's kind, kernel seconds, its collective's op, bytes and
point-to-point messages (None, 0 and () without one), group, buckets complete after it, parameter unit,
kernel slowdown beside its collective (None: the device's)."""

LeanStep = tuple


def sigma(st: LeanStep, device_sigma: float) -> float:
    """`Step.sigma`: the slowdown of an overlap's kernels on a device whose own is `device_sigma`."""
    return device_sigma if st[SLOWDOWN] is None else st[SLOWDOWN]
