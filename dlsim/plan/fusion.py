"""A tensor-parallel step list run as one task on a device's compute stream (`dlsim.plan.iteration`).

When nothing else on the device uses the ports of a step list's collectives, nothing can come between
its kernels and its blocking collectives, so the list is one task of back-to-back parts: each compute
step's kernels, each collective's priced time, and for an overlap step (a collective beside kernels)
the part of the collective and of the kernels' slowdown the kernels do not hide
(`dlsim.cost.overlap.overlap_cost`). One task instead of one per step keeps the event count down.
"""

from __future__ import annotations

from typing import Callable

from dlsim.cost.overlap import overlap_cost
from dlsim.plan.taskgraph import COMM, COMPUTE
from dlsim.plan.templates import Step
from dlsim.results import Estimate, Source


def fuse_steps(steps: list[Step], group_info: Callable[[str], tuple], price: Callable[..., Estimate],
               overlap_slowdown: float) -> tuple:
    """(parts, ports, rigid, part_info) of `steps` as one task (`dlsim.plan.taskgraph.Task`).
    `group_info(kind)` gives (ranks, tier, per_node, ports) of the device's group of that kind;
    `price(op, bytes, ranks, tier, per_node, messages)` prices a collective (`messages`: a spatial halo
    exchange's, `dlsim.plan.spatial`); `rigid` are the indices of the
    kernel parts whose slowdown beside a collective is already priced in the part after them."""
    parts, info = [], []  # info: what each part is (Task.part_info)
    ports: set[int] = set()
    rigid: list[int] = []
    for st in steps:
        if st.kind != "collective":
            parts.append((st.category, st.duration, st.measured))
            info.append({"layers": st.name})
        if st.kind == "compute":
            continue
        c = st.collective
        ranks, tier, per_node, pp = group_info(st.group)
        if len(ranks) == 1:
            continue
        est = price(c.op, c.nbytes, ranks, tier, per_node, c.messages)
        measured = est.seconds if est.source in (Source.MEASURED, Source.INTERPOLATED) else 0.0
        what = {"op": c.op, "why": c.why, "bytes": c.nbytes, "group": st.group, "ranks": len(ranks), "tier": tier,
                "source": est.source.value}
        if st.kind == "overlap":  # the part of the collective and its slowdown not hidden by the kernels
            rigid.append(len(parts) - 1)
            parts.append((COMM, sum(overlap_cost(st.duration, est.seconds, st.sigma(overlap_slowdown))), 0.0))
            info.append({**what, "exposed_beside": st.name})
        else:
            parts.append((COMM, est.seconds, measured))
            info.append(what)
        ports.update(pp)
    if not parts:
        return ((COMPUTE, 0.0, 0.0),), tuple(sorted(ports)), tuple(rigid), ({"layers": "-"},)
    return tuple(parts), tuple(sorted(ports)), tuple(rigid), tuple(info)
