"""Forward FLOPs of the zoo three ways: dlsim's per-layer matmul FLOPs (`layer_cost(...).matmul_flops`)
against PyTorch's `FlopCounterMode` on the equivalent PyTorch model, against published counts, and
against Megatron-LM's closed form.

FlopCounterMode counts matmul-class operators only (convolution, mm, addmm, bmm, attention), a
multiply-accumulate as 2 FLOPs, biases not counted; `matmul_flops` follows the same convention. The
PyTorch model runs on meta tensors (shapes without storage), so no memory or arithmetic is spent;
GPT-3 and the Megatron models are compared with 2 of their blocks at full width.
"""

import pytest

from dlsim.cost.layers import layer_cost
from dlsim.io.model_yaml import load_model
from dlsim.io.paths import list_models, resolve_model
from dlsim.io.yamlfile import read_yaml

ZOO = sorted(p.stem for p in list_models())
BATCH = 2


def matmul_flops(model, batch):
    return sum(layer_cost(layer, batch).matmul_flops for layer in model.layers)


def reduced(name):
    if name == "deepseek-v3":
        return {"layers": 3, "dense_layers": 1}
    return {"layers": 2} if name.startswith(("gpt3", "megatron", "llama", "mixtral")) else None


@pytest.mark.torch
@pytest.mark.parametrize("name", ZOO)
def test_forward_flops_match_pytorch_flop_counter(name):
    pytest.importorskip("torch")
    from dlsim.validate.torch_model import trace_on_meta

    model = load_model(name, reduced(name))
    trace = trace_on_meta(model, BATCH)
    ours = matmul_flops(model, BATCH)
    assert trace.flops > 0
    assert abs(ours - trace.flops) <= 0.02 * trace.flops, f"{name}: dlsim {ours:.6g}, torch {trace.flops:.6g}"
    assert trace.mismatches(model, BATCH) == []  # and the PyTorch model has every dlsim shape


@pytest.mark.torch
def test_meta_counting_equals_counting_real_tensors():
    """The meta run counts what a real CPU run counts (small models, to keep it quick)."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from dlsim.validate.torch_model import build_torch_model, example_batch, trace_on_meta

    tiny_gpt = load_model("gpt2", {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 16, "vocab": 100})
    for model in (load_model("lenet5"), tiny_gpt):
        net = build_torch_model(model)
        x, y = example_batch(model, BATCH)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            net(x, y)
        assert counter.get_total_flops() == trace_on_meta(model, BATCH).flops == matmul_flops(model, BATCH)


# torchvision weights metadata "_ops": GFLOPS at 224x224 as torchvision counts them, i.e. billions of
# multiply-adds of convolutions and linear layers (torchvision/models/*.py, *_Weights.IMAGENET1K_V1.meta).
TORCHVISION_GMACS = {"alexnet": 0.714, "vgg16": 15.47, "vgg19": 19.632, "resnet18": 1.814, "resnet34": 3.664,
                     "resnet50": 4.089, "resnet101": 7.801, "resnet152": 11.514, "densenet121": 2.834,
                     "densenet169": 3.36, "densenet201": 4.291}


@pytest.mark.parametrize("name,gmacs", sorted(TORCHVISION_GMACS.items()))
def test_forward_flops_match_published(name, gmacs):
    ours = matmul_flops(load_model(name), 1)
    assert ours / 2 / 1e9 == pytest.approx(gmacs, rel=0.01)
    assert read_yaml(resolve_model(name))["published"]["forward_gflops"] == pytest.approx(2 * gmacs)


@pytest.mark.parametrize("name", [n for n in ZOO if n.startswith("megatron")] + ["gpt3-175b"])
def test_transformer_flops_follow_the_megatron_formula(name):
    """Narayanan et al. SC'21 (§5.1, appendix): an iteration with activation recomputation costs
    F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)): the blocks run forward 4 times (forward, recompute,
    backward = 2), the logits 3 times. One forward pass is thus 24·B·s·l·h²·(1 + s/(6h)) + 2·B·s·h·V;
    full sizes, exact integers."""
    model = load_model(name)
    p = model.params_used
    b, s, l, h, v = BATCH, p["seq_len"], p["layers"], p["hidden"], p["vocab"]
    assert matmul_flops(model, b) == 24 * b * s * l * h * h + 4 * b * s * s * l * h + 2 * b * s * h * v


def test_lstm_lm_flops_by_hand():
    """Per layer and step 4 gate GEMMs over [x, h] (1500 + 1500 inputs), then the 10k-way softmax layer."""
    b, steps, h, v = BATCH, 35, 1500, 10_000
    expected = 2 * (2 * b * steps * 4 * h * (h + h)) + 2 * b * steps * h * v
    assert matmul_flops(load_model("lstm-lm"), b) == expected
