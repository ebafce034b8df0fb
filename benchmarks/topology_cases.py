"""Contention on real and synthetic networks (issue 32 item 3): the cases the feature audit runs.

1. Two data-parallel rings on one oversubscribed uplink (4 nodes of 2 devices, leaves of 2 nodes,
   dp 4 x tp 2, ring all-reduce, Hockney): the default, `--full` and `--full --expand-collectives`
   iteration times at oversubscription 1, 2, 4 and 8, and each bucket's all-reduce in the expanded
   run against the closed form 2(p-1)(alpha + (n/p) f / B), f = max(1, 2 o / 4).
2. TACC Frontera (cpu-cluster, leaves of 44 nodes at 22:18) against the same fabric at 10:1:
   ResNet-50 data parallel on 256 sockets (default mode), and a 1 MB all-reduce on 256 ranks.
3. The same ResNet-50 on 128 sockets (64 nodes, two leaves) at 10:1 in all three modes: the
   expanded run's flows show the contention the closed form prices.

Prints JSON. Usage: python benchmarks/topology_cases.py [--quick] (--quick skips case 3, ~1 min).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from dlsim.api.comm import comm  # noqa: E402
from dlsim.api.simulate import simulate  # noqa: E402
from dlsim.io.profile_yaml import load_profile  # noqa: E402
from dlsim.sim.engine import execute  # noqa: E402
from dlsim.spec.cluster import LinkTier  # noqa: E402
from dlsim.spec.network import Fabric, TreeLevel  # noqa: E402

B, ALPHA = 1e9, 2e-6
MODES = {"default": {}, "full": {"symmetry": False}, "expanded": {"symmetry": False, "expand_collectives": True}}


def _toy(oversub: float):
    base = load_profile("cpu-cluster")
    fabric = Fabric("fat-tree", levels=(TreeLevel(2, oversub),))
    return replace(base, nodes=4, devices_per_node=2, reduce_bandwidth=0.0,
                   inter=LinkTier("ib", latency=ALPHA, bandwidth=B, topology="fat-tree", fabric=fabric),
                   intra=LinkTier("upi", latency=1e-6, bandwidth=20e9))


def _frontera(oversub: float, nodes: int):
    base = load_profile("cpu-cluster")
    return replace(base, nodes=nodes, inter=replace(base.inter, fabric=Fabric("fat-tree", levels=(TreeLevel(44, oversub),))))


class _Capture:
    """The task graph of a run (pytest's monkeypatch stand-in for tests/simkit.captured_graph)."""

    def __init__(self):
        self.undo = []

    def context(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for obj, name, value in reversed(self.undo):
            setattr(obj, name, value)

    def setattr(self, obj, name, value):
        self.undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)


def two_rings() -> list[dict]:
    from simkit import captured_graph
    kw = {"dp": 4, "tp": 2, "collective": "ring", "stack": "eager", "global_batch": 8}
    out = []
    for o in (1.0, 2.0, 4.0, 8.0):
        c = _toy(o)
        row = {"oversubscription": o, "factor": max(1.0, 2 * o / 4)}
        for mode, extra in MODES.items():
            row[f"{mode}_s"] = simulate("lenet5", c, **extra, **kw).iteration_time_s
        graph = captured_graph(_Capture(), "lenet5", c, symmetry=False, expand_collectives=True, **kw)
        tl = execute(graph)
        worst = 0.0
        for gid, g in enumerate(graph.groups):
            if g.messages and any(m.links for m in g.messages):
                times = tl.message_times[gid]
                span = max(e for _, _, e in times) - min(s for _, s, _ in times)
                n = sum(m.nbytes for m in g.messages) / 6
                closed = 6 * (ALPHA + n / 4 * row["factor"] / B)
                worst = max(worst, abs(span / closed - 1))
        row["expanded_allreduce_vs_closed_form_max_rel_error"] = worst
        out.append(row)
    return out


def frontera() -> dict:
    out = {}
    for label, o in (("22:18", 22 / 18), ("10:1", 10.0)):
        r = simulate("resnet50", _frontera(o, 128), dp=256, microbatch_size=32)
        b = r.breakdown
        a = comm("allreduce", 1e6, 256, cluster=_frontera(o, 128))
        out[label] = {"resnet50_dp256_iteration_s": r.iteration_time_s, "exposed_comm_s": b.exposed_comm,
                      "allreduce_1MB_256_ranks_s": a.results[0].time_s, "allreduce_algorithm": a.best,
                      "allreduce_note": a.results[0].note}
    return out


def frontera_modes() -> dict:
    out = {}
    c = _frontera(10.0, 64)
    for mode, extra in MODES.items():
        t0 = time.perf_counter()
        r = simulate("resnet50", c, dp=128, microbatch_size=32, **extra)
        out[mode] = {"iteration_s": r.iteration_time_s, "exposed_comm_s": r.breakdown.exposed_comm,
                     "wall_s": time.perf_counter() - t0}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the expanded 128-socket ResNet-50 (case 3)")
    args = ap.parse_args()
    rec = {"two_rings_one_uplink": two_rings(), "frontera": frontera()}
    if not args.quick:
        rec["frontera_10to1_resnet50_dp128_modes"] = frontera_modes()
    json.dump(rec, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
