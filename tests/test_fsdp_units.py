"""FSDP2's units of one transformer block, the root and the last block kept gathered from forward to
backward, and its all-gather copy-out / reduce-scatter copy-in (`dlsim.plan.fsdp`, stack fsdp2), each
against its closed form, and the analytic evaluator against the simulation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlsim.api.analytic import estimate_strategy
from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import simulate
from dlsim.cost.roofline import roofline_time
from dlsim.plan.fsdp import block_buckets, copy_in_bytes, copy_out_bytes, kept_units
from test_fsdp import VolumePricer

TINY = {"layers": 3, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn_hidden": 512, "seq_len": 256, "vocab": 1000}
DP = 8


def _model():
    return as_model("llama3-8b", TINY)


def _cluster():
    c = as_cluster("dgx-h100")
    return replace(c, device=replace(c.device, overlap_slowdown=0.0))  # no slowdown: closed forms exact


def _run(pricer=None, **kw):
    fields = dict(dp=DP, zero=3, microbatch_size=1, num_microbatches=1, dtype="bf16", stack="eager", measured=False,
                  bucket_size=2**20, nodes=1, **kw)
    if pricer is not None:
        fields["pricer"] = pricer
    return simulate(_model(), _cluster(), **fields)


def _units():
    """(block parameters per block, root parameters) of the tiny model."""
    model = _model()
    blocks: dict[str, int] = {}
    root = 0
    for layer in model.layers:
        if layer.name.startswith("h."):
            key = ".".join(layer.name.split(".")[:2])
            blocks[key] = blocks.get(key, 0) + layer.params
        else:
            root += layer.params
    return list(blocks.values()), root


def test_block_units_in_reduction_order_root_last_and_kept():
    layers = [(0, "embed", 8.0), (1, "h.0.attn", 4.0), (2, "h.0.mlp", 2.0), (3, "h.1.attn", 4.0), (4, "h.1.add", 0.0),
              (5, "norm_f", 1.0), (6, "lm_head", 8.0)]
    units = block_buckets(layers)
    assert [u.layers for u in units] == [(3,), (1, 2), (0, 5, 6)]
    assert [u.nbytes for u in units] == [4.0, 6.0, 17.0]
    assert units[-1].ready_after == 0  # the root's gradients are complete after the embedding's backward
    names = {i: n for i, n, _ in layers}
    assert kept_units(units, names, "h.1") == frozenset({0, 2})  # the last block and the root
    assert kept_units(units[1:], names, "h.1") == frozenset({1})  # a chunk without the last block: its root only


def test_block_units_gather_all_forward_and_all_but_the_kept_backward():
    """Per rank per iteration (volume pricer: (N−1)/N of the bytes): all-gathers of every unit in the
    forward, of every unit but the root and the last block in the backward, reduce-scatters of all
    gradients; ZeRO-3 by bucket size gathers everything twice (3Ψ)."""
    blocks, root = _units()
    psi = (sum(blocks) + root) * 2
    f = (DP - 1) / DP
    bucket = _run(VolumePricer()).devices[0].communication_s
    block = _run(VolumePricer(), fsdp_units="block").devices[0].communication_s
    assert bucket == pytest.approx(3 * psi * f, rel=1e-9)
    assert block == pytest.approx((3 * psi - 2 * (root + blocks[-1])) * f, rel=1e-9)


def test_block_units_hold_the_root_and_two_blocks():
    """Gathered parameters at the peak: the root (kept from its forward to the end of the backward) and
    two blocks (the one running and the one prefetched), (N−1)/N of each."""
    blocks, root = _units()
    held = _run(fsdp_units="block").devices[0].memory["gathered_params"]
    assert held == pytest.approx((root + 2 * max(blocks)) * 2 * (DP - 1) / DP, rel=1e-9)


def test_copies_add_their_roofline_kernels():
    """fsdp_copies: the compute stream runs one copy-out per gathered unit (every unit in the forward,
    all but the kept ones in the backward), 2·P_u·b bytes each at the device's memory roofline; the
    reduction stream a copy-in per unit before its reduce-scatter, P_u·(b + 4) bytes (fp32 reduce)."""
    blocks, root = _units()
    device = _cluster().device
    t = lambda nbytes: roofline_time(0.0, nbytes, device, "bf16", matrix=False).seconds  # noqa: E731
    units = blocks + [root]
    kept = [blocks[-1], root]
    out = sum(t(copy_out_bytes(p * 2)) for p in units) + sum(t(copy_out_bytes(p * 2)) for p in blocks[:-1])
    into = sum(t(copy_in_bytes(p * 4, "bf16", 4)) for p in units)
    assert into == pytest.approx(sum(t(p * 6) for p in units)) and len(kept) == 2
    kw = dict(fsdp_units="block", grad_reduce_dtype="fp32")
    plain, copies = _run(**kw), _run(fsdp_copies=True, **kw)
    assert copies.devices[0].breakdown.compute - plain.devices[0].breakdown.compute == pytest.approx(out, rel=1e-9)
    assert copies.devices[0].communication_s - plain.devices[0].communication_s == pytest.approx(into, rel=1e-9)


@pytest.mark.parametrize("fields", [dict(), dict(recompute="full"), dict(microbatch_size=2, global_batch=64)])
def test_the_evaluator_times_fsdp2_as_the_simulation(fields):
    kw = dict(dp=DP, zero=3, stack="fsdp2", nodes=1, overrides=TINY)
    kw.setdefault("global_batch", 32)
    kw.update(fields)
    sim = simulate("llama3-8b", "dgx-h100", **kw)
    rec = estimate_strategy("llama3-8b", "dgx-h100", **kw)
    assert sim.strategy["fsdp_units"] == "block" and sim.strategy["fsdp_copies"]
    assert rec["iteration_time_s"] == pytest.approx(sim.iteration_time_s, rel=1e-9)
    assert rec["peak_memory_bytes"] >= sim.peak_memory_bytes * (1 - 1e-9)
