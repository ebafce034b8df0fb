"""torchtitan's activation-checkpointing policies (`dlsim.plan.oprecompute`): selective_layer
checkpoints every second block in full, selective_op keeps its save list (every other mm, the SDPA
output) and recomputes the rest; their closed forms against the layer table, the simulation and
the analytic evaluator."""

from __future__ import annotations

import pytest

from dlsim.api.analytic import estimate_strategy
from dlsim.api.simulate import prepare, simulate
from dlsim.cost.layercost import Gemm
from dlsim.cost.layers import layer_cost
from dlsim.cost.pricing import gemm_seconds, price_pass
from dlsim.errors import SpecError
from dlsim.plan.oprecompute import alternate_layers, mm_positions
from dlsim.plan.blocks import recompute_layers

SMALL = {"layers": 4, "seq_len": 256}
KW = dict(stack="fsdp2", dp=1, microbatch_size=2, global_batch=2, overrides=SMALL)


def _table(recompute, model="llama3-8b"):
    p = prepare(model, "dgx-a100", recompute=recompute, **KW)
    return p, p.builder.scenario(p.strategy)


def test_selective_layer_checkpoints_every_second_block():
    p, _ = _table("selective_layer")
    model = p.builder.model
    chosen = {v for v in alternate_layers(model).values() if v}
    blocks = sorted({v for v in recompute_layers(model).values() if v})
    assert chosen == {blocks[1], blocks[3]}  # torchtitan's count % 2 == 0, counting blocks from 1


def test_a_llama_block_runs_wq_wk_wv_wo_w1_w3_w2():
    p, _ = _table("selective_op")
    pos = mm_positions(p.builder.model)
    block = sorted(v for v in recompute_layers(p.builder.model).values() if v)[0]
    assert {k.split(".")[-1]: v for k, v in pos.items() if k.startswith(block + ".")} == \
        {"attn": (1, 4), "gate_up": (5, 2), "down": (7, 1)}


def test_selective_op_recomputes_wk_wo_w3_and_every_element_wise_kernel():
    p, sc = _table("selective_op")
    device, tables, dtype = p.builder.cluster.device, p.builder.tables, p.builder.dtype
    a = p.builder.model.layers[[e.type for e in sc.entries].index("attention")].attrs
    by = {e.name.split(".")[-1]: e for e in sc.entries if e.name.startswith("h.0.")}
    rows, d = 2 * 256, 4096
    kv = d // a["heads"] * a["kv_heads"]
    attn = by["attn"]
    cost = layer_cost(p.builder.model.layers[attn.index], 2, dtype, frozenset(p.strategy.fused_kernels))
    want = gemm_seconds(Gemm(rows, kv, d), device, dtype, tables) + gemm_seconds(Gemm(rows, d, d), device, dtype, tables) \
        + sum(price_pass(q, op, name, device, dtype, tables).seconds for op, name, q in cost.forward.parts)
    assert attn.op_core.seconds == pytest.approx(want, rel=1e-12)
    # kept: wq's and wv's outputs, the SDPA output and its fp32 log-sum-exp per row and head
    assert attn.op_kept == rows * (d + kv + d) * 2 + rows * a["heads"] * 4
    ffn = 14336
    assert by["gate_up"].op_core.seconds == pytest.approx(gemm_seconds(Gemm(rows, ffn, d), device, dtype, tables))
    assert by["gate_up"].op_kept == rows * ffn * 2  # w1's half
    assert by["down"].op_core.seconds == 0 and by["down"].op_kept == by["down"].out_bytes  # w2 saved
    for name in ("norm1", "norm2", "act", "add1", "add2"):
        assert by[name].op_core == by[name].forward and by[name].op_kept == 0
    sim = simulate("llama3-8b", "dgx-a100", recompute="selective_op", **KW)
    blocks = recompute_layers(p.builder.model)
    assert sim.breakdown.recompute == pytest.approx(sum(e.op_core.seconds for e in sc.entries if blocks[e.name]),
                                                    rel=1e-9)


def test_selective_layer_recomputes_the_forward_of_half_the_blocks():
    p, sc = _table("selective_layer")
    inside = alternate_layers(p.builder.model)
    sim = simulate("llama3-8b", "dgx-a100", recompute="selective_layer", **KW)
    assert sim.breakdown.recompute == pytest.approx(sum(e.forward.seconds for e in sc.entries if inside[e.name]),
                                                    rel=1e-9)
    full = simulate("llama3-8b", "dgx-a100", recompute="full", **KW)
    none = simulate("llama3-8b", "dgx-a100", recompute="none", **KW)
    assert none.peak_memory_bytes > sim.peak_memory_bytes > full.peak_memory_bytes
    op = simulate("llama3-8b", "dgx-a100", recompute="selective_op", **KW)
    assert none.peak_memory_bytes > op.peak_memory_bytes > full.peak_memory_bytes
    assert 0 < op.breakdown.recompute < full.breakdown.recompute


@pytest.mark.parametrize("recompute", ["selective_layer", "selective_op"])
def test_the_analytic_estimate_holds_to_the_simulation(recompute):
    fields = dict(KW, dp=8, global_batch=16, zero=3)
    rec = estimate_strategy("llama3-8b", "dgx-a100", recompute=recompute, **fields)
    sim = simulate("llama3-8b", "dgx-a100", recompute=recompute, **fields)
    assert abs(rec["iteration_time_s"] / sim.iteration_time_s - 1) <= rec["tolerance"]
    assert rec["peak_memory_bytes"] >= sim.peak_memory_bytes * (1 - 1e-9)


def test_activation_offload_with_torchtitans_policies_is_refused():
    with pytest.raises(SpecError, match="not modelled"):
        simulate("llama3-8b", "dgx-a100", recompute="selective_op", offload="activations", **KW)
