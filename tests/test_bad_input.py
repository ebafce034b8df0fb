"""Bad descriptions give one line naming file, field and reason, and exit code 1 (issue 2 acceptance)."""

import pytest

GOOD = """
name: tiny
input: {shape: [3, 8, 8]}
layers:
  - {name: conv, type: conv2d, out_channels: 4, kernel: 3}
  - {name: flat, type: flatten}
  - {name: fc, type: linear, out_features: 10}
"""


def write(tmp_path, text, name="m.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("text,field,reason", [
    ("name: x\ninput: {shape: [3, 8, 8]\nlayers: []\n", "line", "malformed YAML"),
    (GOOD.replace("type: flatten", "type: flattenn"), "layers[1] 'flat'.type", "unknown layer type 'flattenn'"),
    (GOOD.replace("out_features: 10", "bias: true"), "layers[2] 'fc'.out_features", "missing required field"),
    (GOOD.replace("kernel: 3}", "kernel: 9}"), "layer 'conv'", "does not fit input 8x8"),
    (GOOD.replace("out_channels: 4", "out_channels: -4"), "layer 'conv'", "out_channels must be a positive integer"),
    (GOOD.replace("[3, 8, 8]", "[3, -8, 8]"), "input", "input shape must be positive integers"),
    (GOOD.replace("type: flatten}", "type: add, inputs: [conv, input]}"), "layer 'flat'", "input shapes differ"),
    (GOOD.replace("kernel: 3}", "kernel: 3, strides: 2}"), "layers[0] 'conv'.strides", "unknown field"),
    (GOOD + "  - {name: fc, type: relu}\n", "layers[3] 'fc'", "duplicate layer name"),
    (GOOD.replace("type: flatten}", "type: flatten, inputs: [nowhere]}"), "inputs", "'nowhere' is not a layer"),
])
def test_bad_model_one_line_exit_1(tmp_path, cli, text, field, reason):
    path = write(tmp_path, text)
    code, out, err = cli("model", "show", path)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert str(path) in err and field in err and reason in err
    assert "Traceback" not in err


def test_good_model_loads(tmp_path, cli):
    code, out, err = cli("model", "show", write(tmp_path, GOOD), "--batch", "2")
    assert code == 0 and "conv2d" in out and "2x4x6x6" in out


@pytest.mark.parametrize("args,needle", [
    (["estimate", "resnet50", "--cluster", "no-such-profile"], "no-such-profile: no such profile"),
    (["estimate", "resnet50", "--cluster", "dgx-h100", "--batch", "0"], "batch must be a positive integer"),
    (["estimate", "resnet50", "--cluster", "dgx-h100", "--dtype", "fp13"], "unknown dtype 'fp13'"),
    (["estimate", "nope", "--cluster", "dgx-h100"], "no such model"),
    (["estimate", "resnet50", "--cluster", "dgx-h100", "--set", "depths"], "--set needs KEY=VALUE"),
    (["estimate", "resnet50", "--cluster", "dgx-h100", "--set", "width=3"], "unknown parameter 'width'"),
])
def test_bad_cli_arguments(cli, args, needle):
    code, out, err = cli(*args)
    assert code == 1 and needle in err and err.count("\n") == 1


PROFILE = """
name: p
device: {peak_tflops: {fp32: 10}, memory_gib: 16, memory_bandwidth_gbytes_per_s: 700}
intra_node: {latency_us: 5, bandwidth_gbytes_per_s: 20}
"""


@pytest.mark.parametrize("text,needle", [
    (PROFILE.replace("bandwidth_gbytes_per_s: 20", "bandwidth_gbytes_per_s: -20"), "intra_node.bandwidth_gbytes_per_s: must be positive"),
    (PROFILE.replace("memory_gib: 16, ", ""), "device.memory_gib: missing required field"),
    (PROFILE + "nodes: 4\n", "inter_node: nodes=4 needs an inter_node link tier"),
    (PROFILE.replace("latency_us: 5", "latency_us: 5, topology: hypercube"), "unknown topology 'hypercube'"),
    (PROFILE.replace("{fp32: 10}", "{fp33: 10}"), "device.peak_tflops.fp33: unknown key 'fp33'"),
])
def test_bad_profile(tmp_path, cli, text, needle):
    folder = tmp_path / "prof"
    folder.mkdir()
    (folder / "profile.yaml").write_text(text)
    code, out, err = cli("estimate", "resnet50", "--cluster", folder)
    assert code == 1 and needle in err and err.count("\n") == 1
