"""What does one step of a small allreduce cost on the emulated 4-host cluster, per call, by pattern?

The calibration times a collective per call (barrier, one call, max end − max start over ranks) with
Open MPI yielding while idle (`dlsim.calibrate.comm_run.MPI_BASE_MCA`). This probe times, in exactly
that harness and with those settings, hand-written step sequences next to Open MPI's own allreduce
algorithms, so the per-step cost of each communication pattern can be read off directly:

* `fixed`  — 4 MPI_Sendrecv steps, every rank with partner r xor 1 each time (one TCP connection),
* `alt`    — 4 steps, partner r xor 1, r xor 2, r xor 1, r xor 2 (recursive doubling's partners),
* `shift`  — 4 steps, send to r+1, receive from r−1 (the ring's step),
* `ring6`  — 2(p−1) = 6 shift steps with chunks of size/p (the ring allreduce's messages),
* `rd2`    — recursive doubling's 2 exchanges of the whole vector,
* `rab4`   — Rabenseifner's 4 exchanges (size/2, size/4, size/4, size/2; partners r xor 2, 1, 1, 2),
* `ompi-ALGO` — MPI_Allreduce with the algorithm forced (ring, recursive-doubling, rabenseifner,
  binomial-tree-openmpi), one launch each; the hand-written sequences run in the ring launch.

`percall` is the calibration's method (median over `--reps` calls, each after a barrier); `loop` is
100 calls back to back divided by 100 (median of 5). No reduction is computed in the hand-written
sequences. Rounds repeat the whole set minutes apart, so their spread is the machine's, not the
pattern's. Output: one JSON line per launch in `--out` and a JSON summary on stdout
(µs per call; reading: reports/comm-validation-notes.md, section "Session 5").

    flock -x /tmp/dlsim-measure.lock python reports/archive/comm-validation/comm_step_probe.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from emulated_probe import add_cluster_options, emulated_cluster, mpirun_script, one_line_errors  # noqa: E402

ALGORITHMS = ("ring", "recursive-doubling", "rabenseifner", "binomial-tree-openmpi")


def _timers(comm):
    """(percall, loop): the calibration's per-call timing and a 100-call loop, in seconds per call."""
    rank = comm.Get_rank()

    def collect(start: float, end: float, calls: int) -> float | None:
        starts, ends = comm.gather(start, root=0), comm.gather(end, root=0)
        return (max(ends) - max(starts)) / calls if rank == 0 else None

    def percall(op, reps: int) -> float | None:
        for _ in range(5):
            op()
        values = []
        for _ in range(reps):
            comm.Barrier()
            start = time.perf_counter()
            op()
            values.append(collect(start, time.perf_counter(), 1))
        return statistics.median(values) if rank == 0 else None

    def loop(op, calls: int = 100) -> float | None:
        values = []
        for _ in range(5):
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(calls):
                op()
            values.append(collect(start, time.perf_counter(), calls))
        return statistics.median(values) if rank == 0 else None

    return percall, loop


