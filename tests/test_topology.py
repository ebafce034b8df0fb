"""Networks with shared links (issue 32 item 3): fat-tree with oversubscribed levels, rail-optimised,
torus and dragonfly profiles as data; concurrent flows share a link max-min fairly; a collective's
price on a topology held to its closed form, in the pricer and in the event simulation.

The contention case: 4 nodes of 2 devices, leaf switches of 2 nodes, dp = 4 × tp = 2. The two
data-parallel rings (one per tensor-parallel rank, one member per node) each cross from leaf 0 to
leaf 1 and back once per step, so both cross each leaf's uplink at once. With oversubscription o a
leaf's uplink carries 2 nodes × 2 devices × B / o: at o = 2 that is 2B (both flows at B, no
contention), at o = 4 it is B, so each flow gets B/2 and every ring step's bandwidth term doubles:

    ring allreduce = 2(p − 1)·(α + (n/p)·f/B),   f = 1 (o ≤ 2), 2 (o = 4)     (Hockney, γ = 0)
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlsim.api.simulate import simulate
from dlsim.cost.fabric import FabricLinks
from dlsim.cost.fairshare import fair_rates, slowdown
from dlsim.io.profile_yaml import load_profile
from dlsim.plan.comm import Layout
from dlsim.plan.commcost import ClusterPricer
from dlsim.sim.engine import execute
from dlsim.spec.cluster import LinkTier
from dlsim.spec.network import Fabric, TreeLevel
from simkit import captured_graph

B = 1e9          # bytes/s per device on the inter-node tier
ALPHA = 2e-6     # its latency (o = g = 0: Hockney)


def _cluster(fabric: Fabric, nodes: int = 4, per_node: int = 2):
    base = load_profile("cpu-cluster")
    inter = LinkTier("ib", latency=ALPHA, bandwidth=B, topology=fabric.kind, fabric=fabric)
    intra = LinkTier("upi", latency=1e-6, bandwidth=20e9)
    return replace(base, nodes=nodes, devices_per_node=per_node, inter=inter, intra=intra, reduce_bandwidth=0.0)


def _tree(oversubscription: float, fanout: int = 2, kind: str = "fat-tree") -> Fabric:
    return Fabric(kind, levels=(TreeLevel(fanout, oversubscription),))


def _ring(n: float, p: int, f: float) -> float:
    return 2 * (p - 1) * (ALPHA + n / p * f / B)


# --- max-min fairness -----------------------------------------------------------------------

def test_progressive_filling_hand_example():
    """Links 0 (capacity 1) and 1 (capacity 3); flow 0 on link 0, flow 1 on both, flow 2 on link 1.
    Link 0 fills first at 1/2 each; flow 2 gets what link 1 has left, 3 − 1/2 = 2.5, or its cap."""
    inf = float("inf")
    assert fair_rates([(0,), (0, 1), (1,)], [inf, inf, inf], [1.0, 3.0]) == [0.5, 0.5, 2.5]
    assert fair_rates([(0,), (0, 1), (1,)], [inf, inf, 2.0], [1.0, 3.0]) == [0.5, 0.5, 2.0]
    # caps below the fair share: every flow at its cap, nothing slowed; a flow on no link keeps its cap
    assert fair_rates([(0,), (0,), ()], [0.25, 0.5, 7.0], [1.0]) == [0.25, 0.5, 7.0]
    assert slowdown([(0,), (0,)], [1.0, 1.0], [1.0]) == 2.0


# --- routes and capacities ------------------------------------------------------------------

def test_fat_tree_links_and_routes():
    """Frontera (cpu-cluster): leaves of 44 nodes at 22:18; a leaf's uplink carries 44 × 2 sockets ×
    B_dev / (22/18) each way; nodes under one leaf share nothing."""
    c = load_profile("cpu-cluster")
    net = FabricLinks(c.inter.fabric, 100, 2, c.inter.effective_bandwidth)
    assert net.route(0, 0, 43, 1) == ()
    path = net.route(0, 1, 44, 0)
    assert [net.links[i].name for i in path] == ["L1 switch 0 up", "L1 switch 1 down"]
    assert net.links[path[0]].capacity == pytest.approx(44 * 2 * 50e9 / 8 / 1.2222)
    # a non-blocking fat-tree has no shared link: it prices as one switch
    assert not Fabric("fat-tree", levels=(TreeLevel(44, 1.0),)).shared
    assert FabricLinks(Fabric("fat-tree", levels=(TreeLevel(44, 1.0),)), 100, 2, 1.0).route(0, 0, 99, 0) == ()


def test_rail_optimized_routes_on_the_destination_rail():
    """Rail r of every node of a leaf group on rail r's leaf; a flow travels on its destination
    device's rail (NCCL PXN), so rails never share a link and same-rail traffic inside a leaf group
    crosses no switch uplink."""
    net = FabricLinks(_tree(4.0, kind="rail-optimized"), 4, 2, B)
    assert net.route(0, 1, 1, 1) == ()                       # same leaf group
    a, b = net.route(0, 0, 2, 0), net.route(1, 1, 3, 1)
    assert not set(a) & set(b)                               # rail 0 and rail 1 links are distinct
    assert net.links[a[0]].capacity == pytest.approx(2 * B / 4)   # 2 nodes x one NIC per rail / 4
    assert net.route(0, 0, 2, 1) == net.route(1, 1, 3, 1)   # to device 1: rail 1's links


def test_torus_dimension_order_routes():
    """4 x 3 torus: node (x, y) = x + 4y; dimension order, the shorter way round (upwards on a tie)."""
    net = FabricLinks(Fabric("torus", dims=(4, 3), link_bandwidth=5e9), 12, 1, B)
    assert len(net.route(0, 0, 3, 0)) == 1                   # x: 0 -> 3 is one hop down (wrap)
    assert len(net.route(0, 0, 2, 0)) == 2                   # x: a tie, two hops up
    assert len(net.route(0, 0, 11, 0)) == 2                  # (0,0) -> (3,2): one wrap hop each way
    assert [net.links[i].name for i in net.route(0, 0, 5, 0)] == ["torus node 0 dim0+", "torus node 1 dim1+"]
    assert all(link.capacity == 5e9 for link in net.links)


def test_dragonfly_routes_share_the_groups_global_links():
    """piz-daint's Aries: 4 nodes per router, 96 routers per group, adaptive routing: a group is
    non-blocking inside and a flow between groups crosses its source group's global links out and its
    destination group's in, 96 × 10 optical links of 37.5 Gb/s each way."""
    c = load_profile("piz-daint")
    net = FabricLinks(c.inter.fabric, c.nodes, 1, c.inter.effective_bandwidth)
    assert net.route(0, 0, 383, 0) == ()                     # same group
    out, into = [net.links[i] for i in net.route(0, 0, 384, 0)]
    assert (out.name, into.name) == ("group 0 global links out", "group 1 global links in")
    assert out.capacity == into.capacity == pytest.approx(96 * 10 * 37.5e9 / 8)
    assert net.route(5, 0, 800, 0)[0] == net.route(0, 0, 384, 0)[0]   # all of group 0's outgoing flows


