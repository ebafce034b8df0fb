"""Reading nccl-tests output (`all_reduce_perf` and friends) as a measured collective table.

Format [doc: NVIDIA/nccl-tests README and doc/PERFORMANCE.md]: comment lines start with ``#``; the
column header is the comment line naming ``size``, ``count`` and ``time``; the first time/algbw/
busbw group is out-of-place, the second in-place; times are in microseconds and bandwidths in
GB/s; every rank prints a ``#  Rank N ...`` line under ``# Using devices``. Older versions have no
``root`` column; `#wrong` may read ``N/A``.

This module also holds the import into dlsim's measured collective table; it needs no GPU and no
NCCL. Measuring with NCCL itself is `dlsim calibrate comm --backend nccl` (torch.distributed, one
process per GPU, `comm_worker_gloo` with the nccl backend).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dlsim.errors import TableLookupError

_OPS = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reduce-scatter",
        "broadcast": "broadcast", "reduce": "reduce", "alltoall": "all-to-all", "sendrecv": "send-recv"}


@dataclass(frozen=True)
class NcclRow:
    size_bytes: int
    count: int
    dtype: str
    variant: str           # out-of-place or in-place
    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float


@dataclass(frozen=True)
class NcclTable:
    ranks: int
    rows: tuple[NcclRow, ...]
    iterations: int
    devices: tuple[str, ...] = field(default_factory=tuple)
    collective: str | None = None

    @property
    def nodes(self) -> int | None:
        """Distinct hosts of the ``Rank N Pid P on HOST device D`` lines, None when they do not say."""
        hosts = {m.group(1) for d in self.devices if (m := re.search(r"\bon\s+(\S+)\s+device\b", d))}
        return len(hosts) or None


def collective_from_name(name: str) -> str | None:
    """``all_reduce_perf`` (or a file named after it) -> ``allreduce``."""
    for key, value in sorted(_OPS.items(), key=lambda kv: -len(kv[0])):
        if key in name:
            return value
    return None


def parse_nccl_tests(text: str, source: str = "nccl-tests output") -> NcclTable:
    """Parse the whole output; raises TableLookupError naming the line on anything unreadable."""
    header: list[str] | None = None
    rows: list[NcclRow] = []
    devices: list[str] = []
    iterations = 0
    collective = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            body = stripped.lstrip("#").strip()
            if re.match(r"Rank\s+\d+", body):
                devices.append(body)
            m = re.search(r"(?<![\w ])iters:\s*(\d+)|(?<!warmup )(?<!agg )\biters:\s*(\d+)", body)
            if m:
                iterations = int(m.group(1) or m.group(2))
            tokens = body.split()
            if "size" in tokens and "count" in tokens and "time" in tokens:
                header = tokens
            if collective is None:
                collective = collective_from_name(body)
            continue
        if header is None:
            if collective is None:
                collective = collective_from_name(stripped)
            continue
        parts = stripped.split()
        if len(parts) != len(header) or not parts[0].isdigit():
            continue
        times = [i for i, h in enumerate(header) if h == "time"]
        try:
            for variant, at in zip(("out-of-place", "in-place"), times):
                rows.append(NcclRow(int(parts[header.index("size")]), int(parts[header.index("count")]),
                                    parts[header.index("type")] if "type" in header else "",
                                    variant, float(parts[at]) * 1e-6, float(parts[at + 1]) * 1e9,
                                    float(parts[at + 2]) * 1e9))
        except (ValueError, IndexError):
            raise TableLookupError(f"{source}: line {number}: cannot read {stripped[:60]!r}") from None
    if not rows:
        raise TableLookupError(f"{source}: no nccl-tests result rows found (expected a '# size count ... time' "
                               "header followed by numeric rows)")
    return NcclTable(len(devices) or 1, tuple(rows), iterations, tuple(devices), collective)


def import_rows(table: NcclTable, source: str, hosts: str = "nccl-tests", collective: str | None = None) -> list[dict]:
    """Rows for `comm_measure.COLLECTIVE_TABLE` (one per size and variant), source ``nccl-tests:FILE``.

    nccl-tests reports one time per size (the average over its iterations); it is written as the
    median, min and max of the row, with `reps` = the iteration count. With the default `hosts`
    label and the output's device lines naming their hosts, `hosts` records how many nodes the
    ranks spanned (``"2 nodes"``), so that the table prices only groups laid out the same way
    (`dlsim.cost.collectives.measured`).
    """
    if hosts == "nccl-tests" and table.nodes:
        hosts = f"{table.nodes} node" + ("s" if table.nodes > 1 else "")
    name = collective or table.collective
    if name is None:
        raise TableLookupError(f"{source}: cannot tell which collective this is; name the file after the test "
                               "(all_reduce_perf.txt) or give the collective")
    out = []
    for r in table.rows:
        t = repr(r.time_s)
        out.append({"backend": "nccl-tests", "hosts": hosts, "collective": name, "algorithm": "default",
                    "setting": r.dtype, "ranks": str(table.ranks), "size_bytes": str(r.size_bytes),
                    "reps": str(table.iterations or 1), "median_s": t, "min_s": t, "max_s": t,
                    "busbw_bytes_per_s": repr(r.busbw_bytes_per_s), "variant": r.variant,
                    "source": f"nccl-tests:{source}"})
    return out
