"""Megatron tensor parallelism: roles, collectives per transformer layer, sharded work and parameters."""

import pytest

from dlsim.api.models import as_model
from dlsim.api.simulate import simulate
from dlsim.errors import InfeasibleError
from dlsim.io.profile_yaml import load_profile
from dlsim.plan.layertable import build_layer_table
from dlsim.plan.tensorparallel import classify

B, S, H = 2, 128, 256


@pytest.fixture(scope="module")
def gpt():
    return as_model("gpt2", {"layers": 2, "hidden": H, "heads": 4, "seq_len": S, "vocab": 1024})


def test_roles_of_a_transformer_block(gpt):
    roles = classify(gpt, 2, B, "fp32")
    assert {n: roles[f"h.0.{n}"].role for n in ("ln1", "attn", "attn_drop", "fc1", "gelu", "fc2", "add2")} == {
        "ln1": "replicated", "attn": "attention", "attn_drop": "replicated", "fc1": "column", "gelu": "sharded",
        "fc2": "row", "add2": "replicated"}
    assert roles["embed"].role == "vocab" and roles["lm_head"].role == "column" and roles["loss"].role == "parallel_ce"


def test_four_allreduces_of_bsh_per_layer(gpt):
    """SC'21 §3.3: 2 all-reduces forward, 2 backward, each of b·s·h elements (ring volume 8bsh(t−1)/t)."""
    roles = classify(gpt, 4, B, "fp32")
    block = [r for name, r in roles.items() if name.startswith("h.0.")]
    fwd = [c for r in block for c in r.before + r.after_fwd]
    bwd = [c for r in block for c in r.after_bwd]
    assert [c.op for c in fwd] == ["allreduce"] * 2 and [c.op for c in bwd] == ["allreduce"] * 2
    assert all(c.nbytes == B * S * H * 4 for c in fwd + bwd)


def test_the_collectives_bytes_follow_the_batch_and_dtype_of_one_role_template(gpt):
    """`classify` fills one batch-free template (`role_template`): its bytes scale with the batch and
    the dtype, the parallel cross-entropy moving one fp32 per row whatever the dtype."""
    for batch, dtype, el in ((1, "fp32", 4), (3, "bf16", 2)):
        roles = classify(gpt, 4, batch, dtype)
        assert roles["h.0.fc2"].after_fwd[0].nbytes == batch * S * H * el
        assert [c.nbytes for c in roles["loss"].after_fwd] == [batch * S * 4] * 3


def test_sharded_work_and_parameters(gpt):
    dev = load_profile("dgx-h100").device
    one = {e.name: e for e in build_layer_table(gpt, dev, "fp32", batch=B, tp=1)}
    two = {e.name: e for e in build_layer_table(gpt, dev, "fp32", batch=B, tp=2)}
    for name in ("h.0.fc1", "h.0.fc2", "h.0.attn", "h.0.gelu"):
        assert two[name].flops == pytest.approx(one[name].flops / 2)
    for name in ("h.0.fc1", "h.0.fc2", "h.0.attn"):
        assert two[name].params == one[name].params // 2
    assert two["h.0.ln1"].flops == one["h.0.ln1"].flops and two["h.0.ln1"].params == one["h.0.ln1"].params
    assert two["h.0.fc1"].forward.seconds < one["h.0.fc1"].forward.seconds


def test_tensor_parallel_speeds_up_compute_and_adds_communication(gpt):
    one = simulate(gpt, "dgx-h100", microbatch_size=8)
    two = simulate(gpt, "dgx-h100", tp=2, microbatch_size=8)
    assert two.breakdown.compute < one.breakdown.compute
    assert one.breakdown.exposed_comm == 0 < two.breakdown.exposed_comm  # blocking all-reduces


def test_tp_must_divide_heads(gpt):
    with pytest.raises(InfeasibleError, match="does not divide the 4 heads"):
        simulate(gpt, "dgx-h100", tp=8, microbatch_size=1)


def test_convolutions_alternate_column_and_row():
    alex = as_model("alexnet")
    roles = classify(alex, 4, 8, "fp32")
    assert [roles[n].role for n in ("conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8")] == [
        "column", "row", "column", "row", "column", "row", "column", "row"]
    assert roles["conv1"].after_bwd == ()  # no gradient for the input images


def test_layer_table_runs_the_backward_autograd_runs():
    """The first convolution reads the network's input, which needs no gradient: the simulator's layer
    table prices its ∇w only (autograd skips ∇x), as the single-device estimate does."""
    from dlsim.api.estimate import estimate

    model = as_model("resnet18")
    dev = load_profile("dgx-h100").device
    first = model.layers[0]
    assert first.type == "conv2d" and tuple(first.inputs) == ("input",)
    entries = {e.name: e for e in build_layer_table(model, dev, "fp32", batch=8, tp=1)}
    entry = entries[first.name]
    assert entry.backward.seconds == pytest.approx(entry.backward_weight.seconds) and entry.backward.seconds > 0
    alone = {t.name: t for t in estimate(model, "dgx-h100", batch=8, measured=False).layers}[first.name]
    assert alone.backward_data.seconds == 0
    assert entry.backward_weight.seconds == pytest.approx(alone.backward_weight.seconds)
    later = next(e for e in entries.values() if e.type == "conv2d" and e.name != first.name)
    assert later.backward.seconds > later.backward_weight.seconds
