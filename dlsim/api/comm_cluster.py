"""`dlsim comm` on a profile priced as `dlsim simulate` prices: through the simulator's pricer.

A group of `ranks` ranks on a profile is laid out as NCCL and MPI lay ranks out, node-contiguous,
g = ranks_per_node per node (default: a whole node's devices), the cluster resized when the profile
lists too few nodes. Each algorithm's time then comes from `dlsim.plan.commcost.ClusterPricer`, the
one the simulation uses: the profile's measured collective table first (``comm_collectives.csv``,
from `dlsim calibrate comm` or imported nccl-tests output; measured, or interpolated in size), the
model otherwise, with the network's contention (`dlsim.plan.contention`). With ``auto`` it prices
the rows of the library's own choice (``default``) as the simulator's ``collective: auto`` does; a
named algorithm prices that algorithm's rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dlsim.api.simulate import comm_table
from dlsim.plan.comm import Layout
from dlsim.plan.commcost import OP_NAMES, ClusterPricer
from dlsim.results import Estimate
from dlsim.spec.cluster import Cluster

_OPS = {name: op for op, name in OP_NAMES.items()}   # collective name -> the pricer's operation


@dataclass(frozen=True)
class ClusterGroup:
    """A group of ranks on a profile (module doc) and the measured table the simulator would read."""

    cluster: Cluster
    layout: Layout
    ranks: tuple[int, ...]
    table: object

    @classmethod
    def of(cls, cluster: Cluster, ranks: int, per_node: int) -> "ClusterGroup":
        dpn = cluster.devices_per_node
        g = max(1, min(per_node, dpn))
        nodes = -(-ranks // g)
        if nodes > cluster.nodes:
            cluster = replace(cluster, nodes=nodes)
        group = tuple(node * dpn + i for node in range(nodes) for i in range(g))[:ranks]
        return cls(cluster, Layout(ranks, 1, 1, dpn), group, comm_table(cluster))

    @property
    def measured(self) -> bool:
        return self.table is not None

    def priced(self, collective: str) -> bool:
        """Whether the simulator prices this collective (its pricer's operations)."""
        return collective in _OPS

    def time(self, collective: str, algorithm: str, nbytes: float) -> Estimate | None:
        """The simulator's price of `collective` with `algorithm` (a name or auto) on this group; None
        where the simulator would not run that algorithm here (it runs auto instead, e.g. a
        hierarchical allreduce inside one node)."""
        pricer = ClusterPricer(self.cluster, self.layout, algorithm, self.table)
        if pricer.runs(_OPS[collective], list(self.ranks)) != algorithm:
            return None
        return pricer.collective(_OPS[collective], nbytes, list(self.ranks))
