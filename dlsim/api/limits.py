"""Resource limits, checked before anything is allocated or simulated (issue 16).

Each limit keeps one command well under ten seconds and a few hundred MiB on a laptop; a request
beyond it is refused with one line naming the quantity, the limit and what to do, never attempted.
"""

from __future__ import annotations

from dlsim.errors import SpecError
from dlsim.spec.strategy import Strategy

MAX_BATCH = 2**24                 # samples per iteration (estimate, model show, simulate)
MAX_PLAN_BATCH = 8192             # plan microbatch: the dynamic programme is O(batch) per layer and policy
MAX_PLAN_BATCH_ALL = 1024         # plan microbatch --policy all: O(batch^2)
MAX_RANKS = 2**20                 # comm: ranks of one collective
MAX_MICROBATCHES = 8192           # micro-batches per iteration and replica
MAX_PIPELINE_TASKS = 2**17        # num_microbatches x pp x virtual_stages (tasks of one replica's schedule)
MAX_PS_STEPS = 8192               # iterations x dp workers of parameter-server / async / SSP runs
MAX_FULL_DEVICES = 4096           # devices simulated one by one (--full)
MAX_DEVICES = 2**24               # dp x tp x pp
MIN_BUCKET, MAX_BUCKET = 1.0, 2.0**50   # gradient bucket sizes, bytes


def _refuse(field: str, what: str, value: int, limit: int, hint: str = "") -> None:
    raise SpecError(f"{what} {value} is over the limit of {limit}{'; ' + hint if hint else ''}", field=field)


def check_batch_limit(batch: int, field: str = "batch", limit: int = MAX_BATCH) -> int:
    if isinstance(batch, int) and not isinstance(batch, bool) and batch > limit:
        _refuse(field, "batch", batch, limit)
    return batch


def check_nodes_limit(nodes: int, devices_per_node: int) -> int:
    """A cluster resized to `nodes` nodes holds at most MAX_DEVICES devices."""
    if nodes * max(devices_per_node, 1) > MAX_DEVICES:
        _refuse("nodes", f"devices nodes x devices_per_node ({nodes} x {devices_per_node})",
                nodes * devices_per_node, MAX_DEVICES)
    return nodes


def check_ranks_limit(ranks: object) -> object:
    if isinstance(ranks, int) and not isinstance(ranks, bool) and ranks > MAX_RANKS:
        _refuse("ranks", "ranks", ranks, MAX_RANKS)
    return ranks


def check_plan_batch(batch: int, policy: str) -> int:
    limit = MAX_PLAN_BATCH_ALL if policy == "all" else MAX_PLAN_BATCH
    if isinstance(batch, int) and not isinstance(batch, bool) and batch > limit:
        _refuse("batch", f"batch (policy {policy})", batch, limit,
                "use --policy powerOfTwo" if policy == "all" and batch <= MAX_PLAN_BATCH else "")
    return batch


def check_strategy_limits(s: Strategy, *, full: bool = False) -> Strategy:
    """Refuse strategies whose simulation would take minutes or gigabytes."""
    if s.devices > MAX_DEVICES:
        _refuse("dp", "devices dp x tp x pp x cp", s.devices, MAX_DEVICES)
    for name in ("bucket_size", "first_bucket_size"):
        value = getattr(s, name, None)
        if isinstance(value, (int, float)) and not MIN_BUCKET <= value <= MAX_BUCKET:
            raise SpecError(f"{value:g} bytes is outside [1 B, 1 PiB]", field=name)
    check_batch_limit(s.microbatch_size, "microbatch_size")
    check_batch_limit(s.dp * s.microbatch_size * s.num_microbatches, "global_batch")
    if s.num_microbatches > MAX_MICROBATCHES:
        _refuse("num_microbatches", "num_microbatches", s.num_microbatches, MAX_MICROBATCHES)
    tasks = s.num_microbatches * s.pp * s.virtual_stages
    if tasks > MAX_PIPELINE_TASKS:
        _refuse("num_microbatches", "num_microbatches x pp x virtual_stages", tasks, MAX_PIPELINE_TASKS)
    if s.sync == "ssp" and s.staleness > MAX_PS_STEPS:
        _refuse("staleness", "staleness", s.staleness, MAX_PS_STEPS, "use sync async for an unbounded staleness")
    if s.sync != "allreduce" and s.iterations * s.dp > MAX_PS_STEPS:
        _refuse("iterations", f"iterations x dp ({s.iterations} x {s.dp})", s.iterations * s.dp, MAX_PS_STEPS)
    if full and s.dp * s.tp * s.pp > MAX_FULL_DEVICES:
        _refuse("dp", "devices simulated one by one (--full)", s.dp * s.tp * s.pp, MAX_FULL_DEVICES,
                "drop --full: identical replicas are simulated once")
    return s
