"""Fused operators (scaled dot-product attention, LSTM/GRU/RNN) calibrated and priced as the one operator
PyTorch runs, not as the sum of their GEMMs (`dlsim.cost.pricing.WHOLE_KERNEL_OPS`)."""

from __future__ import annotations

import pytest

from dlsim.calibrate.compute_ops import memory_op
from dlsim.calibrate.compute_plan import MemoryTask, model_tasks
from dlsim.cost.layers import layer_cost
from dlsim.cost.lookup import MeasuredKernelTimes, MemoryRow
from dlsim.cost.pricing import price_layer
from dlsim.io.profile_yaml import load_profile
from dlsim.results import Source
from dlsim.spec.model import build_model

SDPA = {"name": "att", "type": "sdpa", "inputs": ["input", "input", "input"], "causal": True, "dropout": 0.0}
LSTM = {"name": "rnn", "type": "lstm", "hidden": 16, "layers": 2, "bias": True, "bidirectional": True}
UP = {"name": "up", "type": "conv_transpose2d", "out_channels": 4, "kernel": 2, "stride": 2, "bias": True}


def layer(entry: dict, shape: tuple) -> object:
    return build_model("m", "fp32", shape, "tensor", [entry]).layers[0]


@pytest.mark.torch
@pytest.mark.parametrize("entry,shape", [(SDPA, (4, 8, 16)), (LSTM, (6, 8)), (UP, (8, 5, 5))])
def test_plan_times_the_operator_forward_and_whole_backward(entry, shape):
    lay = layer(entry, shape)
    tasks = model_tasks(build_model("m", "fp32", shape, "tensor", [entry]), 3, "fp32")
    mem = [t for t in tasks if isinstance(t, MemoryTask) and t.layer.type == entry["type"]]
    assert sorted(t.pass_name for t in mem) == ["backward_data", "forward"]
    fwd = memory_op(lay, 3, "forward", "fp32", "cpu")()
    assert tuple(fwd.shape) == (3, *lay.out_shape)
    grads = memory_op(lay, 3, "backward_data", "fp32", "cpu")()
    # sdpa: ∇q, ∇k, ∇v; lstm: ∇x and the 2 layers x 2 directions x 4 weight tensors; transposed conv: ∇x, ∇w, ∇b
    assert len(grads) == {"sdpa": 3, "lstm": 1 + 2 * 2 * 4, "conv_transpose2d": 3}[entry["type"]]


def test_priced_from_its_rows_with_wgrad_inside_and_gemms_without_them():
    lay = layer(LSTM, (6, 8))
    cost = layer_cost(lay, 3, "fp32")
    device = load_profile("cpu-epyc-2core").device
    rows = [MemoryRow("fp32", "lstm", "forward", "s", cost.forward.bytes, cost.forward.flops, 2e-3),
            MemoryRow("fp32", "lstm", "backward_data", "s", cost.backward_data.bytes, cost.backward_data.flops, 5e-3)]
    timed = price_layer(lay, 3, "fp32", device, MeasuredKernelTimes(memory=rows))
    assert (timed.forward.seconds, timed.backward_data.seconds, timed.backward_weight.seconds) == (2e-3, 5e-3, 0.0)
    assert timed.forward.source == Source.MEASURED and "inside" in timed.backward_weight.note
    # a row of another shape is not interpolated onto this one: the GEMMs price it (here by the roofline)
    other = layer(LSTM, (12, 8))
    fallback = price_layer(other, 3, "fp32", device, MeasuredKernelTimes(memory=rows))
    assert fallback.backward_weight.seconds > 0 and fallback.forward.seconds != 2e-3


def test_a_fused_layer_on_the_input_keeps_its_whole_backward_and_pays_one_call_of_host_time():
    """A first LSTM (its input needs no gradient) priced from its rows: the fused backward runs whole (its
    row), not the GEMM-priced internal part; the host charge is one call per pass, not the ~19 operators
    per step and layer the composite dispatches inside the timed call."""
    from dataclasses import replace

    from dlsim.cost.gradflow import backward_data_run
    from dlsim.cost.hostops import HostOpCost

    lay = layer(LSTM, (6, 8))
    cost = layer_cost(lay, 3, "fp32")
    device = load_profile("cpu-epyc-2core").device
    rows = [MemoryRow("fp32", "lstm", "forward", "s", cost.forward.bytes, cost.forward.flops, 2e-3),
            MemoryRow("fp32", "lstm", "backward_data", "s", cost.backward_data.bytes, cost.backward_data.flops, 5e-3)]
    runs = backward_data_run(lay, cost, frozenset({"input"}))
    assert runs is cost.internal_backward and 0 < runs.flops < cost.backward_data.flops
    timed = price_layer(lay, 3, "fp32", device, MeasuredKernelTimes(memory=rows), cost, backward_data=runs)
    assert timed.backward_data.seconds == 5e-3 and timed.backward_data.source == Source.MEASURED
    host = HostOpCost(forward_s=7e-6, backward_s=4e-6)
    counted = replace(lay, attrs={**lay.attrs, "host_ops": [120, 110]})
    assert host.charges(counted) == pytest.approx({"forward": 120 * 7e-6, "backward_data": 110 * 4e-6})
    assert host.charges(counted, fused=True) == pytest.approx({"forward": 7e-6, "backward_data": 4e-6})
