"""Data parallelism: without overlap = compute + all-reduce; with overlap between max and sum;
wait-free backpropagation timeline by hand; buckets as PyTorch DDP builds them."""

import pytest

from dlsim.api.simulate import simulate
from dlsim.plan.comm import Layout
from dlsim.plan.commcost import ClusterPricer
from dlsim.plan.dataparallel import make_buckets
from dlsim.io.profile_yaml import load_profile
from dlsim.units import MIB
from simkit import RingPricer, chain, run_uniform

CLUSTER = "dgx-h100"


@pytest.fixture(scope="module")
def model():
    return chain(8, 1024)


def _allreduce(nbytes, dp):
    pricer = ClusterPricer(load_profile(CLUSTER), Layout(dp, 1, 1, 8))
    return pricer.collective("allreduce", nbytes, list(range(dp))).seconds


def test_no_overlap_one_bucket_is_compute_plus_allreduce(model):
    single = simulate(model, CLUSTER, dp=1, microbatch_size=16)
    r = simulate(model, CLUSTER, dp=4, microbatch_size=16, overlap=False, bucket_size=1e12, first_bucket_size=1e12)
    assert r.iteration_time_s == pytest.approx(single.iteration_time_s + _allreduce(model.params * 4, 4), rel=1e-12)
    assert r.breakdown.exposed_comm == pytest.approx(_allreduce(model.params * 4, 4), rel=1e-9)


def test_no_overlap_buckets_run_one_after_another(model):
    single = simulate(model, CLUSTER, dp=1, microbatch_size=16)
    r = simulate(model, CLUSTER, dp=4, microbatch_size=16, overlap=False)
    per_layer = [(i, layer.params * 4) for i, layer in enumerate(model.layers)]
    buckets = make_buckets(per_layer, 25 * MIB, 1 * MIB)
    assert len(buckets) > 1
    total = sum(_allreduce(b.nbytes, 4) for b in buckets)
    assert r.iteration_time_s == pytest.approx(single.iteration_time_s + total, rel=1e-12)


def test_overlap_lies_between_max_and_sum(model):
    single = simulate(model, CLUSTER, dp=1, microbatch_size=16)
    no = simulate(model, CLUSTER, dp=4, microbatch_size=16, overlap=False)
    yes = simulate(model, CLUSTER, dp=4, microbatch_size=16, overlap=True)
    comm = no.iteration_time_s - single.iteration_time_s
    assert max(single.iteration_time_s, comm) <= yes.iteration_time_s <= single.iteration_time_s + comm + 1e-15
    assert yes.iteration_time_s < no.iteration_time_s
    assert yes.communication_s == pytest.approx(comm, rel=1e-9)


@pytest.mark.parametrize("a", [0.5, 3.0])
def test_wait_free_backprop_by_hand(a):
    """4 equal layers (f forward, b backward each), one bucket each, all-reduce time a per bucket on
    one stream (reference/algorithms.md §5.3): bucket k is ready at 4f + (k+1)b and starts at
    max(ready_k, finish_{k−1}), so T = 4f + max(4b, b + 3a) + a."""
    f, b = 0.25, 0.5
    pricer = RingPricer(alpha=a / 6, beta=0.0)  # ring all-reduce on 4 ranks: 2·3 steps of α
    graph, tl, _ = run_uniform("1f1b", 1, 1, layers_per_chunk=4, t_f=4 * f, t_b=4 * b, pricer=pricer, dp=4,
                               params=1, bucket_size=1.0, first_bucket_size=1.0)
    assert tl.makespan == pytest.approx(4 * f + max(4 * b, b + 3 * a) + a, rel=1e-12)


def test_ddp_buckets():
    """DDP: parameters in forward order, first bucket capped at 1 MiB, the rest at 25 MiB, list reversed."""
    sizes = [(0, 0.6 * MIB), (1, 0.6 * MIB), (2, 10 * MIB), (3, 20 * MIB), (4, 30 * MIB), (5, 0.0), (6, 1 * MIB)]
    buckets = make_buckets(sizes, 25 * MIB, 1 * MIB)
    assert [b.layers for b in buckets] == [(6,), (4,), (2, 3), (0, 1)]
    assert [b.ready_after for b in buckets] == [6, 4, 2, 0]
