"""Eager kernel chains against their fused kernels (`dlsim.cost.eager`, fusions rmsnorm, glu, rope):
each chain's bytes and launches equal the sum over the ATen kernels autograd runs, listed here one by
one from the model code; the priced pass equals the memory roofline of those bytes; a declared fusion
leaves the one-kernel cost; a stack's fusions change a simulated step by exactly the layers' time."""

import pytest

from dlsim.api.simulate import prepare, simulate
from dlsim.cost.layers import layer_cost
from dlsim.cost.pricing import price_pass
from dlsim.cost.roofline import memory_efficiency
from dlsim.io.profile_yaml import load_profile
from dlsim.io.stack_yaml import load_stack
from dlsim.spec.model import build_model

B = 2  # bf16
F32 = 4
L, D = 64, 96
N = 3


def one(entry, shape):
    return build_model("t", "bf16", shape, "tensor", [dict(entry, name="x")]).layers[0]


def summed(kernels, elements, rows=0):
    """(reads, writes, launches) of a list of kernels, each (reads, writes) per element or ("row", r, w)."""
    reads = writes = 0
    for k in kernels:
        if k[0] == "row":
            reads, writes = reads + k[1] * rows, writes + k[2] * rows
        else:
            reads, writes = reads + k[0] * elements, writes + k[1] * elements
    return reads, writes, len(kernels)


def test_eager_rmsnorm_is_the_sum_of_its_aten_kernels():
    c = layer_cost(one({"type": "rmsnorm"}, [L, D]), N, "bf16")
    e, r = N * L * D, N * L
    fwd = [(B, F32), (F32, F32), (F32, 0), ("row", 0, F32), ("row", F32, F32), ("row", F32, F32),  # float pow mean +eps rsqrt
           (F32, F32), ("row", F32, 0), (F32, B), (B, B)]  # x·rstd (and its rstd row), type_as, ·weight
    reads, writes, _ = summed(fwd, e, r)
    assert (c.forward.bytes_read, c.forward.bytes_written, c.forward.kernels) == (reads, writes, 8)
    bwd = [(B, B), (2 * B, B), (B, 0), (B, F32),            # g·w, g·x̂ and its row sum, cast back to fp32
           (F32, F32), (2 * F32, F32), (F32, 0),            # g·rstd, g·x and its row sum
           (0, F32), (F32, F32), (F32, F32), (2 * F32, F32),  # mean's expand/D, pow(1) copy, 2·, g·
           (2 * F32, F32), (F32, B)]                        # the two fp32 gradients summed, the first cast
    reads, writes, launches = summed(bwd, e)
    assert c.backward_data.bytes_read - 16 * r == reads and c.backward_data.bytes_written - 12 * r == writes
    assert c.backward_data.kernels == launches + 3  # and three row-sized kernels (rsqrt's backward)
    assert c.extra_saved_bytes == (F32 + B) * e + F32 * r and not c.saves_input
    fused = layer_cost(one({"type": "rmsnorm"}, [L, D]), N, "bf16", frozenset({"rmsnorm"}))
    assert (fused.forward.bytes, fused.backward_data.bytes) == (3 * e * B, 5 * e * B)
    assert fused.flops == c.flops  # the same arithmetic: FLOP counts do not depend on the fusion


def test_eager_glu_is_activation_then_product():
    c = layer_cost(one({"type": "swiglu"}, [L, 2 * D]), N, "bf16")
    out = N * L * D
    assert summed([(B, B), (2 * B, B)], out) == (c.forward.bytes_read, c.forward.bytes_written, c.forward.kernels)
    assert summed([(2 * B, B), (2 * B, B), (2 * B, B)], out) == (c.backward_data.bytes_read,
                                                                 c.backward_data.bytes_written, c.backward_data.kernels)
    assert c.extra_saved_bytes == 3 * out * B  # the activation's input and output, the other operand
    fused = layer_cost(one({"type": "swiglu"}, [L, 2 * D]), N, "bf16", frozenset({"glu"}))
    assert (fused.forward.bytes, fused.forward.kernels, fused.saves_input) == (3 * out * B, 1, True)
    assert fused.flops == c.flops