def test_dragonfly_tapered_global_links():
    """Groups of one router of 2 nodes with one global link of B/2: pipeline transfers from group 0's
    two nodes to group 1's share group 0's egress (B/2): 2 flows of B, f = 4."""
    fabric = Fabric("dragonfly", nodes_per_router=2, routers_per_group=1, global_links=1, global_bandwidth=B / 2)
    c = _cluster(fabric, nodes=4, per_node=1)
    pricer = ClusterPricer(c, Layout(dp=2, tp=1, pp=2, devices_per_node=1), "auto")
    model = pricer._p2p["inter"]
    n = 1e6
    assert pricer.p2p(n, 0, 2).seconds == pytest.approx(model.alpha + n / B * 4, rel=1e-12)


# --- closed forms on a topology ---------------------------------------------------------------

@pytest.mark.parametrize("oversub,factor", [(1.0, 1.0), (2.0, 1.0), (4.0, 2.0), (8.0, 4.0)])
def test_ring_allreduce_on_an_oversubscribed_fat_tree(oversub, factor):
    """Two data-parallel rings share each leaf uplink (module doc): the pricer's closed form."""
    c = _cluster(_tree(oversub))
    pricer = ClusterPricer(c, Layout(dp=4, tp=2, pp=1, devices_per_node=2), "ring")
    n = 8e6
    est = pricer.collective("allreduce", n, [0, 2, 4, 6])
    assert est.seconds == pytest.approx(_ring(n, 4, factor), rel=1e-12)
    assert ("concurrent copies" in est.note) == (factor > 1)
    # one ring alone (tp = 1, one device per node used) shares nothing up to oversubscription 4
    alone = ClusterPricer(_cluster(_tree(oversub), per_node=1), Layout(dp=4, tp=1, pp=1, devices_per_node=1), "ring")
    assert alone.collective("allreduce", n, [0, 1, 2, 3]).seconds == pytest.approx(
        _ring(n, 4, max(1.0, oversub / 2)), rel=1e-12)


def test_rail_optimized_keeps_the_rings_apart():
    """The same two rings on a rail-optimised fabric: each rail carries one ring, so a rail leaf's
    uplink (2 nodes × one NIC × B / o) carries one flow: f = max(1, o/2)."""
    c = _cluster(_tree(4.0, kind="rail-optimized"))
    pricer = ClusterPricer(c, Layout(dp=4, tp=2, pp=1, devices_per_node=2), "ring")
    assert pricer.collective("allreduce", 8e6, [1, 3, 5, 7]).seconds == pytest.approx(_ring(8e6, 4, 2.0), rel=1e-12)
    c = _cluster(_tree(2.0, kind="rail-optimized"))
    pricer = ClusterPricer(c, Layout(dp=4, tp=2, pp=1, devices_per_node=2), "ring")
    assert pricer.collective("allreduce", 8e6, [1, 3, 5, 7]).seconds == pytest.approx(_ring(8e6, 4, 1.0), rel=1e-12)


