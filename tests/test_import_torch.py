"""Importing a PyTorch module: same parameters and matmul FLOPs as PyTorch counts."""

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

NET = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 16, 3, stride=2, padding=1, bias=False)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(0.1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.c1(x)))
        z = self.c2(y)
        z = torch.cat([z, z], 1)[:, :16] if False else z
        return self.fc(self.drop(torch.flatten(self.pool(z), 1)))


class Spectral(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.fft.fft(x).abs())


class Fixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(x.reshape(2, -1))  # a hard-coded batch: torch.export specialises it

'''


def test_import_matches_torch(tmp_path, cli):
    from torch.utils.flop_counter import FlopCounterMode

    from dlsim.cost.layers import layer_cost
    from dlsim.io.model_yaml import load_model

    src = tmp_path / "net.py"
    src.write_text(NET)
    out = tmp_path / "net.yaml"
    code, _, err = cli("import", "torch", f"{src}:Net", "--input-shape", "3,32,32", "--out", out)
    assert code == 0, err
    model = load_model(out)
    import importlib.util
    spec = importlib.util.spec_from_file_location("net_mod", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    net = mod.Net()
    assert model.params == sum(p.numel() for p in net.parameters())
    with FlopCounterMode(display=False) as counter:
        net(torch.randn(4, 3, 32, 32))
    ours = sum(layer_cost(layer, 4).matmul_flops for layer in model.layers)
    assert ours == counter.get_total_flops()
    # never overwrites without --force
    code, _, err = cli("import", "torch", f"{src}:Net", "--input-shape", "3,32,32", "--out", out)
    assert code == 1 and "exists" in err


def test_unknown_operator_falls_back_to_generic(tmp_path, cli):
    """An operator dlsim has no model for is imported as a generic layer and reported with its share."""
    from dlsim.io.model_yaml import load_model

    src = tmp_path / "spectral.py"
    src.write_text(NET)
    out = tmp_path / "spectral.yaml"
    code, _, err = cli("import", "torch", f"{src}:Spectral", "--input-shape", "8", "-o", out)
    assert code == 0, err
    model = load_model(out)
    kinds = {layer.attrs["op"] for layer in model.layers if layer.type == "generic"}
    assert "aten.fft_fft" in kinds and "aten.abs" in kinds
    assert "generic aten.fft_fft: 1 layer" in err and "% of the predicted step" in err
    assert model.params == 8 * 4 + 4


def test_specialised_batch_is_imported_with_a_note(tmp_path, cli):
    src = tmp_path / "fixed.py"
    src.write_text(NET)
    code, out, err = cli("import", "torch", f"{src}:Fixed", "--input-shape", "16")
    assert code == 0, err
    assert "input:\n  shape: [16]" in out and "specialised by torch.export" in err


def test_an_operator_that_cannot_be_rerun_is_priced_by_its_tensors(monkeypatch):
    """A traced network is never refused: an operator the meter cannot re-run alone is priced by the
    bytes of its tensors, and the import says so."""
    import dlsim.importers.torch_meter as meter
    from dlsim.api.importers import import_torch_module

    real = meter.measure_op

    def failing(fn, *args, **kwargs):
        if "fft" in str(fn):
            raise RuntimeError("cannot run alone")
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(meter, "measure_op", failing)
    namespace = {}
    exec(NET, namespace)
    result = import_torch_module(namespace["Spectral"](), [torch.randn(2, 8)])
    fft = next(layer for layer in result.model.layers if layer.attrs.get("op") == "aten.fft_fft")
    assert fft.attrs["bytes"] > 0 and fft.attrs["flops"] == 0
    assert any("aten.fft_fft" in note and "tensors' sizes" in note for note in result.notes)


class Reshapes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):                               # (B, 3, 4)
        flat = self.fc(x).reshape(x.shape[0], 12)       # contiguous: a view
        moved = self.fc(x).transpose(1, 2).reshape(x.shape[0], 12)  # non-contiguous: reshape copies
        return flat + moved


def test_a_reshape_that_copies_is_a_priced_copy_and_a_view_stays_free():
    from dlsim.importers.torch_export import capture
    nodes = capture(Reshapes(), (torch.randn(2, 3, 4),)).nodes
    views = sorted(n.source for n in nodes if n.entry["type"] == "reshape")
    copies = [n for n in nodes if n.entry["type"] == "generic" and n.entry["op"] == "aten.reshape"]
    assert views == ["aten.reshape", "aten.transpose"] and len(copies) == 1
    assert copies[0].entry["bytes"] == 2 * 12 * 4  # per sample: 12 fp32 elements read and 12 written


class MaskedSum(torch.nn.Module):
    """A boolean-mask select: its size is known only when it runs (an unbacked size in the capture)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, x):
        y = self.fc(x)
        return y + y[y > 0].sum()


def test_a_data_dependent_size_imports_with_the_example_run_shape():
    """torch.export captures the mask select (no control flow depends on the data): a traceable network
    is imported, the select a generic operator sized by the example run, the rest exact."""
    from dlsim.api.importers import import_torch_module
    from dlsim.cost.counted import counted_flops
    from dlsim.importers.torch_meter import counter

    torch.manual_seed(0)
    net, x = MaskedSum(), torch.randn(4, 16)
    result = import_torch_module(net, [x])
    with counter() as fwd:
        net(x)
    assert result.model.params == sum(p.numel() for p in net.parameters())
    assert counted_flops(result.model, 4)[0] == pytest.approx(fwd.get_total_flops(), rel=0.02)
    index = next(layer for layer in result.model.layers if layer.attrs.get("op") == "aten.index")
    assert index.attrs["bytes"] > 0


def test_a_bf16_module_is_traced_on_a_bf16_example(tmp_path, cli):
    """The example input takes the module's parameter dtype (an fp32 input into bf16 weights fails)."""
    src = tmp_path / "half.py"
    src.write_text("import torch, torch.nn as nn\n"
                   "def Net():\n    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(torch.bfloat16)\n")
    out = tmp_path / "half.yaml"
    code, _, err = cli("import", "torch", f"{src}:Net", "--input-shape", "32", "-o", out)
    assert code == 0, err
    assert "dtype: bf16" in out.read_text()


def test_an_example_input_larger_than_free_memory_is_one_line(tmp_path, cli):
    src = tmp_path / "net.py"
    src.write_text(NET)
    code, _, err = cli("import", "torch", f"{src}:Net", "--input-shape", "3,100000,100000", "--batch", "64")
    assert code == 1 and "more than the" in err and "GiB available here" in err and len(err.strip().splitlines()) == 1
