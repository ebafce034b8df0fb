"""The PyTorch builder: same parameters and shapes as the dlsim description, real forward and
backward passes, every operator type covered, attention checked against PyTorch's own kernels."""

import math

import pytest

from dlsim.errors import SpecError
from dlsim.io.model_yaml import load_model
from dlsim.io.paths import list_models
from dlsim.spec.ops import OPS

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from dlsim.validate.torch_model import (build_torch_model, example_batch, module_key,  # noqa: E402
                                        torch_dtype, trace_on_meta)

IMAGE_OPS = """
name: image-ops
input: {shape: [3, 16, 16]}
layers:
  - {name: conv, type: conv2d, out_channels: 8, kernel: 3, padding: same}
  - {name: bn, type: batchnorm}
  - {name: lrn, type: lrn, size: 3}
  - {name: relu, type: relu}
  - {name: gconv, type: conv2d, out_channels: 8, kernel: 3, stride: 2, padding: 2, dilation: 2, groups: 2}
  - {name: sig, type: sigmoid}
  - {name: mp, type: maxpool, kernel: 3, stride: 1, padding: 1, inputs: [relu]}
  - {name: ap, type: avgpool, kernel: 2, inputs: [mp]}
  - {name: add, type: add, inputs: [sig, ap]}
  - {name: cat, type: concat, inputs: [add, ap]}
  - {name: tanh, type: tanh}
  - {name: gmax, type: global_maxpool, inputs: [cat]}
  - {name: gavg, type: global_avgpool, inputs: [tanh]}
  - {name: up, type: conv_transpose2d, out_channels: 16, kernel: 2, stride: 2, inputs: [relu]}
  - {name: gn, type: groupnorm, groups: 4}
  - {name: r6, type: relu6}
  - {name: swish, type: silu}
  - {name: gup, type: global_avgpool}
  - {name: both, type: add, inputs: [gmax, gavg, gup]}
  - {name: bn1d, type: batchnorm}
  - {name: grid, type: reshape, shape: [4, -1]}
  - {name: ln, type: layernorm}
  - {name: gelu, type: gelu}
  - {name: flat, type: flatten}
  - {name: drop, type: dropout, p: 0.1}
  - {name: fc, type: linear, out_features: 10}
  - {name: probs, type: softmax}
  - {name: mix, type: add, inputs: [fc, probs]}
  - {name: loss, type: cross_entropy}
"""

TOKEN_OPS = """
name: token-ops
input: {tokens: 12}
layers:
  - {name: embed, type: embedding, vocab: 50, dim: 16, positions: 12, token_types: 2}
  - {name: heads, type: reshape, shape: [4, 12, 4]}
  - {name: core, type: sdpa, causal: true, inputs: [heads, heads, heads]}
  - {name: kt, type: reshape, shape: [4, 4, 12]}
  - {name: mm, type: matmul, inputs: [core, kt]}
  - {name: back, type: reshape, shape: [12, 48]}
  - {name: proj, type: linear, out_features: 16}
  - {name: attn, type: attention, heads: 4, kv_heads: 2, causal: true}
  - {name: rope, type: attention, heads: 4, kv_heads: 1, causal: true, bias: false, rotary: true}
  - {name: rms, type: rmsnorm}
  - {name: up, type: linear, out_features: 64, bias: false}
  - {name: swiglu, type: swiglu}
  - {name: up2, type: linear, out_features: 32}
  - {name: geglu, type: geglu}
  - {name: moe, type: moe, experts: 4, top_k: 2, ffn_hidden: 8, shared_experts: 1}
  - {name: mla, type: mla, heads: 2, q_lora: 8, kv_lora: 6, qk_nope_dim: 4, qk_rope_dim: 2, v_head_dim: 4, causal: true}
  - {name: lstm, type: lstm, hidden: 8, layers: 2, bidirectional: true}
  - {name: gru, type: gru, hidden: 16}
  - {name: rnn, type: rnn, hidden: 16, bias: false}
  - {name: head, type: linear, out_features: 50, bias: false, tied_to: embed}
  - {name: loss, type: cross_entropy}
"""


