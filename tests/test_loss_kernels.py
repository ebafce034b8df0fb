"""The cross-entropy as each stack computes it (`dlsim.cost.loss`, strategy and stack key `loss_kernel`):
each chain's bytes and launches equal the sum over the kernels its code runs, listed here one by one;
what it keeps for the backward; the simulated loss layer equals the memory roofline of those bytes
and moves the step by exactly its time; the activations by the fp32 softmax it keeps; the evaluator
prices it as the simulation does; a measured curve of another kernel never prices a chain; every stack
says which loss it runs and where that was read."""

import pytest

from dlsim.api.models import as_cluster
from dlsim.api.simulate import prepare, simulate
from dlsim.cost.layers import layer_cost
from dlsim.cost.loss import ROW_BYTES
from dlsim.cost.pricing import price_pass
from dlsim.cost.roofline import memory_efficiency
from dlsim.io.stack_yaml import load_stack
from dlsim.plan.evaluate import Evaluator
from dlsim.results import Estimate, Source
from dlsim.spec.model import build_model

F32 = 4
L, V, N = 16, 1000, 3
SMALL = {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 512, "positions": 512}


def loss_layer():
    return build_model("t", "bf16", [L, V], "tensor", [{"type": "cross_entropy", "name": "x"}]).layers[0]


def summed(kernels, row_kernels, elements, rows):
    """(reads, writes, launches) of element kernels (reads, writes per logit) and row-sized kernels."""
    return (sum(r for r, _ in kernels) * elements + ROW_BYTES * rows * row_kernels,
            sum(w for _, w in kernels) * elements + ROW_BYTES * rows * row_kernels, len(kernels) + row_kernels)


def passes(kernel, dtype):
    c = layer_cost(loss_layer(), N, dtype, loss=kernel)
    return c, (c.forward.bytes_read, c.forward.bytes_written, c.forward.kernels), \
        (c.backward_data.bytes_read, c.backward_data.bytes_written, c.backward_data.kernels)


@pytest.mark.parametrize("dtype, b", [("bf16", 2), ("fp16", 2), ("fp32", 4)])
def test_megatron_is_its_vocab_parallel_function_on_an_fp32_copy(dtype, b):
    e, r = N * L * V, N * L
    cast = [(b, F32)] if b != F32 else []  # output.float(): nothing to do on fp32 logits
    # max over the row, sub_ of the maximum, exp in place, sum over the row, div_ by the sum
    fwd = cast + [(F32, 0), (F32, F32), (F32, F32), (F32, 0), (F32, F32)]
    c, got_f, got_b = passes("megatron", dtype)
    assert got_f == summed(fwd, 14, e, r)
    assert got_b == summed([(F32, F32)] + ([(F32, b)] if b != F32 else []), 6, e, r)  # mul_ by the gradient, cast back
    if b == 2:  # the stack notes' estimate: 38 bytes per logit forward, 14 backward
        assert (got_f[0] + got_f[1] - 2 * 14 * ROW_BYTES * r) / e == 38
        assert (got_b[0] + got_b[1] - 2 * 6 * ROW_BYTES * r) / e == 14
    # the fp32 softmax, the target mask and the masked target; not the logits
    assert c.extra_saved_bytes == F32 * e + 9 * r and not c.saves_input


def test_megatron_core_fusion_and_torch_cross_entropy():
    e, r = N * L * V, N * L
    c, got_f, got_b = passes("megatron_fused", "bf16")
    # cast with the row maximum; sub, exp in place and the row sum; div_
    assert got_f == summed([(2, F32), (F32, F32), (F32, F32)], 2, e, r)
    # mul_ writing the fp32 input in place and the bf16 gradient (calculate_gradients' .to(torch.bfloat16))
    assert got_b == summed([(F32, F32 + 2)], 1, e, r)
    assert c.extra_saved_bytes == F32 * e + 9 * r
    _, _, fp16_b = passes("megatron_fused", "fp16")  # the bf16 gradient cast once more to fp16 logits
    assert fp16_b == summed([(F32, F32 + 2), (2, 2)], 1, e, r)
    c, got_f, got_b = passes("torch", "bf16")
    # .float(); log_softmax reading the row three times (max, sum of exp, output); nll_loss over the rows
    assert got_f == summed([(2, F32), (3 * F32, F32)], 1, e, r)
    # nll_loss_backward's zero fill and scatter; _log_softmax_backward_data; the cast back
    assert got_b == summed([(0, F32), (3 * F32, F32), (F32, 2)], 1, e, r)
    assert c.extra_saved_bytes == F32 * e + 8 * r and not c.saves_input
    one = layer_cost(loss_layer(), N, "bf16")
    assert one.saves_input and (one.forward.bytes_read, one.backward_data.bytes) == (2 * e, 4 * e)
    for kernel in ("megatron", "megatron_fused", "torch"):  # the same arithmetic: FLOP counts do not depend on it
        assert layer_cost(loss_layer(), N, "bf16", loss=kernel).flops == one.flops