def test_ring_on_a_torus():
    """A ring of 6 nodes along a 1-D torus of links at 0.75·B: every hop one link, one flow per link
    per ring, two rings (tp = 2) on each: f = 2B / 0.75B = 8/3."""
    c = _cluster(Fabric("torus", dims=(6,), link_bandwidth=0.75 * B), nodes=6)
    pricer = ClusterPricer(c, Layout(dp=6, tp=2, pp=1, devices_per_node=2), "ring")
    assert pricer.collective("allreduce", 6e6, [0, 2, 4, 6, 8, 10]).seconds == pytest.approx(
        _ring(6e6, 6, 8 / 3), rel=1e-12)


def test_all_to_all_pattern_load():
    """A linear all-to-all over the 8 ranks of the toy cluster: every rank posts its 7 sends at once;
    6 leave its node and share its port (B/6 each; the 7th goes over the intra-node tier). The 4 ranks
    under leaf 0 send 16 of them across its uplink of 4B/o: the slowdown is (16B/6) / (4B/o) = 2o/3
    once that exceeds 1 (o = 4: 8/3; o = 1.5: none)."""
    from dlsim.cost.collectives.traffic import patterns
    for o, want in ((1.5, 1.0), (4.0, 8 / 3)):
        contention = ClusterPricer(_cluster(_tree(o)), Layout(dp=8, tp=1, pp=1, devices_per_node=2)).contention
        factor, _ = contention.collective(("a2a",), list(range(8)),
                                          lambda: patterns("all-to-all", "linear", 8, 2, None))
        assert factor == pytest.approx(want, rel=1e-12)


def test_pipeline_transfers_feel_the_oversubscription():
    """Frontera (2 sockets per node), dp = 176 × pp = 2 on 176 nodes: each stage fills 88 nodes, two
    leaves of 44. Every position of stage 0 sends to stage 1 at once: 88 flows of B_dev up each leaf,
    whose uplink carries 44 × 2 × B_dev / o, so the transfer's bandwidth term is o times its time
    alone, and 22:18 and 10:1 no longer price alike (issue 32: they did)."""
    base = load_profile("cpu-cluster")
    n = 4e6
    times = {}
    for o in (22 / 18, 10.0):
        fabric = Fabric("fat-tree", levels=(TreeLevel(44, o),))
        c = replace(base, nodes=176, inter=replace(base.inter, fabric=fabric))
        pricer = ClusterPricer(c, Layout(dp=176, tp=1, pp=2, devices_per_node=2), "auto")
        alone = ClusterPricer(replace(c, inter=replace(base.inter, fabric=Fabric())),
                              Layout(dp=176, tp=1, pp=2, devices_per_node=2), "auto").p2p(n, 0, 176).seconds
        times[o] = pricer.p2p(n, 0, 176).seconds
        model = pricer._p2p["inter"]
        assert times[o] == pytest.approx(model.alpha + (alone - model.alpha) * o, rel=1e-9)
    assert times[10.0] > 5 * times[22 / 18]


# --- the event simulation: flows on shared links ---------------------------------------------

KW = dict(dp=4, tp=2, collective="ring", stack="eager", global_batch=8)


def _expanded_graph(monkeypatch, cluster):
    return captured_graph(monkeypatch, "lenet5", cluster, symmetry=False, expand_collectives=True, **KW)


def test_two_data_parallel_groups_on_one_oversubscribed_uplink(monkeypatch):
    """The expanded rings' messages run as flows that share the leaf uplinks: each group's allreduce
    takes exactly the closed form with f = 2 at o = 4 (f = 1 at o = 2), and the symmetric, full and
    expanded simulations agree."""
    for oversub, factor in ((2.0, 1.0), (4.0, 2.0)):
        c = _cluster(_tree(oversub))
        graph = _expanded_graph(monkeypatch, c)
        tl = execute(graph)
        inter = [gid for gid, g in enumerate(graph.groups) if g.messages and any(m.links for m in g.messages)]
        assert len(inter) >= 2 and len(inter) % 2 == 0       # both data-parallel groups, every bucket
        for gid in inter:
            times = tl.message_times[gid]
            span = max(end for _, _, end in times) - min(start for _, start, _ in times)
            n = sum(m.nbytes for m in graph.groups[gid].messages) / (2 * 3)   # 2(p−1) steps of p messages of n/p
            assert span == pytest.approx(_ring(n, 4, factor), rel=1e-9)
        runs = [simulate("lenet5", c, **KW).iteration_time_s,
                simulate("lenet5", c, symmetry=False, **KW).iteration_time_s,
                simulate("lenet5", c, symmetry=False, expand_collectives=True, **KW).iteration_time_s]
        assert runs[0] == runs[1]
        assert runs[2] == pytest.approx(runs[0], rel=1e-9)
        # the same inputs, the same timeline, bit for bit
        assert execute(graph).end == tl.end


def test_contention_slows_the_iteration():
    fast = simulate("lenet5", _cluster(_tree(2.0)), **KW).iteration_time_s
    slow = simulate("lenet5", _cluster(_tree(4.0)), **KW).iteration_time_s
    assert slow > fast
