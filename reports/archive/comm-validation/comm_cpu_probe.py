"""Does a rank's CPU overhead per message grow when more MPI ranks are busy than the host has cores?

An experiment independent of the validated collectives: on the emulated 4-host cluster (prefix
dlsimc; root; run under `flock -x /tmp/dlsim-measure.lock`), ranks 0 and 1 ping-pong small messages
(one-way time = round trip / 2, median over the iterations) while the other ranks

* `alone`  — do not exist (mpirun -np 2),
* `sleep`  — wait for the end in an MPI_Irecv tested every 200 us with a sleep in between (idle),
* `poll`   — wait for the end in a blocking MPI_Recv (Open MPI busy-polls its progress engine),
* `pairs`  — ping-pong among themselves (ranks 2 and 3) at the same time;

and, to time the step of a collective directly (every rank sends and receives at once, back-to-back
MPI_Sendrecv; the time recorded is one step, not a one-way time):

* `exchange` — rank r exchanges with r xor 1 (recursive doubling's step), with 2 and with 4 ranks,
* `shift`    — 4 ranks, each sends to r+1 and receives from r-1 (the ring's step);
* `exchange-barrier` / `exchange-idle` — one exchange step right after a barrier (how the calibration
  times a collective), resp. after a further 2 ms asleep (every tbf bucket full again).

Every rank also reports its CPU time / wall time over the phase (how much of a core it used), so
"busy" is observed, not assumed. Launches alternate np=2 / np=4 (`--rounds`) so slow drift in the
machine's load shows up as spread, not as an effect. Output: one JSON line per (launch, mode, size)
in `--out` (default reports/archive/comm-validation/comm-cpu-probe/probe-pingpong-exchange.jsonl; reading: reports/archive/comm-validation/comm-cpu-probe.md) and a summary on stdout.

    flock -x /tmp/dlsim-measure.lock python reports/archive/comm-validation/comm_cpu_probe.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from emulated_probe import add_cluster_options, emulated_cluster, mpirun_script  # noqa: E402

MODES_4 = ("sleep", "poll", "pairs", "exchange", "shift", "exchange-barrier", "exchange-idle")
MODES_2 = ("alone", "exchange", "exchange-barrier", "exchange-idle")


def _pingpong(comm, buf, partner: int, first: bool, iters: int, warm: int) -> list[float]:
    out = []
    for i in range(warm + iters):
        if first:
            t0 = time.perf_counter()
            comm.Send(buf, dest=partner, tag=7)
            comm.Recv(buf, source=partner, tag=7)
            if i >= warm:
                out.append((time.perf_counter() - t0) / 2)
        else:
            comm.Recv(buf, source=partner, tag=7)
            comm.Send(buf, dest=partner, tag=7)
    return out


def _exchange(comm, buf, rbuf, dst: int, src: int, iters: int, warm: int) -> list[float]:
    """Back-to-back MPI_Sendrecv steps (send to `dst`, receive from `src`): the step of a collective."""
    out = []
    for i in range(warm + iters):
        t0 = time.perf_counter()
        comm.Sendrecv(buf, dest=dst, sendtag=5, recvbuf=rbuf, source=src, recvtag=5)
        if i >= warm:
            out.append(time.perf_counter() - t0)
    return out


def _exchange_after(comm, buf, rbuf, partner: int, idle: float, iters: int, warm: int) -> list[float]:
    """One MPI_Sendrecv step after a barrier (as the calibration times a collective), and after `idle`
    seconds asleep on top of it (the tbf buckets refill): the first step of a collective."""
    out = []
    for i in range(warm + iters):
        comm.Barrier()
        if idle:
            time.sleep(idle)
        t0 = time.perf_counter()
        comm.Sendrecv(buf, dest=partner, sendtag=5, recvbuf=rbuf, source=partner, recvtag=5)
        if i >= warm:
            out.append(time.perf_counter() - t0)
    return out


def worker(out: str, sizes: list[int], iters: int, warm: int, launch: int) -> None:
    """Run under mpirun; rank 0 appends the records to `out`."""
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    modes = MODES_2 if size == 2 else MODES_4
    token = np.zeros(1, dtype=np.uint8)
    for mode in modes:
        for nbytes in sizes:
            buf = np.zeros(nbytes, dtype=np.uint8)
            comm.Barrier()
            w0, c0 = time.perf_counter(), time.process_time()
            times: list[float] = []
            if mode in ("exchange-barrier", "exchange-idle"):
                times = _exchange_after(comm, buf, np.zeros_like(buf), rank ^ 1, 2e-3 if mode == "exchange-idle" else 0.0,
                                        max(1, iters // 10), warm)
            elif mode == "exchange":
                times = _exchange(comm, buf, np.zeros_like(buf), rank ^ 1, rank ^ 1, iters, warm)
            elif mode == "shift":
                times = _exchange(comm, buf, np.zeros_like(buf), (rank + 1) % size, (rank - 1) % size, iters, warm)
            elif rank < 2:
                times = _pingpong(comm, buf, 1 - rank, rank == 0, iters, warm)
                if rank == 0 and mode in ("sleep", "poll"):
                    for r in range(2, size):
                        comm.Send(token, dest=r, tag=99)
            elif mode == "pairs":
                times = _pingpong(comm, buf, 5 - rank, rank == 2, iters, warm)
            elif mode == "poll":
                comm.Recv(token, source=0, tag=99)
            else:
                req = comm.Irecv(token, source=0, tag=99)
                while not req.Test():
                    time.sleep(2e-4)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            rows = comm.gather({"rank": rank, "cpu_fraction": cpu / wall if wall > 0 else 0.0,
                                "one_way_median_s": statistics.median(times) if times else None,
                                "one_way_q1_s": float(np.percentile(times, 25)) if times else None,
                                "one_way_q3_s": float(np.percentile(times, 75)) if times else None,
                                "one_way_p90_s": float(np.percentile(times, 90)) if times else None,
                                "one_way_p99_s": float(np.percentile(times, 99)) if times else None,
                                "one_way_mean_s": float(np.mean(times)) if times else None,
                                "one_way_max_s": float(np.max(times)) if times else None}, root=0)
            if rank == 0:
                rec = {"launch": launch, "ranks": size, "mode": mode, "size_bytes": nbytes, "iters": iters,
                       "cpus": os.cpu_count(), "per_rank": rows}
                with open(out, "a") as handle:
                    handle.write(json.dumps(rec) + "\n")
    comm.Barrier()


def drive(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    launch = sum(1 for _ in open(out)) if out.exists() else 0
    with emulated_cluster(args) as cluster:
        for rnd in range(args.rounds):
            for ranks in (2, 4):
                mpirun_script(cluster, ranks, {}, __file__, ["--worker", "--out", str(out.resolve()), "--sizes", args.sizes,
                                                             "--iters", str(args.iters), "--launch", str(launch)], 300)
                launch += 1
                print(f"round {rnd} ranks {ranks} done", file=sys.stderr)
    summarise(out)


def summarise(out: Path) -> None:
    recs = [json.loads(line) for line in open(out)]
    table = []
    order = ["alone", "sleep", "poll", "pairs", "exchange-2", "exchange-4", "shift-4", "exchange-barrier-2",
             "exchange-barrier-4", "exchange-idle-2", "exchange-idle-4"]
    for r in recs:
        if r["mode"] in ("exchange", "shift", "exchange-barrier", "exchange-idle"):
            r["mode"] = f"{r['mode']}-{r['ranks']}"
    groups: dict[tuple, list] = {}
    for r in recs:
        groups.setdefault((r["mode"], r["size_bytes"]), []).append(r)
    for (mode, nbytes), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], order.index(kv[0][0]))):
        pair01 = [r["per_rank"][0]["one_way_median_s"] for r in rs]
        stats = {k: [round(r["per_rank"][0][f"one_way_{k}_s"] * 1e6, 1) for r in rs if f"one_way_{k}_s" in r["per_rank"][0]]
                 for k in ("q1", "q3", "p90", "p99", "mean", "max")}
        pair23 = [r["per_rank"][2]["one_way_median_s"] for r in rs if len(r["per_rank"]) > 2
                  and r["per_rank"][2]["one_way_median_s"] is not None]
        cpu = [[round(p["cpu_fraction"], 2) for p in r["per_rank"]] for r in rs]
        table.append({"mode": mode, "size_bytes": nbytes, "launches": len(rs),
                      "one_way_us_pair01": [round(x * 1e6, 1) for x in pair01],
                      "one_way_us_pair23": [round(x * 1e6, 1) for x in pair23],
                      "median_us_pair01": round(statistics.median(pair01) * 1e6, 1),
                      **{f"{k}_us_pair01": v for k, v in stats.items()},
                      "cpu_fraction_per_rank": cpu})
    for row in table:
        print(json.dumps(row))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--launch", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "reports" / "comm-cpu-probe" / "probe-pingpong-exchange.jsonl"))
    ap.add_argument("--sizes", default="64,1024")
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    add_cluster_options(ap)
    ap.add_argument("--summary", action="store_true", help="only summarise --out")
    args = ap.parse_args()
    if args.worker:
        worker(args.out, [int(s) for s in args.sizes.split(",")], args.iters, 50, args.launch)
    elif args.summary:
        summarise(Path(args.out))
    else:
        drive(args)


if __name__ == "__main__":
    main()