def test_a_measured_curve_of_another_kernel_never_prices_a_chain():
    """The tables' cross_entropy rows time F.cross_entropy indexed by the single pass's bytes: they price
    single_pass, and a stack's chain goes to the roofline of its own bytes."""
    class Tables:
        def memory_bound(self, op, name, cost, dtype):
            return Estimate(1.0, Source.MEASURED, "measured")
    device = as_cluster("dgx-h100").device
    one = layer_cost(loss_layer(), N, "bf16").forward
    chain = layer_cost(loss_layer(), N, "bf16", loss="megatron").forward
    assert price_pass(one, "cross_entropy", "forward", device, "bf16", Tables()).seconds == 1.0
    assert price_pass(chain, "cross_entropy", "forward", device, "bf16", Tables()).seconds == \
        price_pass(chain, "cross_entropy", "forward", device, "bf16").seconds < 1.0


def _loss_entry(**kw):
    p = prepare("gpt2", "dgx-h100", overrides=SMALL, **kw)
    return p, next(e for e in p.builder.scenario(p.strategy).entries if e.type == "cross_entropy")


def test_the_simulated_loss_is_the_memory_roofline_of_its_chain_and_moves_the_step_by_it():
    """Megatron-LM 2022 at tp 2: each rank runs the chain on its V/tp logits; the loss layer's forward
    is (reads + writes) / (B · e_m) + k · t_launch with the bytes written out here, and the step moves
    by exactly the loss layer's change; the activations by the fp32 softmax less the fp16 logits."""
    kw = dict(stack="megatron-lm-2022", tp=2, dp=1, microbatch_size=2, global_batch=4)
    p, chain = _loss_entry(loss_kernel="megatron", **kw)
    _, one = _loss_entry(loss_kernel="single_pass", **kw)
    device, b, tp = as_cluster("dgx-h100").device, 2, 2
    e, r = 2 * SMALL["seq_len"] * 50257, 2 * SMALL["seq_len"]  # gpt2's vocabulary
    nbytes = ((b + 5 * F32 + 4 * F32) * e + 2 * 14 * ROW_BYTES * r) / tp
    want = nbytes / (device.memory_bandwidth * memory_efficiency(nbytes / 20, device)) + 20 * device.launch_overhead
    assert chain.forward.seconds == pytest.approx(want, rel=1e-12)
    assert chain.saved_bytes == pytest.approx((F32 * e + 9 * r) / tp, rel=1e-12)
    runs = {k: simulate("gpt2", "dgx-h100", overrides=SMALL, loss_kernel=k, **kw) for k in ("single_pass", "megatron")}
    layer_delta = chain.forward.seconds + chain.backward.seconds - one.forward.seconds - one.backward.seconds
    assert layer_delta > 0
    assert runs["megatron"].iteration_time_s - runs["single_pass"].iteration_time_s == \
        pytest.approx(2 * layer_delta, rel=1e-9)  # two micro-batches, one after the other
    act = {k: r_.devices[0].memory["activations"] for k, r_ in runs.items()}
    assert act["megatron"] - act["single_pass"] == pytest.approx(((F32 - b) * e + 9 * r) / tp, rel=1e-9)


@pytest.mark.parametrize("kernel", ["megatron", "megatron_fused", "torch"])
def test_the_evaluator_prices_the_loss_as_the_simulation(kernel):
    """On a layout the evaluator times exactly (pipeline exchanges beside the compute, one tensor-parallel
    rank): its time and peak memory, loss included, equal the simulation's."""
    kw = dict(stack="eager", dtype="bf16", tp=1, pp=2, dp=2, microbatch_size=1, global_batch=8, overrides=SMALL,
              loss_kernel=kernel)
    sim = simulate("gpt2", "dgx-h100", **kw)
    p = prepare("gpt2", "dgx-h100", **kw)
    got = Evaluator.of(p.builder).evaluate(p.strategy)
    assert not got.approximate and got.iteration_time_s == pytest.approx(sim.iteration_time_s, rel=1e-6)
    assert got.peak_memory_bytes == pytest.approx(max(d.peak_memory_bytes for d in sim.devices), rel=1e-6)


def test_stacks_name_the_loss_their_framework_computes():
    want = {"megatron-lm-2021": "megatron", "megatron-lm-2022": "megatron", "deepspeed": "megatron",
            "megatron-core": "megatron_fused", "fsdp2": "torch", "pytorch": "single_pass", "eager": "single_pass"}
    for name, kernel in want.items():
        stack = load_stack(name)
        assert stack.values["loss_kernel"] == kernel, name
    assert "cross_entropy_loss_fusion true" in load_stack("megatron-core").sources["loss_kernel"]
    assert "output.float()" in load_stack("megatron-lm-2022").sources["loss_kernel"]
    assert ".float()" in load_stack("fsdp2").sources["loss_kernel"]
    assert "no framework code names the loss" in load_stack("pytorch").sources["loss_kernel"]
