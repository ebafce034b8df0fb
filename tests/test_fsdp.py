"""FSDP / ZeRO-3 and hybrid sharding: the volume each rank moves, against the closed forms.

Rajbhandari et al. SC'20 §7: ZeRO-3 moves 3Ψ per rank per iteration (all-gather forward and
backward, reduce-scatter) against data parallelism's 2Ψ (all-reduce): 1.5x. Hybrid sharding
(PyTorch FSDP HYBRID_SHARD) keeps the gathers and the reduce-scatter inside a node; only the
all-reduce of each rank's 1/S gradient slice crosses nodes.
"""

from __future__ import annotations

import pytest

from dlsim.api.simulate import simulate
from dlsim.errors import SpecError
from dlsim.plan.comm import INTER, INTRA, Layout
from dlsim.plan.zero import sharded_sync
from dlsim.results import Estimate, Source
from dlsim.spec.strategy import Strategy

TINY = {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn_hidden": 512, "seq_len": 256, "vocab": 1000}
PER_NODE = 8


class VolumePricer:
    """A collective's seconds = the bytes one rank sends (ring forms: all-reduce 2(N−1)/N·B,
    reduce-scatter and all-gather (N−1)/N·B); `tier` selects which tier's traffic is counted."""

    def __init__(self, count: str | None = None):
        self.count = count

    def tier(self, ranks):
        return INTRA if len({r // PER_NODE for r in ranks}) == 1 else INTER

    def collective(self, op, nbytes, ranks):
        n = len(ranks)
        factor = {"allreduce": 2.0, "reduce_scatter": 1.0, "allgather": 1.0}[op] * (n - 1) / n
        counted = self.count is None or self.tier(ranks) == self.count
        return Estimate(factor * nbytes if counted else 0.0, Source.MODEL, "volume")

    def p2p(self, nbytes, src, dst):
        return Estimate(0.0, Source.MODEL, "free")

    def expand(self, op, nbytes, ranks):
        return None


def _run(dp, count=None, **kw):
    r = simulate("llama3-8b", "dgx-h100", dp=dp, tp=1, pp=1, microbatch_size=1, num_microbatches=1, dtype="bf16",
                 measured=False, overrides=TINY, nodes=2, pricer=VolumePricer(count), bucket_size=2**20, stack="eager",
                 **kw)
    return r


def _params():
    from dlsim.api.models import as_model
    return as_model("llama3-8b", TINY).params


@pytest.mark.parametrize("dp", [4, 8])
def test_fsdp_moves_one_and_a_half_times_data_parallel(dp):
    psi = _params() * 2  # bf16 bytes
    ddp = _run(dp).devices[0].communication_s
    fsdp = _run(dp, zero=3).devices[0].communication_s
    assert ddp == pytest.approx(2 * psi * (dp - 1) / dp, rel=1e-9)
    assert fsdp == pytest.approx(1.5 * ddp, rel=1e-9)


def test_hybrid_moves_cross_node_volume_to_replica_groups():
    """dp 16 on two nodes: full sharding sends 3Ψ·15/16 over groups that cross nodes; hybrid
    sharding sends nothing across but the replica all-reduce of Ψ/8 (2·(2−1)/2·Ψ/8 per rank)."""
    psi = _params() * 2
    full_inter = _run(16, INTER, zero=3).devices[0].communication_s
    hybrid_inter = _run(16, INTER, zero=3, hybrid_shard=True).devices[0].communication_s
    hybrid_intra = _run(16, INTRA, zero=3, hybrid_shard=True).devices[0].communication_s
    assert full_inter == pytest.approx(3 * psi * 15 / 16, rel=1e-9)
    assert hybrid_inter == pytest.approx(2 * (1 / 2) * psi / PER_NODE, rel=1e-9)
    assert hybrid_intra == pytest.approx(3 * psi * 7 / 8, rel=1e-9)


def test_hybrid_memory_sharded_within_the_node():
    full = _run(16, zero=3).devices[0].memory
    hybrid = _run(16, zero=3, hybrid_shard=True).devices[0].memory
    for kind in ("weights", "gradients", "optimizer"):
        assert hybrid[kind] == pytest.approx(2 * full[kind])
    dist_opt = _run(16, zero=1, hybrid_shard=True).devices[0].memory
    assert dist_opt["optimizer"] == pytest.approx(hybrid["optimizer"])


def test_groups_and_steps():
    lay = Layout(16, 1, 1, 8)
    assert lay.shard_group(3, 0, 0) == list(range(8))
    assert lay.replica_group(3, 0, 0) == [3, 11]
    assert sharded_sync(Strategy(zero=0), 8.0, 16, 1) == [("allreduce", 8.0, "dp")]
    assert sharded_sync(Strategy(zero=3), 8.0, 16, 1) == [("reduce_scatter", 8.0, "dp")]
    assert sharded_sync(Strategy(zero=3, hybrid_shard=True), 8.0, 8, 2) == \
        [("reduce_scatter", 8.0, "shard"), ("allreduce", 1.0, "replica")]
    assert sharded_sync(Strategy(zero=1, zero_grad_reduce="allreduce"), 8.0, 16, 1) == [("allreduce", 8.0, "dp")]


def test_bad_hybrid():
    with pytest.raises(SpecError, match="needs zero"):
        simulate("llama3-8b", "dgx-h100", dp=2, hybrid_shard=True, overrides=TINY, stack="eager")
