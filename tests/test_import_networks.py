"""Ten ordinary PyTorch networks (tests/torchnets.py) imported at the operator level: parameters
exact, forward and backward FLOPs within 2% of PyTorch's FLOP counter on a real training step
(forward, then loss.backward()); data-dependent control flow refused in one line.

The counter is `torch.utils.flop_counter.FlopCounterMode` with two corrections
(`dlsim.importers.torch_meter.counter`): it counts the fused CPU attention kernel with its own SDPA
formulas (torch 2.13 leaves that kernel out), and a grouped convolution's weight gradient over the
channel pairs of its groups (torch's formula pairs all channels: MobileNetV2's depthwise ∇w would
count 16-96x). The counter runs with oneDNN off, so that nn.LSTM runs PyTorch's composite kernels,
which the counter sees (its oneDNN kernel counts zero).
"""

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

import torchnets  # noqa: E402

TOLERANCE = torchnets.COUNT_TOLERANCE
pytestmark = pytest.mark.filterwarnings("ignore:TF32 acceleration")


@pytest.fixture(scope="module")
def imported():
    from dlsim.api.importers import import_torch_module

    out = {}
    for name in torchnets.NETWORKS:
        net, x = torchnets.build(name)
        out[name] = (net, x, import_torch_module(net, [x], name=name))
    return out


@pytest.mark.parametrize("name", list(torchnets.NETWORKS))
def test_network_imports_with_exact_parameters_and_flops(imported, name):
    net, x, result = imported[name]
    torchnets.assert_counts_match(result.model, net, x)
    assert 0.0 <= result.fallback_share < 0.5


def test_operators_map_onto_dlsim_operators(imported):
    """The operators the issue names land on dlsim's own operators, not the generic one."""
    types = {name: {layer.type for layer in r.model.layers} for name, (_, _, r) in imported.items()}
    assert {"conv2d", "relu6", "batchnorm"} <= types["mobilenetv2"]
    assert any(layer.attrs.get("groups", 1) > 1 for layer in imported["mobilenetv2"][2].model.layers)
    assert {"conv2d", "maxpool", "add", "global_avgpool", "linear"} <= types["resnet"]
    assert {"sdpa", "layernorm", "gelu", "dropout"} <= types["vit"]
    assert {"sdpa", "softmax"} - types["attention"] == {"softmax"} and "linear" in types["attention"]
    assert "lstm" in types["lstm_lm"] and "embedding" in types["lstm_lm"]
    assert {"conv_transpose2d", "groupnorm", "silu", "concat"} <= types["unet"]
    assert {"matmul", "softmax", "tanh", "reshape"} <= types["tensor_ops"]
    tied = [layer for layer in imported["gpt"][2].model.layers if layer.attrs.get("tied_to")]
    assert len(tied) == 1 and imported["gpt"][2].model.layer(tied[0].attrs["tied_to"]).type == "embedding"


def test_yaml_round_trips_with_blocks(imported, tmp_path):
    """The written YAML groups repeated modules into blocks and loads back into the same model."""
    from dlsim.io.model_yaml import load_model

    result = imported["resnet"][2]
    assert "BasicBlock" in result.description["blocks"]
    path = tmp_path / "resnet.yaml"
    path.write_text(result.text)
    again = load_model(path)
    assert [(layer.name, layer.type, layer.out_shape) for layer in again.layers] == \
        [(layer.name, layer.type, layer.out_shape) for layer in result.model.layers]
    assert any(layer.name.startswith("layer1.") for layer in again.layers)


def test_imported_network_simulates(imported, tmp_path, cli):
    path = tmp_path / "gpt.yaml"
    path.write_text(imported["gpt"][2].text)
    code, out, err = cli("simulate", path, "--cluster", "cpu-epyc-2core", "--microbatch-size", "4")
    assert code == 0, err


def test_data_dependent_control_flow_fails_in_one_line(tmp_path, cli):
    import pathlib

    src = pathlib.Path(torchnets.__file__)
    code, out, err = cli("import", "torch", f"{src}:Branchy", "--input-shape", "16")
    assert code == 1 and err.count("\n") == 1 and "data-dependent control flow" in err, err


