"""`dlsim import onnx` on the operators and patterns the ten networks of tests/test_import_networks.py
leave out: every network here is exported for training (tests/torchnets.py `export_onnx`) and must import
with its parameters exact and its forward and backward FLOPs within 2% of PyTorch's counter on a real
training step (`torchnets.counted_by_torch`)."""

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
nn = torch.nn

import torchnets  # noqa: E402

TOLERANCE = torchnets.COUNT_TOLERANCE
pytestmark = [pytest.mark.filterwarnings("ignore:TF32 acceleration"),
              pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")]


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


class EinsumOf(nn.Module):
    """One einsum of three copies of a linear layer's output, its equation as written (an ellipsis, an
    implicit output)."""

    def __init__(self, equation):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.equation = equation

    def forward(self, x):  # (B, 8, 16)
        h = self.a(x)
        return torch.einsum(self.equation, h, h, h)


class BehindLinear(nn.Module):
    """A recurrent layer behind a linear layer (so that its input needs a gradient), a linear head on its
    last step; batch first or, with transposes around it, sequence first."""

    def __init__(self, rnn, features):
        super().__init__()
        self.inp = nn.Linear(features, features)
        self.rnn = rnn
        self.fc = nn.Linear(rnn.hidden_size * (2 if rnn.bidirectional else 1), 2)

    def forward(self, x):  # (B, L, features)
        h = self.inp(x)
        if self.rnn.batch_first:
            return self.fc(self.rnn(h)[0][:, -1])
        return self.fc(self.rnn(h.transpose(0, 1))[0][-1])


class GRUFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(16, 32, batch_first=True)

    def forward(self, x):  # (B, 12, 16)
        return self.gru(x)[0]


class Bag(nn.Module):
    """nn.EmbeddingBag: the exporter writes it as a Loop over the bags, reading the table and the token
    ids from its body."""

    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(64, 16, mode="mean")
        self.fc = nn.Linear(16, 2)

    def forward(self, t):  # (B, 12) token ids
        return self.fc(self.bag(t))


class Repeat(nn.Module):
    """Control flow, exported from the scripted module (`script`): a Loop whose trip count is computed from
    the input's shape (`steps` "shape": x.size(1) // 4) or from its data ("data"); an If ("branch") whose
    branches cost differently."""

    script = True

    def __init__(self, steps: str):
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.w = nn.Parameter(torch.randn(16, 16) * 0.1)
        self.steps = steps

    def forward(self, x):  # (B, 12, 16), positive
        h = self.inp(x)
        if self.steps == "branch":
            return h @ self.w if bool(x.sum() > 0) else torch.tanh(h)
        for _ in range(x.size(1) // 4 if self.steps == "shape" else int((x > 0).sum()) % 3 + 1):
            h = torch.tanh(h @ self.w)
        return h


NETS = {
    "conv3d_first": (Conv3dFirst, (3, 4, 8, 8)),
    "asym_pad_first": (AsymPadFirst, (3, 8, 8)),
    "einsum3": (Einsum3, (8, 16)),
    "einsum_ellipsis": (lambda: EinsumOf("...ij,...kj,...kl->...il"), (8, 16)),
    "einsum_implicit": (lambda: EinsumOf("bij,bkj,bkl"), (8, 16)),
    # a stacked GRU: the exporter writes one GRU node per layer (linear_before_reset=1)
    "gru_after_linear": (lambda: BehindLinear(nn.GRU(16, 32, num_layers=2, batch_first=True), 16), (12, 16)),
    "bi_relu_rnn": (lambda: BehindLinear(nn.RNN(8, 16, nonlinearity="relu", bidirectional=True), 8), (10, 8)),
    "seq_first_lstm": (lambda: BehindLinear(nn.LSTM(8, 16), 8), (10, 8)),
    "bag": (Bag, (12,)),
    "loop": (lambda: Repeat("shape"), (12, 16)),
    "data_loop": (lambda: Repeat("data"), (12, 16)),
    "branch": (lambda: Repeat("branch"), (12, 16)),
}


def _build(factory, shape):
    """(module, example input): token ids below 64 for a 1-D per-sample shape, else positive floats."""
    torch.manual_seed(0)
    full = (torchnets.BATCH, *shape)
    return factory(), torch.randint(0, 64, full) if len(shape) == 1 else torch.randn(full).abs()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx")


@pytest.fixture(scope="module")
def imported(folder):
    from dlsim.api.importers import import_onnx_file

    out = {}
    for name, (factory, shape) in NETS.items():
        net, x = _build(factory, shape)
        torchnets.export_onnx(torch.jit.script(net) if getattr(net, "script", False) else net, x, folder / f"{name}.onnx")
        out[name] = (net, x, import_onnx_file(folder / f"{name}.onnx", name=name))
    return out


@pytest.mark.parametrize("name", list(NETS))
def test_counts_match_pytorch(imported, name):
    net, x, result = imported[name]
    torchnets.assert_counts_match(result.model, net, x)


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


def test_recurrent_nodes_map_onto_recurrent_layers(imported):
    """GRU, RNN (ReLU, bidirectional) and LSTM nodes become dlsim's gru, rnn and lstm layers, one per node."""
    def kinds(name):
        return [layer.type for layer in imported[name][2].model.layers if layer.type in ("gru", "rnn", "lstm")]
    assert kinds("gru_after_linear") == ["gru", "gru"]
    assert kinds("bi_relu_rnn") == ["rnn"]
    assert [layer.attrs["bidirectional"] for layer in imported["bi_relu_rnn"][2].model.layers if layer.type == "rnn"] == [True]
    assert kinds("seq_first_lstm") == ["lstm"]


def test_a_first_gru_imports_as_the_torch_importer_does(folder):
    """A GRU reading the network's input: the same layer and the same counts as `dlsim import torch`, and
    PyTorch's (its backward runs the gradient through time, not the input's)."""
    from dlsim.api.importers import import_onnx_file, import_torch_module
    from dlsim.cost.counted import counted_flops

    net, x = _build(GRUFirst, (12, 16))
    torchnets.export_onnx(net, x, folder / "gru_first.onnx")
    onnx_model = import_onnx_file(folder / "gru_first.onnx").model
    torch_model = import_torch_module(net, [x]).model
    assert [layer.type for layer in onnx_model.layers if layer.type != "reshape"] == ["gru"]
    assert onnx_model.params == torch_model.params == sum(p.numel() for p in net.parameters())
    assert counted_flops(onnx_model, 2) == counted_flops(torch_model, 2)
    fwd, bwd = counted_flops(onnx_model, 2)
    want_fwd, want_bwd = torchnets.counted_by_torch(net, x)
    assert fwd == want_fwd and abs(bwd - want_bwd) <= TOLERANCE * want_bwd, (bwd, want_bwd)


def test_a_peephole_lstm_is_a_generic_layer_with_the_gate_products(folder):
    """ONNX's LSTM with peepholes (P: 3·h weights more, element-wise) has no dlsim layer: it is priced as a
    generic layer whose matrix products are the LSTM's, so its counts are those of the same LSTM without
    peepholes in PyTorch, and its parameters those plus P."""
    import numpy as np
    import onnx

    from dlsim.api.importers import import_onnx_file
    from dlsim.cost.counted import counted_flops

    net, x = _build(*NETS["seq_first_lstm"])
    torchnets.export_onnx(net, x, folder / "lstm.onnx")
    model = onnx.load(str(folder / "lstm.onnx"))
    (lstm,) = [n for n in model.graph.node if n.op_type == "LSTM"]
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros((1, 48), np.float32), "P"))
    lstm.input.append("P")
    onnx.save(model, str(folder / "peephole.onnx"))
    result = import_onnx_file(folder / "peephole.onnx")
    (generic,) = [layer for layer in result.model.layers if layer.attrs.get("op") == "LSTM"]
    assert generic.type == "generic" and generic.params == 4 * 16 * (8 + 16) + 8 * 16 + 48
    assert result.model.params == sum(p.numel() for p in net.parameters()) + 48
    fwd, bwd = counted_flops(result.model, x.shape[0])
    want_fwd, want_bwd = torchnets.counted_by_torch(net, x)
    assert abs(fwd - want_fwd) <= TOLERANCE * want_fwd, (fwd, want_fwd)
    assert abs(bwd - want_bwd) <= TOLERANCE * want_bwd, (bwd, want_bwd)


