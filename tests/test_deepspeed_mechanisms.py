"""DeepSpeed's BF16_Optimizer under the PipelineEngine (microsoft/DeepSpeed@8164ea9), each mechanism
held to its closed form: every micro-batch's gradient cast to fp32 and added into the fp32 buffer
(`grad_accumulation cast_add_fp32`, two kernels: b + 16 bytes per parameter), and the tied
embedding's gradient all-reduced between the first and last stage in the buffer's fp32."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import _default_pricer, run_simulation, simulate
from dlsim.cost.memory import grad_accumulation_bytes
from dlsim.plan.comm import Layout
from dlsim.plan.dataparallel import buffer_element_bytes, reduce_element_bytes
from dlsim.spec.strategy import make_strategy

TIED = {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024}


@pytest.mark.parametrize("dtype, m, expected", [("bf16", 1, 18.0), ("bf16", 7, 18.0), ("fp16", 3, 18.0)])
def test_cast_then_add_moves_b_plus_16_bytes_every_micro_batch(dtype, m, expected):
    """cast: read b, write 4; add: read 4 + 4, write 4 (bf16_optimizer.py update_hp_grads)."""
    assert grad_accumulation_bytes("cast_add_fp32", dtype, m) == expected
    assert grad_accumulation_bytes("cast_add_fp32", dtype, m) - grad_accumulation_bytes("main_grad_fp32", dtype, m) == 8.0


# the simulation's charge for it: tests/test_grad_accumulation.py (m x the roofline sum of params x 18 bytes)


def test_buffer_bytes_are_fp32_while_the_wire_carries_bf16():
    s = make_strategy(dp=2, grad_accumulation="cast_add_fp32", grad_reduce_dtype="bf16", stack="eager")
    assert (buffer_element_bytes(s, "bf16"), reduce_element_bytes(s, "bf16")) == (4, 2)
    plain = make_strategy(dp=2, grad_accumulation="main_grad", stack="eager")
    assert buffer_element_bytes(plain, "bf16") == reduce_element_bytes(plain, "bf16") == 2


def _tied_sync(grad_accumulation: str):
    gpt = as_model("gpt2", TIED)
    cluster = as_cluster("dgx-a100")
    cluster = replace(cluster, device=replace(cluster.device, overlap_slowdown=0.0))
    sim = run_simulation(gpt, cluster, pp=2, microbatch_size=1, num_microbatches=4, stage_partition=(22, 23),
                         dtype="bf16", grad_accumulation=grad_accumulation, trace=True, stack="eager")
    syncs = [e for e in sim.trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "comm"
             and e["name"].endswith(": tied embedding grads")]
    return gpt, cluster, sim, syncs


@pytest.mark.parametrize("grad_accumulation, element", [("cast_add_fp32", 4), ("main_grad", 2)])
def test_tied_embedding_allreduced_in_the_buffers_dtype(grad_accumulation, element):
    """pipe/engine.py _exec_reduce_tied_grads all-reduces weight._hp_grad (fp32) under bf16: the
    simulated all-reduce is the closed form of params x 4 bytes between the two stages' ranks (x 2
    with a bf16 buffer), and the evaluator prices the same."""
    from dlsim.io.kernel_tables import load_kernel_times
    from dlsim.plan.evaluate import Evaluator
    gpt, cluster, sim, syncs = _tied_sync(grad_accumulation)
    nbytes = gpt.layer("embed").params * element
    pricer = _default_pricer(cluster, Layout(1, 1, 2, cluster.devices_per_node), "auto")  # stages on ranks 0 and 1
    closed = pricer.collective("allreduce", nbytes, [0, 1]).seconds
    assert len(syncs) == 2 and syncs[0]["ts"] == syncs[1]["ts"]
    assert syncs[0]["dur"] / 1e6 == pytest.approx(closed, rel=1e-6)
    s = make_strategy(pp=2, microbatch_size=1, num_microbatches=4, stage_partition=(22, 23), dtype="bf16",
                      grad_accumulation=grad_accumulation, stack="eager")
    ev = Evaluator(gpt, cluster, "bf16", lambda layout, algo: _default_pricer(cluster, layout, algo, True),
                   load_kernel_times(cluster)[0] if cluster.tables else None)
    got = ev.evaluate(s)
    assert got.iteration_time_s == pytest.approx(sim.result.iteration_time_s, rel=1e-6)


def test_gradient_memory_is_the_fp32_buffer_not_the_bf16_wire():
    """BF16_Optimizer keeps a full flat fp32 gradient buffer (torch.zeros_like(bf16 flat, float32))
    and casts it to bf16 only for the all-reduce: 4 bytes per parameter of gradient memory on both
    clocks, while the buckets on the wire stay bf16."""
    from dlsim.io.kernel_tables import load_kernel_times
    from dlsim.plan.evaluate import Evaluator
    model, cluster = as_model("gpt2", {"layers": 2}), as_cluster("dgx-a100")
    kw = dict(dp=2, microbatch_size=1, num_microbatches=2, dtype="bf16", grad_reduce_dtype="bf16", stack="eager")
    fp32 = simulate(model, cluster, grad_accumulation="cast_add_fp32", **kw)
    bf16 = simulate(model, cluster, grad_accumulation="main_grad", **kw)
    assert fp32.devices[0].memory["gradients"] == pytest.approx(model.params * 4, rel=1e-9)
    assert bf16.devices[0].memory["gradients"] == pytest.approx(model.params * 2, rel=1e-9)
    ev = Evaluator(model, cluster, "bf16", lambda layout, algo: _default_pricer(cluster, layout, algo, True),
                   load_kernel_times(cluster)[0] if cluster.tables else None)
    got = ev.evaluate(make_strategy(grad_accumulation="cast_add_fp32", **kw))
    assert got.peak_memory_bytes == pytest.approx(fp32.peak_memory_bytes, rel=1e-9)
