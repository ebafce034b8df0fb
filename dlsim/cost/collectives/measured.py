"""Measured collective times (a profile's ``comm_collectives.csv``) as prices, with provenance.

The table holds one median time per (collective, algorithm, ranks, size), from `dlsim calibrate
comm` or imported nccl-tests output (`dlsim calibrate comm --import-nccl-tests`). Sizes follow
nccl-tests, as `collective_time` does: the vector per rank (allreduce, reduce, broadcast), the
gathered output (allgather), the input per rank (reduce-scatter).

Lookup for (collective, ranks, n bytes), among the rows of the algorithm asked for (``default``,
the library's own choice, when the strategy leaves the algorithm to auto):

* a measured size → the median, **measured**;
* between two measured sizes s_0 < n < s_1 → log t linear in log s (for a bandwidth-bound
  collective t ∝ s, for a latency-bound one t constant; both are straight in log-log),
  **interpolated**;
* another rank count, or n outside [s_min, s_max] → None: the caller prices the model and says so
  in its note (`dlsim.plan.commcost.ClusterPricer`); a measured curve is never stretched silently.

A reduce-scatter or all-gather without rows of its own is priced from measured all-reduce rows of
the same buffer size and layout: half their time, since an all-reduce is a reduce-scatter followed
by an all-gather of the same buffer (Rabenseifner 2004; NCCL's ring all-reduce runs the two phases
back to back), each moving (p−1)/p of the buffer through every rank; **interpolated**, with a note.

A row measured on a known number of nodes (its `hosts` label reads ``"N nodes"``, as imported
nccl-tests tables say from their ``Rank ... on HOST`` lines) prices only groups spanning that many
nodes: eight ranks inside one DGX are not eight ranks on eight nodes. Rows without a node count
price any group of their rank count.

Where one table holds several sources for the same points, nccl-tests rows come first, then NCCL,
then the others (MPI, gloo), and out-of-place rows before in-place ones.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass
from typing import Iterable

from dlsim.results import Estimate, Source

_BACKEND_ORDER = {"nccl-tests": 0, "nccl": 1}
_VARIANT_ORDER = {"out-of-place": 0, "": 0, "in-place": 1}


@dataclass(frozen=True)
class CollectiveRow:
    """One measured point: `seconds` is the median over repetitions."""

    collective: str
    algorithm: str
    ranks: int
    size_bytes: float
    seconds: float
    backend: str = ""
    hosts: str = ""
    variant: str = ""
    source: str = ""

    @property
    def nodes(self) -> int | None:
        """Nodes the measured ranks spanned, when the `hosts` label says (``"2 nodes"``)."""
        m = _NODES.match(self.hosts)
        return int(m.group(1)) if m else None


_NODES = re.compile(r"^(\d+) nodes?$")
_HALF_ALLREDUCE = ("reduce-scatter", "allgather")


class MeasuredCollectives:
    """Lookup over measured collective rows (module doc)."""

    def __init__(self, rows: Iterable[CollectiveRow], name: str = "comm_collectives.csv"):
        self.name = name
        best: dict[tuple[str, str, int, int | None, float], tuple[tuple[int, int], CollectiveRow]] = {}
        for r in rows:
            if not (r.seconds > 0 and math.isfinite(r.seconds) and r.size_bytes > 0):
                continue
            key = (r.collective, r.algorithm, r.ranks, r.nodes, float(r.size_bytes))
            rank = (_BACKEND_ORDER.get(r.backend, 2), _VARIANT_ORDER.get(r.variant, 1))
            if key not in best or rank < best[key][0]:
                best[key] = (rank, r)
        curves: dict[tuple[str, str, int, int | None], list[CollectiveRow]] = {}
        for (c, a, p, n, _), (_, r) in best.items():
            curves.setdefault((c, a, p, n), []).append(r)
        self.curves = {k: sorted(v, key=lambda r: r.size_bytes) for k, v in curves.items()}

    def _curve(self, collective: str, algorithm: str, ranks: int, nodes: int | None) -> list[CollectiveRow]:
        """The rows measured on `nodes` nodes, else those whose node count is not known."""
        return self.curves.get((collective, algorithm, ranks, nodes)) or \
            self.curves.get((collective, algorithm, ranks, None), [])

    def __bool__(self) -> bool:
        return bool(self.curves)

    def sizes(self, collective: str, ranks: int, algorithm: str = "default",
              nodes: int | None = None) -> tuple[float, ...]:
        curve = self._curve(collective, algorithm, ranks, nodes)
        if not curve and collective in _HALF_ALLREDUCE:
            curve = self._curve("allreduce", algorithm, ranks, nodes)
        return tuple(r.size_bytes for r in curve)

    def lookup(self, collective: str, ranks: int, nbytes: float, algorithm: str = "default",
               nodes: int | None = None) -> Estimate | None:
        """The measured or interpolated time, or None outside the table (module doc); `nodes`: how
        many nodes the group spans."""
        if not self._curve(collective, algorithm, ranks, nodes) and collective in _HALF_ALLREDUCE:
            whole = self._lookup("allreduce", ranks, nbytes, algorithm, nodes)
            if whole is None:
                return None
            return Estimate(whole.seconds / 2, Source.INTERPOLATED,
                            f"{collective} = half the all-reduce of the same buffer; {whole.note}")
        return self._lookup(collective, ranks, nbytes, algorithm, nodes)

    def _lookup(self, collective: str, ranks: int, nbytes: float, algorithm: str,
                nodes: int | None) -> Estimate | None:
        curve = self._curve(collective, algorithm, ranks, nodes)
        if not curve or nbytes <= 0:
            return None
        sizes = [r.size_bytes for r in curve]
        i = bisect.bisect_left(sizes, nbytes)
        if i < len(sizes) and sizes[i] == nbytes:
            r = curve[i]
            return Estimate(r.seconds, Source.MEASURED, f"{collective} on {ranks} ranks measured ({self._src(r)})")
        if i == 0 or i == len(sizes):
            return None
        lo, hi = curve[i - 1], curve[i]
        w = math.log(nbytes / lo.size_bytes) / math.log(hi.size_bytes / lo.size_bytes)
        t = math.exp((1 - w) * math.log(lo.seconds) + w * math.log(hi.seconds))
        return Estimate(t, Source.INTERPOLATED, f"{collective} on {ranks} ranks interpolated between "
                        f"{lo.size_bytes:.0f} and {hi.size_bytes:.0f} B ({self._src(lo)})")

    def _src(self, r: CollectiveRow) -> str:
        return f"{self.name}, {r.source or r.backend}"

    def describe_range(self, collective: str, ranks: int, algorithm: str = "default", nodes: int | None = None) -> str:
        """Why a lookup missed, for the model's note."""
        sizes = self.sizes(collective, ranks, algorithm, nodes)
        if not sizes:
            have = sorted({p for (c, a, p, _) in self.curves if c == collective and a == algorithm})
            return (f"no measured {collective} on {ranks} ranks in {self.name}"
                    + (f" (measured: {', '.join(map(str, have))} ranks)" if have else ""))
        return f"outside the measured sizes {sizes[0]:.0f}-{sizes[-1]:.0f} B of {collective} on {ranks} ranks"