def _sequences(comm, a, b, count: int) -> dict:
    """The hand-written step sequences of the module doc for a vector of `count` float32."""
    r, p = comm.Get_rank(), comm.Get_size()

    def steps(plan):
        def run():
            for dst, src, n in plan:
                comm.Sendrecv(a[:n], dest=dst, sendtag=5, recvbuf=b[:n], source=src, recvtag=5)
        return run

    right, left = (r + 1) % p, (r - 1) % p
    return {"fixed": steps([(r ^ 1, r ^ 1, count)] * 4),
            "alt": steps([(r ^ k, r ^ k, count) for k in (1, 2, 1, 2)]),
            "shift": steps([(right, left, count)] * 4),
            "ring6": steps([(right, left, max(count // p, 1))] * (2 * (p - 1))),
            "rd2": steps([(r ^ k, r ^ k, count) for k in (1, 2)]),
            "rab4": steps([(r ^ 2, r ^ 2, count // 2), (r ^ 1, r ^ 1, count // 4),
                           (r ^ 1, r ^ 1, count // 4), (r ^ 2, r ^ 2, count // 2)])}


def worker(args: argparse.Namespace) -> None:
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    percall, loop = _timers(comm)
    record: dict = {"launch": args.label, "round": args.round, "ranks": comm.Get_size(), "us_per_call": {}}
    for size in args.sizes:
        count = size // 4
        a, b = np.ones(count, np.float32), np.empty(count, np.float32)
        ops = {f"ompi-{args.label}": lambda: comm.Allreduce(a, b, op=MPI.SUM)}
        if args.label == "ring":
            ops.update(_sequences(comm, a, b, count))
        for name, op in ops.items():
            t1, t2 = percall(op, args.reps), loop(op)
            if comm.Get_rank() == 0:
                record["us_per_call"][f"{name}/{size}"] = {"percall": round(t1 * 1e6, 1), "loop": round(t2 * 1e6, 1)}
    if comm.Get_rank() == 0:
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")


def drive(args: argparse.Namespace) -> None:
    from dlsim.calibrate.comm_plan import OPENMPI_ALLREDUCE
    from dlsim.calibrate.comm_run import MPI_BASE_MCA
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    first = sum(1 for _ in open(out)) if out.exists() else 0
    with emulated_cluster(args) as cluster:
        for rnd in range(args.rounds):
            for label in ALGORITHMS:
                mca = {**MPI_BASE_MCA, "coll_tuned_use_dynamic_rules": "1", **OPENMPI_ALLREDUCE[label]}
                mpirun_script(cluster, 4, mca, __file__, ["--worker", "--out", str(out.resolve()), "--sizes", ",".join(map(str, args.sizes)),
                                                          "--reps", str(args.reps), "--label", label, "--round", str(rnd)])
                print(f"round {rnd} {label} done", file=sys.stderr)
    summarise(out, first)


def summarise(out: Path, first: int = 0) -> None:
    """Per (pattern, size): the per-call medians of every round, and per step (calls / steps)."""
    steps = {"fixed": 4, "alt": 4, "shift": 4, "ring6": 6, "rd2": 2, "rab4": 4}
    rows: dict[str, list] = {}
    for line in open(out).read().splitlines()[first:]:
        for key, value in json.loads(line)["us_per_call"].items():
            rows.setdefault(key, []).append(value)
    summary = {}
    for key, values in sorted(rows.items()):
        name = key.split("/")[0]
        per = [v["percall"] for v in values]
        summary[key] = {"percall_us": per, "loop_us": [v["loop"] for v in values],
                        "percall_per_step_us": [round(v / steps[name], 1) for v in per] if name in steps else None}
    print(json.dumps({"file": str(out), "launches_from": first, "summary": summary}, indent=1))


def byte_sizes(text: str) -> list[int]:
    """`--sizes`: positive multiples of 16 bytes (Rabenseifner's quarter vector must hold whole float32s)."""
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of byte counts: {text!r}") from None
    if not sizes or any(s < 16 or s % 16 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be positive multiples of 16 bytes, got {text!r}")
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--label", default="ring", help=argparse.SUPPRESS)
    ap.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "reports" / "comm-step-probe" / "steps.jsonl"))
    ap.add_argument("--sizes", default="256,1024,2048", type=byte_sizes,
                    help="comma-separated message sizes in bytes, multiples of 16 (default 256,1024,2048)")
    ap.add_argument("--reps", type=int, default=41)
    ap.add_argument("--rounds", type=int, default=3)
    add_cluster_options(ap)
    ap.add_argument("--summary", action="store_true", help="only summarise --out")
    args = ap.parse_args()
    if args.worker:
        worker(args)
    elif args.summary:
        summarise(Path(args.out))
    else:
        drive(args)


if __name__ == "__main__":
    one_line_errors(main)
