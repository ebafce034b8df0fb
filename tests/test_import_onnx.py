"""`dlsim import onnx` on the operators and patterns the ten networks of tests/test_import_networks.py
leave out: every network here is exported for training (tests/torchnets.py `export_onnx`) and must import
with its parameters exact and its forward and backward FLOPs within 2% of PyTorch's counter on a real
training step (`torchnets.counted_by_torch`)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
nn = torch.nn

import torchnets  # noqa: E402

TOLERANCE = 0.02
pytestmark = pytest.mark.filterwarnings("ignore:TF32 acceleration")


class Conv3dFirst(nn.Module):
    """A first layer dlsim has no operator for (a 3-D convolution): generic, with weights, its input
    needing no gradient: its backward is its weight gradient alone."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv3d(3, 8, 3, padding=1)

    def forward(self, x):
        return self.c(x)


class AsymPadFirst(nn.Module):
    """'same' padding of an even kernel: asymmetric pads, which dlsim's conv2d does not take."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 4, padding="same")
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(self.c(x).mean(dim=(2, 3)))


class Einsum3(nn.Module):
    """Three-operand einsums: torch contracts them pairwise, left to right (two bmm each); the second
    reads the network's input, whose gradient autograd does not compute."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x):  # (B, 8, 16)
        h = self.a(x)
        q = torch.einsum("bij,bkj,bkl->bil", h, h, h)
        r = torch.einsum("bij,bjk,bkl->bil", q, self.b(x).transpose(1, 2), x)
        return self.out(r.mean(1))


NETS = {
    "conv3d_first": (Conv3dFirst, (3, 4, 8, 8)),
    "asym_pad_first": (AsymPadFirst, (3, 8, 8)),
    "einsum3": (Einsum3, (8, 16)),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    from dlsim.api.importers import import_onnx_file

    folder = tmp_path_factory.mktemp("onnx")
    out = {}
    for name, (factory, shape) in NETS.items():
        torch.manual_seed(0)
        net, x = factory(), torch.randn(torchnets.BATCH, *shape)
        path = folder / f"{name}.onnx"
        torchnets.export_onnx(net, x, path)
        out[name] = (net, x, import_onnx_file(path, name=name))
    return out


@pytest.mark.parametrize("name", list(NETS))
def test_counts_match_pytorch(imported, name):
    from dlsim.cost.counted import counted_flops

    net, x, result = imported[name]
    assert result.model.params == sum(p.numel() for p in net.parameters())
    fwd, bwd = counted_flops(result.model, x.shape[0])
    want_fwd, want_bwd = torchnets.counted_by_torch(net, x)
    assert want_fwd > 0 and want_bwd > 0
    assert abs(fwd - want_fwd) <= TOLERANCE * want_fwd, (fwd, want_fwd)
    assert abs(bwd - want_bwd) <= TOLERANCE * want_bwd, (bwd, want_bwd)


def test_a_generic_first_layer_keeps_its_weight_gradient(imported):
    """The 3-D convolution reads the input: no input gradient, and a weight gradient of the forward's size."""
    (conv,) = imported["conv3d_first"][2].model.layers
    assert conv.type == "generic" and conv.params == 8 * 3 * 27 + 8
    assert conv.attrs["wgrad_flops"] == conv.attrs["flops"] > 0
    assert conv.attrs["grad_flops"] == 0


def test_einsum_is_contracted_pairwise(imported):
    """Per sample: the first einsum two bmm of 8·8·16 multiply-adds; the second two of 8·8·16, and its
    backward the gradients of q and of b(x) only (x needs none): 3 of its 4 products' gradients."""
    einsums = [layer for layer in imported["einsum3"][2].model.layers if layer.attrs.get("op") == "Einsum"]
    assert [layer.attrs["flops"] for layer in einsums] == [2 * 2 * 8 * 8 * 16] * 2
    assert [layer.attrs["grad_flops"] for layer in einsums] == [4 * 2 * 8 * 8 * 16, 3 * 2 * 8 * 8 * 16]
