"""What a communication calibration measures: sizes, repetitions, collectives, forced algorithms.

A `CommPlan` is plain data handed (as JSON) to the measuring processes started by mpirun or by
the gloo launcher. Sizes are bytes; the collectives follow the nccl-tests size convention.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dlsim.errors import SpecError

BACKENDS = ("mpi", "gloo", "nccl")
IDLE_WAITS = ("sleep", "spin", "sleep-barrier")
COLLECTIVES = ("allreduce", "reduce-scatter", "allgather", "broadcast", "reduce", "all-to-all")

# Open MPI 4.1 coll/tuned: `ompi_info --param coll tuned --level 9` (coll_tuned_allreduce_algorithm:
# 1 basic_linear, 2 nonoverlapping (tuned reduce + tuned bcast), 3 recursive_doubling, 4 ring,
# 5 segmented_ring, 6 rabenseifner; coll_tuned_reduce_algorithm 5 binomial, 2 chain;
# coll_tuned_bcast_algorithm 6 binomial, 2 chain), forced with coll_tuned_use_dynamic_rules 1.
OPENMPI_ALLREDUCE = {
    "ring": {"coll_tuned_allreduce_algorithm": "4"},
    "recursive-doubling": {"coll_tuned_allreduce_algorithm": "3"},
    "rabenseifner": {"coll_tuned_allreduce_algorithm": "6"},
    "binomial-tree-openmpi": {"coll_tuned_allreduce_algorithm": "2", "coll_tuned_reduce_algorithm": "5",
                      "coll_tuned_bcast_algorithm": "6", "coll_tuned_reduce_algorithm_segmentsize": "0",
                      "coll_tuned_bcast_algorithm_segmentsize": "0"},
}
"""dlsim allreduce algorithm -> the Open MPI 4.1 MCA settings that force it. Open MPI's binomial
allreduce (algorithm 2 = binomial reduce then binomial broadcast) is dlsim's `binomial-tree-openmpi`:
its broadcast posts the sends to all children at once (`dlsim.cost.collectives.trees`), unlike
MPICH's `binomial-tree`."""


def powers_of_two(lo: int, hi: int, step: int = 2) -> tuple[int, ...]:
    out, x = [], lo
    while x <= hi:
        out.append(x)
        x *= step
    return tuple(out)


@dataclass(frozen=True)
class CommPlan:
    """One launch of the measuring processes (all ranks run the same plan).

    `idle_gap_s` > 0: every collective repetition (warm-up included) starts with all ranks asleep
    for that long, then the barrier, then the timed operation, so the links are idle before each
    call (a tbf bucket of b bytes refilled at rate R is full again after b / R), as in training where
    a gradient allreduce follows compute. 0 (the default): repetitions back to back. Point-to-point
    measurements (ping-pong, PRTT) keep their own protocol either way. `idle_wait`: how the ranks
    wait out the gap, "sleep" (CPUs idle too) or "spin" (a busy loop: CPUs as busy as back to back,
    only the links idle), or "sleep-barrier" (sleep, then one extra barrier: the woken ranks pass a
    round of empty messages, a few hundred bytes per port, before the timed call's barrier).
    """

    backend: str
    out_dir: str
    hosts: str = "local"
    pingpong_sizes: tuple[int, ...] = powers_of_two(1, 1 << 24)
    prtt_sizes: tuple[int, ...] = powers_of_two(1, 1 << 20, 4)
    prtt_messages: int = 10
    reduce_sizes: tuple[int, ...] = powers_of_two(1 << 12, 1 << 26, 4)
    collectives: tuple[str, ...] = COLLECTIVES
    collective_sizes: tuple[int, ...] = powers_of_two(1 << 10, 1 << 24)
    algorithm: str = "default"
    setting: str = ""
    point_to_point: bool = True
    min_reps: int = 3
    max_reps: int = 40
    budget_s: float = 0.5
    warmup: int = 1
    idle_gap_s: float = 0.0
    idle_wait: str = "sleep"
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise SpecError(f"unknown backend {self.backend!r} (use {', '.join(BACKENDS)})", field="backend")
        bad = [c for c in self.collectives if c not in COLLECTIVES]
        if bad:
            raise SpecError(f"cannot measure collective {bad[0]!r} (use {', '.join(COLLECTIVES)})", field="collectives")
        if self.min_reps < 1 or self.max_reps < self.min_reps:
            raise SpecError("repetitions must satisfy 1 <= min_reps <= max_reps", field="reps")
        if not (isinstance(self.idle_gap_s, (int, float)) and math.isfinite(self.idle_gap_s)
                and self.idle_gap_s >= 0):
            raise SpecError(f"the idle gap must be a finite time >= 0 s, got {self.idle_gap_s!r}", field="idle_gap")
        if self.idle_wait not in IDLE_WAITS:
            raise SpecError(f"unknown idle wait {self.idle_wait!r} (use {', '.join(IDLE_WAITS)})", field="idle_wait")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_file(cls, path: str | Path) -> "CommPlan":
        data = json.loads(Path(path).read_text())
        for key in ("pingpong_sizes", "prtt_sizes", "reduce_sizes", "collectives", "collective_sizes"):
            data[key] = tuple(data[key])
        return cls(**data)


def worker_arguments(argv: list[str] | None, description: str | None) -> tuple[CommPlan, bool]:
    """The command line every measuring process gets from the launcher: the plan file and `--quiet`."""
    import argparse
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("plan")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    return CommPlan.from_file(args.plan), args.quiet
