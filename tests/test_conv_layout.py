"""A convolution whose input is stored channels-last (NHWC: what ConvNeXt's permutes around its LayerNorm
leave behind) runs oneDNN's channels-last kernels, a different cost from the NCHW ones the tables held (a
depthwise 7×7 backward over 32 × 32 × 8 × 8: 751 against 2008 µs on the 2-core EPYC host, 2026-11-24).
The importer records the layout, calibration times that layout, and the lookup keeps the two apart."""

from __future__ import annotations

import pytest

from dlsim.calibrate.compute_plan import ConvTask, model_tasks
from dlsim.cost.layers import layer_cost
from dlsim.cost.lookup import CHANNELS_LAST, ConvRow, MeasuredKernelTimes, shape_of
from dlsim.cost.pricing import price_layer
from dlsim.errors import SpecError
from dlsim.io.profile_yaml import load_profile
from dlsim.spec.model import build_model


def depthwise(memory_format: str):
    entry = {"name": "dw", "type": "conv2d", "out_channels": 8, "kernel": 3, "padding": 1, "groups": 8,
             "memory_format": memory_format}
    return build_model("m", "fp32", (8, 6, 6), "tensor", [entry])


def test_the_layout_is_checked():
    assert depthwise("channels_last").layers[0].attrs["memory_format"] == "channels_last"
    with pytest.raises(SpecError, match="contiguous or channels_last"):
        depthwise("nhwc")


@pytest.mark.torch
def test_calibration_times_the_layout_the_layer_has():
    torch = pytest.importorskip("torch")
    from dlsim.calibrate.compute_ops import conv_algorithm, conv_fn

    tasks = [t for t in model_tasks(depthwise("channels_last"), 4, "fp32") if isinstance(t, ConvTask)]
    assert tasks and all(t.algorithm.endswith(CHANNELS_LAST) for t in tasks)
    assert not any(t.algorithm.endswith(CHANNELS_LAST)
                   for t in model_tasks(depthwise("contiguous"), 4, "fp32") if isinstance(t, ConvTask))
    task = next(t for t in tasks if t.pass_name == "backward_data")
    with conv_algorithm(task.algorithm):
        for nhwc in (True, False):
            fn, _ = conv_fn(task.shape, 4, "backward_data", "fp32", "cpu", channels_last=nhwc)
            dx = fn()[0]
            assert dx.is_contiguous(memory_format=torch.channels_last) is nhwc


def test_each_layout_is_priced_from_its_own_rows():
    device = load_profile("cpu-epyc-2core").device
    nchw, nhwc = depthwise("contiguous").layers[0], depthwise("channels_last").layers[0]
    shape = shape_of(layer_cost(nchw, 4, "fp32").conv)
    rows = [ConvRow("fp32", "forward", "mkldnn", 4, shape, 3e-4), ConvRow("fp32", "forward", "mkldnn+channels_last", 4,
                                                                         shape, 1e-4)]
    tables = MeasuredKernelTimes(conv=rows)
    assert price_layer(nchw, 4, "fp32", device, tables).forward.seconds == 3e-4
    assert price_layer(nhwc, 4, "fp32", device, tables).forward.seconds == 1e-4
    # with only the channels-last row, an NCHW layer is not priced from it
    alone = MeasuredKernelTimes(conv=rows[1:])
    assert price_layer(nchw, 4, "fp32", device, alone).forward.seconds != 1e-4


@pytest.mark.torch
def test_import_records_a_channels_last_input():
    torch = pytest.importorskip("torch")
    from dlsim.api.importers import import_torch_module

    class PermutedNorm(torch.nn.Module):
        """ConvNeXt's pattern: LayerNorm over channels through permutes, then a depthwise convolution."""

        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.norm = torch.nn.LayerNorm(8)
            self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)

        def forward(self, x):
            y = self.norm(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            return self.dw(y).mean((2, 3))

    model = import_torch_module(PermutedNorm(), [torch.randn(2, 3, 8, 8)]).model
    assert [layer.attrs["memory_format"] for layer in model.layers if layer.type == "conv2d"] == \
        ["contiguous", "channels_last"]


@pytest.mark.torch
def test_the_pytorch_rebuild_runs_a_channels_last_layer_in_that_layout():
    """`validate model` rebuilds a YAML network in PyTorch: a channels_last convolution runs NHWC there too."""
    torch = pytest.importorskip("torch")
    from dlsim.validate.torch_model import build_torch_model

    for memory_format, nhwc in (("channels_last", True), ("contiguous", False)):
        net = build_torch_model(depthwise(memory_format))
        y = net(torch.randn(2, 8, 6, 6))
        assert y.is_contiguous(memory_format=torch.channels_last) is nhwc and y.is_contiguous() is not nhwc
