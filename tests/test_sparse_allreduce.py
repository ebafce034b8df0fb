"""SparCML's sparse allreduce (Renggli et al. SC'19; dlsim.cost.collectives.sparse): closed forms by
hand, against their schedules' replay and the lower bound; top-k gradient compression in the
simulation never slower than the dense all-reduce by more than its selection and scatter kernels."""

from __future__ import annotations

import math

import pytest

from dlsim.api.comm import comm
from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import run_simulation, simulate
from dlsim.cost.collectives import collective_time, expand_schedule, lower_bound, make_costs, replay_steps
from dlsim.cost.collectives.sparse import fill_in
from dlsim.plan.compression import plan_sync
from dlsim.spec.cluster import LinkTier
from dlsim.spec.strategy import Compression

ALPHA, BW = 5e-6, 10e9
LINK = LinkTier("test", latency=ALPHA, bandwidth=BW)  # Hockney: T(s) = α + s/B
ALGOS = ("ssar-recursive-doubling", "ssar-split-allgather", "dsar-split-allgather", "dense-fallback")


def _t(s: float) -> float:
    return ALPHA + s / BW


def test_fill_in_is_the_expected_union_of_uniform_supports():
    assert fill_in(0.01, 1, 1000) == pytest.approx(10)
    assert fill_in(0.01, 2, 1000) == pytest.approx(1000 * (1 - 0.99 ** 2))  # 19.9: two supports overlap a little
    assert fill_in(1.0, 5, 1000) == 1000 and fill_in(0.5, 64, 1000) == pytest.approx(1000)


def test_closed_forms_by_hand():
    """p = 8, N = 10^6 fp32 elements (n = 4 MB), ρ = 1%: items of c = 8 bytes, k = 10^4."""
    n, p, rho, N, c = 4e6, 8, 0.01, 1e6, 8
    K = lambda m: N * (1 - (1 - rho) ** m)  # noqa: E731
    rd = sum(_t(c * K(2 ** (j - 1))) for j in (1, 2, 3))
    assert collective_time("sparse-allreduce", "ssar-recursive-doubling", n, p, LINK, density=rho).seconds == \
        pytest.approx(rd, rel=1e-12)
    split = (p - 1) * _t(c * N * rho / p) + (p - 1) * _t(c * K(p) / p)
    for algo in ("ssar-split-allgather", "dsar-split-allgather"):
        assert collective_time("sparse-allreduce", algo, n, p, LINK, density=rho).seconds == pytest.approx(split)
    # above the switch (ρ > 1/2 for 8-byte items of 4-byte values) DSAR is the dense ring allreduce
    dense_ring = collective_time("allreduce", "ring", n, p, LINK).seconds
    assert collective_time("sparse-allreduce", "dsar-split-allgather", n, p, LINK, density=0.7).seconds == \
        pytest.approx(dense_ring)
    assert collective_time("sparse-allreduce", "ssar-split-allgather", n, p, LINK, density=0.7).seconds > dense_ring
    best_dense = collective_time("allreduce", "auto", n, p, LINK).seconds
    assert collective_time("sparse-allreduce", "dense-fallback", n, p, LINK, density=0.7).seconds == \
        pytest.approx(best_dense)


@pytest.mark.parametrize("p", [8, 12])
@pytest.mark.parametrize("rho", [0.002, 0.3, 0.9])
def test_closed_forms_equal_their_schedules(p, rho):
    link = as_cluster("piz-daint").inter
    costs = make_costs(link)
    for algo in ALGOS:
        sched = expand_schedule("sparse-allreduce", algo, 8e6, p, link=link, density=rho)
        closed = collective_time("sparse-allreduce", algo, 8e6, p, link, density=rho).seconds
        assert replay_steps(sched, costs) == pytest.approx(closed, rel=1e-9)


def test_auto_is_latency_optimal_small_bandwidth_optimal_large_and_never_above_dense():
    small = comm("sparse-allreduce", "64KB", 16, cluster="piz-daint", density=0.01)
    large = comm("sparse-allreduce", "1GB", 16, cluster="piz-daint", density=0.01)
    assert small.best == "ssar-recursive-doubling" and large.best in ("ssar-split-allgather", "dsar-split-allgather")
    link = as_cluster("piz-daint").inter
    for rho in (0.001, 0.01, 0.1, 0.4, 0.6, 1.0):
        for n in (1e3, 1e6, 1e9):
            auto = collective_time("sparse-allreduce", "auto", n, 16, link, density=rho).seconds
            assert auto <= collective_time("allreduce", "auto", n, 16, link).seconds * (1 + 1e-12)
            bound = lower_bound("sparse-allreduce", n, 16, link, density=rho)
            assert all(collective_time("sparse-allreduce", a, n, 16, link, density=rho).seconds >= bound
                       for a in ALGOS)


def test_topk_is_never_slower_than_dense_by_more_than_its_kernels():
    """At every density the iteration with top-k costs at most the dense one plus the selection and
    scatter kernels (the switch's cost); far below the switch it is much faster. Exchange after the
    backward pass, so that the difference is the synchronisation's alone."""
    kw = dict(dp=16, microbatch_size=32, overlap=False, stack="eager")
    dense = simulate("alexnet", "piz-daint", **kw)
    for rho in (0.001, 0.01, 0.1, 0.5, 0.9, 1.0):
        run = run_simulation("alexnet", "piz-daint", compression=Compression("topk", density=rho, error_feedback=False),
                             trace=True, **kw)
        kernels = sum(e["dur"] for e in run.trace["traceEvents"] if e.get("ph") == "X"
                      and e["name"].startswith(("compress", "decompress"))) * 1e-6
        assert kernels > 0
        assert run.result.iteration_time_s <= dense.iteration_time_s + kernels + 1e-9
        assert run.result.feasible
        assert run.result.devices[0].memory["comm_buffers"] <= 2 * 4 * 61.2e6
    fast = simulate("alexnet", "piz-daint", compression=Compression("topk", density=0.001), **kw)
    assert fast.iteration_time_s < 0.5 * dense.iteration_time_s


def test_simulated_exchange_is_the_closed_form():
    """One bucket (a bucket larger than the model), no overlap: the gradient sync task lasts the
    sparse allreduce's closed form over the bucket's bytes."""
    kw = dict(dp=8, microbatch_size=8, overlap=False, stack="eager", bucket_size=2 ** 40, first_bucket_size=2 ** 40)
    comp = Compression("topk", density=0.02, error_feedback=False)
    run = run_simulation("alexnet", "piz-daint", compression=comp, trace=True, **kw)
    (sync,) = [e for e in run.trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "comm"
               and e["args"].get("op") == "sparse_allreduce (density 0.02)" and "bucket0" in e["name"]]
    nbytes = 4 * as_model("alexnet").params
    cluster = as_cluster("piz-daint")
    expected = collective_time("sparse-allreduce", "auto", nbytes, 8, cluster.intra if cluster.inter is None
                               else cluster.inter, gamma=1 / cluster.reduce_bandwidth, density=0.02).seconds
    assert sync["dur"] * 1e-6 == pytest.approx(expected, rel=1e-6)
    assert plan_sync(comp, nbytes, 4, 8).payload == 8 * math.ceil(0.02 * nbytes / 4)