def test_control_flow_is_priced_from_its_body(imported):
    """The EmbeddingBag's Loop holds the table (its parameters) and reads the token ids; a Loop runs its
    body trip-count times (3 here, from the input's shape); an If is priced as its costlier branch."""
    bag = [layer for layer in imported["bag"][2].model.layers if layer.type == "generic"]
    assert [(layer.attrs["op"], layer.params) for layer in bag] == [("Loop", 64 * 16)]
    (loop,) = [layer for layer in imported["loop"][2].model.layers if layer.type == "generic"]
    assert loop.params == 256 and loop.attrs["flops"] == 3 * 2 * 12 * 16 * 16
    assert loop.attrs["grad_flops"] == loop.attrs["wgrad_flops"] == loop.attrs["flops"]
    (branch,) = [layer for layer in imported["branch"][2].model.layers if layer.attrs.get("op") == "If"]
    assert branch.params == 256 and branch.attrs["flops"] == 2 * 12 * 16 * 16


def test_a_loop_of_unknown_trip_count_is_priced_once_and_said(imported):
    result = imported["data_loop"][2]
    (loop,) = [layer for layer in result.model.layers if layer.attrs.get("op") == "Loop"]
    assert loop.attrs["flops"] == 2 * 12 * 16 * 16
    assert any("trip count is known only when it runs; priced for one iteration" in note for note in result.notes)


