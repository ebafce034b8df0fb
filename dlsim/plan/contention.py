"""Contention on a shared network: how much a collective or a transfer is slowed by the flows that run
beside it, as a closed form the pricer (`dlsim.plan.commcost`) applies to the inter-node tier.

The concurrent copies of a call are those of the symmetric strategy: every group of the same shape
in the same pipeline stage runs the same collective at the same time (the data-parallel groups of
all tensor-parallel ranks, the tensor-parallel groups of all replicas), and every position of a
stage sends its pipeline transfer at once. They are found by tiling the stage's block of ranks
with translates of the group (`copies`). Calls of different kinds or stages that happen to overlap
in time are not seen here; the event simulation with `--expand-collectives` runs every message
as a flow on the network's links and shows them (`dlsim.sim.engine`).

For each traffic pattern of the algorithm (`dlsim.cost.collectives.traffic`) the flows of all
copies get max-min fair rates on the network's shared links (`dlsim.cost.fairshare`), and the
pattern's slowdown is s = max_f c_f / r_f, c_f the flow's rate alone:

    device flow (member to member):  c = B_dev / k     (k: inter-node flows its sender or receiver
                                                          has in the pattern, sharing its port)
    node flow (ring or tree across nodes):  c = B_node / g = min(g·B_dev, B_intra) / g for each of
                                            the g members' NICs of the node (NCCL's channels)

The collective's inter-node bandwidth term is multiplied by S = Σ w·s / Σ w (exact for lock-step and
pipelined algorithms with Hockney or LogGP steps; `dlsim.cost.collectives.traffic`). A transfer's
is multiplied by the slowdown of its copies' flows.
"""

from __future__ import annotations

from typing import Callable, Sequence

from dlsim.cost.collectives.traffic import Pattern
from dlsim.cost.fabric import FabricLinks
from dlsim.cost.fairshare import slowdown
from dlsim.plan.comm import Layout
from dlsim.spec.cluster import Cluster


class Contention:
    """Slowdowns on `cluster`'s inter-node network for the groups of `layout` (module doc)."""

    def __init__(self, cluster: Cluster, layout: Layout):
        self.cluster, self.layout = cluster, layout
        inter = cluster.inter
        self.net = FabricLinks(inter.fabric, cluster.nodes, cluster.devices_per_node, inter.effective_bandwidth) \
            if inter is not None and inter.fabric.shared else None
        self.port = inter.effective_bandwidth if inter is not None else 0.0
        self.intra = cluster.intra.effective_bandwidth
        self._copies: dict[tuple[int, ...], list[list[int]]] = {}
        self._factors: dict[tuple, tuple[float, str]] = {}

    @property
    def active(self) -> bool:
        return self.net is not None

    def copies(self, ranks: Sequence[int]) -> list[list[int]]:
        """The group and its concurrent copies: translates of it tiling its pipeline stage's ranks (the
        group alone when it spans stages or its translates do not tile the stage)."""
        key = tuple(ranks)
        hit = self._copies.get(key)
        if hit is None:
            hit = self._copies[key] = self._tile(list(ranks))
        return hit

    def _tile(self, ranks: list[int]) -> list[list[int]]:
        lay = self.layout
        block = lay.tp * lay.cp * lay.dp
        lo = ranks[0] // block * block
        hi = lo + block
        if any(not lo <= r < hi for r in ranks):
            return [ranks]
        base, covered, out = min(ranks), set(), []
        for r in range(lo, hi):
            if r in covered:
                continue
            shifted = [x + r - base for x in ranks]
            if any(not lo <= x < hi or x in covered for x in shifted):
                return [ranks]
            covered.update(shifted)
            out.append(shifted)
        return out

    def _where(self, rank: int) -> tuple[int, int]:
        per = self.cluster.devices_per_node
        return rank // per, rank % per

    def _flows(self, pattern: Pattern, groups: list[list[int]]) -> tuple[list[tuple[int, ...]], list[float]]:
        paths: list[tuple[int, ...]] = []
        caps: list[float] = []
        net = self.net
        for group in groups:
            pairs = [(group[a], group[b]) for a, b in pattern.pairs]
            pairs = [(x, y) for x, y in pairs if self._where(x)[0] != self._where(y)[0]]
            if pattern.node:
                for x, y in pairs:
                    mine = [r for r in group if self._where(r)[0] == self._where(x)[0]]
                    theirs = [r for r in group if self._where(r)[0] == self._where(y)[0]]
                    g = min(len(mine), len(theirs))
                    cap = min(g * self.port, self.intra) / g
                    for a, b in zip(mine[:g], theirs[:g]):
                        paths.append(net.route(*self._where(a), *self._where(b)))
                        caps.append(cap)
                continue
            out: dict[int, int] = {}
            into: dict[int, int] = {}
            for x, y in pairs:
                out[x] = out.get(x, 0) + 1
                into[y] = into.get(y, 0) + 1
            for x, y in pairs:
                paths.append(net.route(*self._where(x), *self._where(y)))
                caps.append(self.port / max(out[x], into[y]))
        return paths, caps

    def _slowdown(self, paths, caps) -> float:
        if not any(paths):
            return 1.0
        return slowdown(paths, caps, [link.capacity for link in self.net.links])

    def collective(self, key: tuple, ranks: Sequence[int], patterns: Callable[[], list[Pattern] | None]) -> tuple[float, str]:
        """(S, note) for a collective over `ranks` whose traffic `patterns()` gives; S = 1 where nothing
        is shared, and the note says when the patterns are unknown (S = 1 then too)."""
        key = key + tuple(ranks)
        hit = self._factors.get(key)
        if hit is not None:
            return hit
        groups = self.copies(ranks)
        pats = patterns()
        if pats is None:
            hit = (1.0, f"contention on the {self.net.fabric.describe()} not priced for this algorithm "
                        "(--expand-collectives simulates it)")
        else:
            total = weighted = 0.0
            for pt in pats:
                paths, caps = self._flows(pt, groups)
                s = self._slowdown(paths, caps)
                total += pt.weight
                weighted += pt.weight * s
            factor = weighted / total if total > 0 else 1.0
            hit = (factor, self._note(factor, len(groups)))
        self._factors[key] = hit
        return hit

    def p2p(self, src: int, dst: int) -> tuple[float, str]:
        """(slowdown, note) of a transfer from `src` to `dst` sent at once by every position of its stage."""
        key = ("p2p", src, dst)
        hit = self._factors.get(key)
        if hit is None:
            lay = self.layout
            block = lay.tp * lay.cp * lay.dp
            lo = src // block * block
            paths, caps = [], []
            for shift in range(lo - src, lo + block - src):
                a, b = src + shift, dst + shift
                if 0 <= b < self.cluster.num_devices and self._where(a)[0] != self._where(b)[0]:
                    paths.append(self.net.route(*self._where(a), *self._where(b)))
                    caps.append(self.port)
            factor = self._slowdown(paths, caps)
            hit = self._factors[key] = (factor, self._note(factor, len(paths)).replace("copies", "transfers"))
        return hit

    def _note(self, factor: float, copies: int) -> str:
        if factor <= 1.0:
            return ""
        who = "its flows share" if copies == 1 else f"{copies} concurrent copies share"
        return f"x{factor:.3g} bandwidth time: {who} the {self.net.fabric.describe()}"
