"""Context parallelism: ring attention against its closed form, sequence split, dp x cp groups."""

from __future__ import annotations

import pytest

from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import simulate
from dlsim.errors import SpecError
from dlsim.plan.comm import INTRA, Layout
from dlsim.plan.contextparallel import add_rings, ring_time, split_sequence
from dlsim.plan.layertable import build_layer_table
from dlsim.results import Estimate, Source

TINY = {"layers": 2, "hidden": 512, "heads": 8, "kv_heads": 4, "ffn_hidden": 1024, "seq_len": 2048, "vocab": 1000}


class RingPricer:
    """Collectives free, point-to-point messages latency + bytes / bandwidth (closed forms exact)."""

    def __init__(self, latency: float, bandwidth: float):
        self.latency, self.bandwidth = latency, bandwidth

    def collective(self, op, nbytes, ranks):
        return Estimate(0.0, Source.MODEL, "free")

    def p2p(self, nbytes, src, dst):
        return Estimate(self.latency + nbytes / self.bandwidth if nbytes > 0 else 0.0, Source.MODEL, "alpha-beta")

    def expand(self, op, nbytes, ranks):
        return None

    def tier(self, ranks):
        return INTRA


def _rings(cp):
    model = split_sequence(as_model("llama3-8b", TINY), cp)
    cluster = as_cluster("dgx-h100")
    entries = build_layer_table(model, cluster.device, "bf16", batch=1, tp=1)
    return add_rings(entries, model, cluster.device, "bf16", cp), cluster.device.overlap_slowdown


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("bandwidth", [1e12, 2e9])  # transfers hidden by the core / longer than it
def test_ring_attention_equals_closed_form(cp, bandwidth):
    """Simulated iteration with a priced ring minus the same with free transfers = Σ over attention
    layers of the ring's closed form (forward and backward) minus its core."""
    latency = 5e-6
    kw = dict(dp=1, tp=1, pp=1, cp=cp, microbatch_size=1, num_microbatches=1, dtype="bf16", measured=False,
              overrides=TINY, stack="eager")
    priced = simulate("llama3-8b", "dgx-h100", pricer=RingPricer(latency, bandwidth), **kw).iteration_time_s
    free = simulate("llama3-8b", "dgx-h100", pricer=RingPricer(0.0, float("inf")), **kw).iteration_time_s
    entries, sigma = _rings(cp)
    rings = [e.ring for e in entries if e.ring is not None]
    assert len(rings) == TINY["layers"]
    expected = 0.0
    for r in rings:
        fwd_t, bwd_t = latency + r.kv_bytes / bandwidth, latency + 2 * r.kv_bytes / bandwidth
        expected += ring_time(r.forward_core, fwd_t, cp, sigma) - r.forward_core
        expected += ring_time(r.backward_core, bwd_t, cp, sigma) - r.backward_core
    assert priced - free == pytest.approx(expected, rel=1e-9, abs=1e-12)
    exposed = bandwidth < 1e10
    step = rings[0].forward_core / cp
    assert (latency + rings[0].kv_bytes / bandwidth > step * (1 + sigma)) == exposed


def test_ring_closed_form_limits():
    # hidden transfer: cp steps of the core, plus the slowdown of the overlapped part
    assert ring_time(1.0, 0.0, 4) == pytest.approx(1.0)
    assert ring_time(1.0, 0.1, 4, 0.0) == pytest.approx(1.0)
    # transfer-bound: first step plus cp - 1 transfers
    assert ring_time(1.0, 2.0, 4, 0.0) == pytest.approx(0.25 + 3 * 2.0)


def test_kv_block_and_core_split():
    """The KV block is K and V of the rank's L/cp tokens (kv_heads x d_h wide); the core per rank is
    1/cp of the unsplit core (local queries against all keys)."""
    entries1, _ = _rings(1)
    entries2, _ = _rings(2)
    ring = next(e.ring for e in entries2 if e.ring)
    d_h = TINY["hidden"] // TINY["heads"]
    assert ring.kv_bytes == 2 * (TINY["seq_len"] // 2) * TINY["kv_heads"] * d_h * 2
    att1 = next(e for e in entries1 if e.type == "attention")
    att2 = next(e for e in entries2 if e.type == "attention")
    assert att2.flops == pytest.approx(att1.flops / 2)
    assert att2.saved_bytes == pytest.approx(att1.saved_bytes / 2, rel=0.35)


def test_activations_split_and_gradient_group():
    kw = dict(dp=2, tp=1, pp=1, microbatch_size=1, num_microbatches=1, dtype="bf16", overrides=TINY)
    one = simulate("llama3-8b", "dgx-h100", cp=1, **kw)
    two = simulate("llama3-8b", "dgx-h100", cp=2, **kw)
    act = lambda r: max(d.memory.get("activations", 0.0) for d in r.devices)  # noqa: E731
    assert act(two) == pytest.approx(act(one) / 2, rel=0.05)
    assert two.strategy["cp"] == 2
    lay = Layout(2, 2, 1, 8, cp=2)
    assert lay.cp_group(1, 1, 0) == [5, 7]
    assert sorted(lay.dp_group(0, 0)) == [0, 2, 4, 6]


def test_bad_context_parallel():
    with pytest.raises(SpecError, match="2 x cp"):
        simulate("llama3-8b", "dgx-h100", cp=3, overrides=TINY, dtype="bf16")
    with pytest.raises(SpecError, match="token sequence"):
        simulate("resnet18", "dgx-h100", cp=2)
    with pytest.raises(SpecError, match="allreduce"):
        simulate("llama3-8b", "dgx-h100", cp=2, sync="ps", overrides=TINY)