class Buffers(nn.Module):
    """Registered buffers read by the computation: a float mask read through a comparison (no gradient
    reaches it), an additive causal mask of −inf (non-finite), and a fixed projection, which the file
    cannot tell from a parameter."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.register_buffer("keep", (torch.rand(8, 8) > 0.5).float())
        self.register_buffer("causal", torch.full((8, 8), float("-inf")).triu(1))
        self.register_buffer("proj", torch.randn(16, 4))

    def forward(self, x):  # (B, 8, 16)
        h = self.fc(x)
        scores = (h @ h.transpose(1, 2) + self.causal).masked_fill(self.keep == 0, -1e4).softmax(-1)
        return (scores @ h) @ self.proj


def test_buffers_are_not_parameters(folder):
    """Buffers no gradient can train are left out and named in the report; the projection, which ONNX
    cannot tell from a weight, is counted and named as doubtful, and left out when the user names it
    (`--buffers`): then parameters and counts are PyTorch's."""
    from dlsim.api.importers import import_onnx_file
    from dlsim.cost.counted import counted_flops

    net, x = _build(Buffers, (8, 16))
    torchnets.export_onnx(net, x, folder / "buffers.onnx")
    params = sum(p.numel() for p in net.parameters())
    guessed = import_onnx_file(folder / "buffers.onnx")
    assert guessed.model.params == params + 16 * 4
    notes = "\n".join(guessed.notes)
    assert "(no gradient reaches): keep" in notes and "(non-finite values): causal" in notes
    assert "read only outside a weight operand: proj (64)" in notes
    told = import_onnx_file(folder / "buffers.onnx", buffers=["proj"])
    assert told.model.params == params
    fwd, bwd = counted_flops(told.model, x.shape[0])
    want_fwd, want_bwd = torchnets.counted_by_torch(net, x)
    assert abs(fwd - want_fwd) <= TOLERANCE * want_fwd, (fwd, want_fwd)
    assert abs(bwd - want_bwd) <= TOLERANCE * want_bwd, (bwd, want_bwd)


def test_an_unknown_buffer_name_is_one_line(folder, cli):
    net, x = _build(Buffers, (8, 16))
    torchnets.export_onnx(net, x, folder / "buffers.onnx")
    code, _, err = cli("import", "onnx", folder / "buffers.onnx", "--buffers", "proj,nope")
    assert code == 1 and err.count("\n") == 1 and "--buffers: the graph has no initializer 'nope'" in err, err


def test_an_input_without_a_batch_dimension_or_a_directory_is_one_plain_line(tmp_path, cli):
    from onnx import TensorProto, helper, save

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    save(helper.make_model(graph), str(tmp_path / "rank1.onnx"))
    code, _, err = cli("import", "onnx", tmp_path / "rank1.onnx")
    assert code == 1 and err.count("\n") == 1 and "rank1.onnx: the graph input 'x' has shape [4]: it has no batch " \
        "dimension" in err and ".yaml" not in err, err
    (tmp_path / "adir.onnx").mkdir()
    code, _, err = cli("import", "onnx", tmp_path / "adir.onnx")
    assert code == 1 and err.count("\n") == 1 and "adir.onnx: is a directory, not an ONNX file" in err, err


def test_a_scan_runs_its_body_once_per_slice(tmp_path):
    """A Scan over the 6 steps of (batch, 6, 8) whose body multiplies each (batch, 8) slice by an outer
    (8, 8) weight: 6 products of 2·8·8 FLOPs per sample forward, and as many for the weight's gradient
    (the input needs none)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper, save

    from dlsim.api.importers import import_onnx_file

    body = helper.make_graph([helper.make_node("MatMul", ["x_t", "W"], ["y_t"])], "step",
                             [helper.make_tensor_value_info("x_t", TensorProto.FLOAT, ["batch", 8])],
                             [helper.make_tensor_value_info("y_t", TensorProto.FLOAT, ["batch", 8])])
    scan = helper.make_node("Scan", ["x"], ["ys"], body=body, num_scan_inputs=1, scan_input_axes=[1])
    graph = helper.make_graph([scan], "scan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6, 8])],
                              [helper.make_tensor_value_info("ys", TensorProto.FLOAT, [6, "batch", 8])],
                              [numpy_helper.from_array(np.ones((8, 8), np.float32), "W")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "scan.onnx"))
    (layer,) = import_onnx_file(tmp_path / "scan.onnx").model.layers
    assert (layer.attrs["op"], layer.params, layer.out_shape) == ("Scan", 64, (6, 8))
    assert layer.attrs["flops"] == layer.attrs["wgrad_flops"] == 6 * 2 * 8 * 8 and layer.attrs["grad_flops"] == 0