def from_text(tmp_path, text, name="m"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return load_model(path)


def n_params(net):
    return sum(p.numel() for p in net.parameters())  # shared (tied) parameters once


def test_every_operator_type_has_a_pytorch_module(tmp_path):
    covered = {layer.type for text in (IMAGE_OPS, TOKEN_OPS) for layer in from_text(tmp_path, text).layers}
    assert covered == set(OPS) - {"generic"}  # an imported operator dlsim has no model for: see below


def test_a_generic_operator_is_not_rebuilt(tmp_path):
    text = """
name: g
input: {shape: [8]}
layers:
  - {name: fft, type: generic, op: aten.fft_fft, shape: [8], bytes: 128.0}
  - {name: fc, type: linear, out_features: 4}
"""
    with pytest.raises(SpecError, match="generic operator .aten.fft_fft. has no PyTorch rebuild"):
        build_torch_model(from_text(tmp_path, text))


@pytest.mark.parametrize("text", [IMAGE_OPS, TOKEN_OPS], ids=["image", "tokens"])
def test_small_models_build_run_and_learn(tmp_path, text):
    model = from_text(tmp_path, text)
    assert trace_on_meta(model, 4).mismatches(model, 4) == []
    torch.manual_seed(0)
    net = build_torch_model(model)
    assert n_params(net) == model.params
    x, y = example_batch(model, 4)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    losses = []
    for _ in range(25):
        opt.zero_grad()
        loss = net(x, y)
        loss.backward()
        losses.append(loss.item())
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
        opt.step()
    assert loss.dim() == 0 and math.isfinite(losses[0])
    assert losses[-1] < 0.8 * losses[0]  # it trains: 25 Adam steps on one batch reduce the loss


ZOO = sorted(p.stem for p in list_models())


@pytest.mark.parametrize("name", ZOO)
def test_zoo_parameter_counts_at_full_size(name):
    """Built on the meta device (no storage), so GPT-3 and the 1T-parameter model are built whole."""
    model = load_model(name)
    assert n_params(build_torch_model(model, device="meta")) == model.params


SMALL = {
    "gpt2": {"layers": 2, "hidden": 32, "heads": 4, "seq_len": 16, "positions": 16, "vocab": 64},
    "bert-base": {"layers": 2, "hidden": 32, "heads": 4, "seq_len": 16, "positions": 16, "vocab": 64},
    "megatron-gpt-1.7b": {"layers": 1, "hidden": 48, "heads": 6, "seq_len": 8, "vocab": 64},
    "lstm-lm": {"hidden": 24, "vocab": 40, "steps": 6},
}


@pytest.mark.parametrize("name,batch", [("lenet5", 8), ("resnet18", 2), ("googlenet", 1), *[(n, 3) for n in SMALL]])
def test_training_step_of_zoo_models(name, batch):
    """One real forward and backward pass on the CPU (transformers and the LSTM at reduced sizes)."""
    model = load_model(name, SMALL.get(name))
    torch.manual_seed(0)
    net = build_torch_model(model)
    x, y = example_batch(model, batch)
    if model.input_kind == "tokens":
        assert x.dtype == torch.int64 and x.shape == (batch, model.input_shape[0])
    loss = net(x, y)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in net.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_tied_output_projection_shares_the_token_table():
    model = load_model("gpt2", SMALL["gpt2"])
    net = build_torch_model(model)
    assert net.layers["lm_head"].weight is net.layers["embed"].tokens.weight
    x, y = example_batch(model, 2)
    net(x, y).backward()
    # the shared table gets gradient from the lookup (only the rows used) and from the output projection
    # (every row), so rows never looked up still have a gradient
    unused = torch.ones(64, dtype=torch.bool)
    unused[x.flatten()] = False
    assert unused.any() and (net.layers["embed"].tokens.weight.grad[unused].abs().sum(1) > 0).all()


def test_missing_target_for_a_loss_is_an_error():
    model = load_model("lenet5")
    net = build_torch_model(model)
    x, _ = example_batch(model, 2)
    with pytest.raises(ValueError, match="loss"):
        net(x)


def _attention_model(tmp_path, heads, kv_heads, causal):
    text = f"""
name: attn
input: {{tokens: 10}}
layers:
  - {{name: embed, type: embedding, vocab: 20, dim: 24}}
  - {{name: attn, type: attention, heads: {heads}, kv_heads: {kv_heads}, causal: {str(causal).lower()}}}
"""
    return from_text(tmp_path, text, f"attn{heads}{kv_heads}{causal}")


@pytest.mark.parametrize("heads,kv_heads,causal", [(4, 4, False), (4, 4, True), (6, 2, True), (6, 1, False)])
def test_explicit_attention_equals_pytorch_sdpa(tmp_path, heads, kv_heads, causal):
    model = _attention_model(tmp_path, heads, kv_heads, causal)
    torch.manual_seed(0)
    math_net = build_torch_model(model).eval()
    sdpa_net = build_torch_model(model, attention="sdpa").eval()
    sdpa_net.load_state_dict(math_net.state_dict())
    x, _ = example_batch(model, 3)
    with torch.no_grad():
        assert torch.allclose(math_net(x), sdpa_net(x), atol=1e-5)


def test_attention_equals_nn_multihead_attention(tmp_path):
    """Independent reference: torch.nn.MultiheadAttention with the same Q/K/V and output weights."""
    model = _attention_model(tmp_path, 4, 4, False)
    torch.manual_seed(1)
    net = build_torch_model(model).eval()
    attn = net.layers["attn"]
    mha = torch.nn.MultiheadAttention(24, 4, batch_first=True).eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(attn.qkv.weight)
        mha.in_proj_bias.copy_(attn.qkv.bias)
        mha.out_proj.weight.copy_(attn.out.weight)
        mha.out_proj.bias.copy_(attn.out.bias)
        h = torch.randn(2, 10, 24)
        assert torch.allclose(attn(h), mha(h, h, h, need_weights=False)[0], atol=1e-5)


def test_embedding_sums_token_position_and_type_rows(tmp_path):
    model = from_text(tmp_path, TOKEN_OPS)
    net = build_torch_model(model)
    emb = net.layers["embed"]
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]])
    want = emb.tokens.weight[ids] + emb.positions.weight[:12] + emb.token_types.weight[0]
    assert torch.allclose(emb(ids), want)