def test_eager_rope_casts_to_fp32_and_back_on_q_and_k():
    layer = one({"type": "attention", "heads": 4, "kv_heads": 2, "causal": True, "bias": False, "rotary": True}, [L, D])
    def rope(fused):
        c = layer_cost(layer, N, "bf16", frozenset(fused))
        (f,) = [p for name, _, p in c.forward.parts if name == "rope"]
        (b,) = [p for name, _, p in c.backward_data.parts if name == "rope"]
        assert f == b  # the backward runs the same three kernels per tensor
        return f
    qk = N * L * (D + D // 2)  # Q and the two KV heads' K
    per_tensor = [(B, F32), (F32, F32), (F32, B)]  # .float(), the complex product, .type_as
    eager = rope({"flash_attention"})
    r, w, k = summed(per_tensor, qk)
    assert (eager.bytes_read, eager.bytes_written, eager.kernels) == (r, w, 2 * k)
    fused = rope({"flash_attention", "rope"})
    assert (fused.bytes_read, fused.bytes_written, fused.kernels) == (qk * B, qk * B, 1)
    assert fused.flops == eager.flops


def test_a_chain_is_priced_by_the_memory_roofline_of_its_bytes():
    device = load_profile("dgx-a100").device
    c = layer_cost(one({"type": "rmsnorm"}, [4096, 8192]), 2, "bf16")
    p = c.forward
    want = p.bytes / (device.memory_bandwidth * memory_efficiency(p.bytes / p.kernels, device)) \
        + p.kernels * device.launch_overhead
    got = price_pass(p, "rmsnorm", "forward", device, "bf16").seconds
    assert got == pytest.approx(want, rel=1e-12)
    fused = layer_cost(one({"type": "rmsnorm"}, [4096, 8192]), 2, "bf16", frozenset({"rmsnorm"})).forward
    assert got > 5 * price_pass(fused, "rmsnorm", "forward", device, "bf16").seconds


def test_stacks_declare_the_fusions_their_framework_runs():
    core = load_stack("megatron-core")
    assert {"rmsnorm", "glu", "rope"} <= set(core.values["fused_kernels"])
    assert all(w in core.sources["fused_kernels"] for w in ("RMSNorm", "bias_swiglu", "apply_rope_fusion"))
    # eager PyTorch runs the model's own RMSNorm, SwiGLU and rotary code
    assert not {"rmsnorm", "glu", "rope"} & set(load_stack("pytorch").values["fused_kernels"])
    # torchtitan under torch.compile: Inductor fuses the norm and the gated unit, not the complex rotary product
    titan = load_stack("fsdp2")
    assert {"rmsnorm", "glu"} <= set(titan.values["fused_kernels"]) and "rope" not in titan.values["fused_kernels"]
    assert "compile = true" in titan.sources["fused_kernels"] and "torchtitan#15" in titan.sources["fused_kernels"]


def test_the_fusions_change_a_simulated_step_by_the_layers_time():
    kw = dict(stack="pytorch", dp=1, microbatch_size=1, global_batch=1, overrides={"layers": 2, "seq_len": 256})
    runs, tables = {}, {}
    for name, fused in (("eager", ["flash_attention"]), ("fused", ["flash_attention", "rmsnorm", "glu", "rope"])):
        runs[name] = simulate("tinyllama-1.1b", "dgx-a100", fused_kernels=fused, **kw)
        p = prepare("tinyllama-1.1b", "dgx-a100", fused_kernels=fused, **kw)
        tables[name] = p.builder.scenario(p.strategy).entries
    layer_delta = sum(e.forward.seconds + e.backward.seconds for e in tables["eager"]) - \
        sum(e.forward.seconds + e.backward.seconds for e in tables["fused"])
    assert layer_delta > 0
    step_delta = runs["eager"].iteration_time_s - runs["fused"].iteration_time_s
    assert step_delta == pytest.approx(layer_delta, rel=1e-9)
