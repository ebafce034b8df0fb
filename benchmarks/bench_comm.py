"""Speed of the vectorised collective path (issue 3 acceptance: 100,000 (size, ranks, algorithm)
points in under a second).

Prints JSON: the wall time of `dlsim.api.comm.comm_grid` (the path `dlsim comm --sweep` uses) on
2,000 sizes x 10 rank counts x 5 allreduce algorithms = 100,000 points, cold (first call, double-
binary-tree layouts not cached yet) and warm (median of repeats); the same grid with all 8
allreduce algorithms; the scalar `collective_time` per point for comparison; and a whole
`dlsim comm --sweep` run in-process.
Usage: python benchmarks/bench_comm.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import time

import numpy as np


def timed(fn, repeats: int) -> tuple[float, list[float]]:
    first = None
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        first = times[0] if first is None else first
    return first, times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from dlsim.api.comm import comm_grid, network, parse_sweep
    from dlsim.cli import run
    from dlsim.cost.collectives import collective_time

    net = network(1024, cluster="dgx-h100")
    sizes = np.geomspace(1.0, 1e10, 2000)
    ranks = [2, 3, 8, 16, 24, 64, 100, 256, 512, 1024]
    five = ["ring", "recursive-doubling", "rabenseifner", "binomial-tree", "double-binary-tree"]
    cases = []
    for label, algorithms in (("5 allreduce algorithms", five), ("all 8 allreduce algorithms", "all")):
        holder = {}

        def call(algorithms=algorithms, holder=holder):
            holder["grid"] = comm_grid("allreduce", sizes, ranks, algorithms, net)
        cold, times = timed(call, args.repeats)
        points = sum(int(np.isfinite(v).sum()) + int(np.isnan(v).sum()) for v in holder["grid"].values())
        warm = statistics.median(times[1:]) if len(times) > 1 else times[0]
        cases.append({"case": label, "points": points, "cold_s": cold, "warm_median_s": warm,
                      "points_per_s": points / warm, "under_one_second": cold < 1.0 and warm < 1.0})

    link = net.link
    start = time.perf_counter()
    count = 0
    for n in sizes[::20]:
        for p in ranks:
            collective_time("allreduce", "rabenseifner", float(n), p, link, gamma=net.gamma)
            count += 1
    scalar = (time.perf_counter() - start) / count

    def cli():
        with contextlib.redirect_stdout(io.StringIO()):
            assert run(["comm", "allreduce", "--sweep", "1B:10GB:1.01", "--ranks", "64", "--cluster", "dgx-h100",
                        "--algorithm", "all"]) == 0
    _, cli_times = timed(cli, max(1, args.repeats // 2))
    print(json.dumps({"benchmark": "comm", "grid": {"sizes": len(sizes), "ranks": ranks}, "cases": cases,
                      "scalar_seconds_per_point": scalar,
                      "cli_sweep": {"command": "dlsim comm allreduce --sweep 1B:10GB:1.01 --ranks 64 "
                                               "--cluster dgx-h100 --algorithm all",
                                    "sizes": len(parse_sweep("1B:10GB:1.01")), "median_s": statistics.median(cli_times)}}, indent=2))


if __name__ == "__main__":
    main()