def test_example_batch():
    model = load_model("bert-base", SMALL["bert-base"])
    x, y = example_batch(model, 5)
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (5, 16)
    assert 0 <= int(x.min()) and int(x.max()) < 64
    x, y = example_batch(load_model("lenet5"), 5)
    assert x.dtype == torch.float32 and x.shape == (5, 1, 32, 32) and y.shape == (5,) and int(y.max()) < 10
    x2, _ = example_batch(load_model("lenet5"), 5)
    assert torch.equal(x, x2)  # seeded


def test_dtype_and_module_names():
    model = load_model("resnet18")
    net = build_torch_model(model, device="meta", dtype="bf16")
    assert {p.dtype for p in net.parameters()} == {torch.bfloat16}
    assert module_key("layer1.0.conv1") in net.layers
    assert torch_dtype("fp16") is torch.float16
    with pytest.raises(SpecError, match="dtype"):
        torch_dtype("int8")


@pytest.mark.parametrize("layers,reason", [
    ("[{name: c, type: conv2d, out_channels: 4, kernel: 3},"
     " {name: p, type: avgpool, kernel: 2, dilation: 2}]", "no dilation"),
    ("[{name: p, type: maxpool, kernel: 3, padding: 2}]", "padding <= kernel/2"),
])
def test_what_pytorch_cannot_run_is_a_spec_error(tmp_path, layers, reason):
    model = from_text(tmp_path, f"name: bad\ninput: {{shape: [3, 12, 12]}}\nlayers: {layers}\n")
    with pytest.raises(SpecError, match=reason):
        build_torch_model(model, device="meta")


def test_tied_weight_of_the_wrong_shape_is_a_spec_error(tmp_path):
    text = """
name: bad-tie
input: {tokens: 12}
layers:
  - {name: embed, type: embedding, vocab: 50, dim: 16}
  - {name: lstm, type: lstm, hidden: 8}
  - {name: head, type: linear, out_features: 50, bias: false, tied_to: embed}
"""
    model = from_text(tmp_path, text)  # dlsim accepts it: a tied layer has no weight of its own
    with pytest.raises(SpecError, match=r"tied_to 'embed' has \[50, 16\], this layer needs a weight of \[50, 8\]"):
        build_torch_model(model, device="meta")