@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory):
    pytest.importorskip("onnx")
    folder = tmp_path_factory.mktemp("onnx")
    out = {}
    for name in torchnets.NETWORKS:
        net, x = torchnets.build(name)
        out[name] = folder / f"{name}.onnx"
        torchnets.export_onnx(net, x, out[name])
    return out


@pytest.mark.parametrize("name", list(torchnets.NETWORKS))
def test_onnx_export_imports_with_the_same_counts(imported, onnx_files, name):
    """The ONNX export (TorchScript exporter, training mode) imports with the same parameters and forward FLOPs."""
    from dlsim.api.importers import import_onnx_file
    from dlsim.cost.counted import counted_flops

    net, x, from_torch = imported[name]
    result = import_onnx_file(onnx_files[name], name=name)
    assert result.model.params == from_torch.model.params == sum(p.numel() for p in net.parameters())
    fwd, _ = counted_flops(result.model, x.shape[0])
    want, _ = counted_flops(from_torch.model, x.shape[0])
    assert abs(fwd - want) <= TOLERANCE * want, (fwd, want)
    assert result.model.input_shape == from_torch.model.input_shape


def test_onnx_import_runs_without_torch_and_reports(onnx_files, tmp_path):
    """`dlsim import onnx` in a process where torch cannot be imported: YAML written, report on stderr."""
    import subprocess
    import sys

    out = tmp_path / "unet.yaml"
    code = ("import sys; sys.modules['torch'] = None\n"
            "from dlsim.cli import run\n"
            f"sys.exit(run(['import', 'onnx', {str(onnx_files['unet'])!r}, '-o', {str(out)!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "generic Mul" in done.stderr and "% of the predicted step" in done.stderr
    from dlsim.io.model_yaml import load_model
    assert load_model(out).params == sum(p.numel() for p in torchnets.UNet().parameters())


def test_onnx_bad_file_is_one_line(tmp_path, cli):
    pytest.importorskip("onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf")
    code, _, err = cli("import", "onnx", bad)
    assert code == 1 and err.count("\n") == 1 and "not a valid ONNX model" in err


def test_onnx_export_with_a_fixed_batch_imports(imported, tmp_path):
    """An export without a dynamic batch cannot be re-inferred at another batch: the samples are taken
    along dimension 0, with a note, and the counts still match."""
    pytest.importorskip("onnx")
    from dlsim.api.importers import import_onnx_file
    from dlsim.cost.counted import counted_flops

    net, x = torchnets.build("gpt")
    path = tmp_path / "gpt-static.onnx"
    torchnets.export_onnx(net, x, path, input_names=None, dynamic_axes=None)
    result = import_onnx_file(path)
    want = imported["gpt"][2].model
    assert result.model.params == want.params
    assert counted_flops(result.model, 2)[0] == counted_flops(want, 2)[0]
    assert any("batch is fixed at 2" in note for note in result.notes)


def test_force_never_lets_the_output_replace_the_input(onnx_files, tmp_path, cli):
    """`--out` naming the ONNX file or the factory's own .py is refused in one line, --force or not;
    both inputs are left as they were."""
    onnx_copy = tmp_path / "wide.onnx"
    onnx_copy.write_bytes(onnx_files["wide_mlp"].read_bytes())
    before = onnx_copy.read_bytes()
    code, _, err = cli("import", "onnx", onnx_copy, "-o", onnx_copy, "--force")
    assert code == 1 and err.count("\n") == 1 and "is an input of this run" in err
    assert onnx_copy.read_bytes() == before
    src = tmp_path / "mlp.py"
    src.write_text("import torch\n\ndef make():\n    return torch.nn.Linear(4, 3)\n")
    text = src.read_text()
    code, _, err = cli("import", "torch", f"{src}:make", "--input-shape", "4", "-o", src, "--force")
    assert code == 1 and err.count("\n") == 1 and "is an input of this run" in err
    assert src.read_text() == text
