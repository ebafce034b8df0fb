"""Layers that read the network's input directly, whose input needs no gradient: autograd still runs the
gradients inside them that their weights need (a recurrent layer's gradient through time and between
stacked layers, an attention's core) and skips only the products giving the input's gradient; a matrix
product of an activation with the input computes only the activation's gradient. The backward FLOPs of
the import must match PyTorch's counter on `loss.backward()` (within 2%, as tests/test_import_networks.py),
and the estimate must price that backward (it priced none of a first GRU's before)."""

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
nn = torch.nn

from torchnets import counted_by_torch  # noqa: E402

TOLERANCE = 0.02
pytestmark = pytest.mark.filterwarnings("ignore:TF32 acceleration")


class GRUFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(16, 32, batch_first=True)

    def forward(self, x):
        return self.gru(x)[0]


class StackedBiLSTMFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(16, 24, num_layers=2, bidirectional=True, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]


class AttentionFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.att = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x):
        return self.att(x, x, x, need_weights=False)[0]


class GramWithInput(nn.Module):
    """bmm(fc(x), xᵀ): only ∇(fc(x)) runs."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return torch.bmm(self.fc(x), x.transpose(1, 2))


class DroppedBranch(nn.Module):
    """A branch computed and then dropped (a WaveNet's last residual output): the backward never visits it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.unused = nn.Linear(16, 64)
        self.out = nn.Linear(16, 8)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        self.unused(h)
        return self.out(h)


NETWORKS = {"gru_first": GRUFirst, "stacked_bilstm_first": StackedBiLSTMFirst, "attention_first": AttentionFirst,
            "gram_with_input": GramWithInput, "dropped_branch": DroppedBranch}


@pytest.fixture(scope="module")
def imported():
    from dlsim.api.importers import import_torch_module

    out = {}
    for name, cls in NETWORKS.items():
        torch.manual_seed(0)
        net, x = cls().train(), torch.randn(2, 12, 16)
        out[name] = (net, x, import_torch_module(net, [x], name=name).model)
    return out


@pytest.mark.parametrize("name", list(NETWORKS))
def test_backward_flops_match_the_counter(imported, name):
    from dlsim.cost.counted import counted_flops

    net, x, model = imported[name]
    fwd, bwd = counted_flops(model, x.shape[0])
    want_fwd, want_bwd = counted_by_torch(net, x)
    assert abs(fwd - want_fwd) <= TOLERANCE * want_fwd, (fwd, want_fwd)
    assert abs(bwd - want_bwd) <= TOLERANCE * want_bwd, (bwd, want_bwd)


def test_first_recurrent_layer_keeps_its_gradient_through_time(imported):
    """Only the first layer's input GEMMs (N·L, F, g·h), one per direction, drop out of the ∇x pass."""
    from dlsim.cost.gradflow import backward_data_run, gradient_free
    from dlsim.cost.layers import Gemm, layer_cost

    model = imported["stacked_bilstm_first"][2]
    layer = next(layer for layer in model.layers if layer.type == "lstm")
    cost = layer_cost(layer, 2, model.dtype)
    runs = backward_data_run(layer, cost, gradient_free(model))
    dropped = Gemm(2 * 12, 16, 4 * 24)
    assert cost.backward_data.matmul_flops - runs.matmul_flops == pytest.approx(2 * dropped.flops)
    assert runs.kernels == cost.backward_data.kernels - 2 and runs.flops > 0


def test_estimate_prices_the_internal_backward(imported):
    from dlsim.api.estimate import estimate

    model = imported["gru_first"][2]
    result = estimate(model, "cpu-epyc-2core", batch=2, measured=False)
    gru = next(t for t in result.layers if t.type == "gru")
    assert gru.backward_data.seconds > 0 and "input needs no gradient" not in gru.backward_data.note


def test_a_dropped_branch_runs_forward_only(imported):
    """The dropped linear runs its forward but no backward, ∇x or ∇w."""
    from dlsim.api.estimate import estimate
    from dlsim.cost.gradflow import unreached_by_loss

    model = imported["dropped_branch"][2]
    unreached = unreached_by_loss(model)
    assert [model.layer(n).type for n in unreached] == ["linear"] and model.layer(next(iter(unreached))).params == 16 * 64 + 64
    timing = {t.name: t for t in estimate(model, "cpu-epyc-2core", batch=2, measured=False).layers}
    dropped = timing[next(iter(unreached))]
    assert dropped.forward.seconds > 0 and dropped.backward_data.seconds == dropped.backward_weight.seconds == 0
    kept = [t for n, t in timing.items() if model.layer(n).type == "linear" and n not in unreached]
    assert all(t.backward_weight.seconds > 0 for t in kept) and len(kept) == 2


def test_an_auxiliary_loss_branch_is_reached():
    """A side classifier ending in its own loss (GoogLeNet's) is differentiated with the main loss; a
    dropped branch is not."""
    from dlsim.cost.gradflow import unreached_by_loss
    from dlsim.spec.model import build_model

    entries = [{"name": "fc", "type": "linear", "out_features": 16},
               {"name": "aux_fc", "type": "linear", "out_features": 10, "inputs": ["fc"]},
               {"name": "aux_loss", "type": "cross_entropy", "inputs": ["aux_fc"]},
               {"name": "dropped", "type": "linear", "out_features": 4, "inputs": ["fc"]},
               {"name": "head", "type": "linear", "out_features": 10, "inputs": ["fc"]},
               {"name": "loss", "type": "cross_entropy", "inputs": ["head"]}]
    model = build_model("m", "fp32", (8,), "tensor", entries)
    assert unreached_by_loss(model) == {"dropped"}
