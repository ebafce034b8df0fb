"""dlsim validate torch (issue 15 item 3): a user's module in a plain loop against the prediction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlsim.validate.torch_loop import layer_kind, op_kind
from conftest import profile_with_rate

ROOT = Path(__file__).resolve().parents[1]
NETS = """
import torch.nn as nn

def mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))

def seg():  # (batch, C, H, W) output: trained with cross-entropy over the last dimension, as the loop does
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1))

def tuple_out():
    class T(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)
        def forward(self, x):
            return self.fc(x), x
    return T()
"""


def test_kinds_map_both_sides():
    assert op_kind("aten::addmm") == op_kind("aten::mm") == layer_kind("linear") == "matmul"
    assert op_kind("aten::convolution_backward") == layer_kind("conv_transpose2d") == "convolution"
    assert op_kind("aten::native_group_norm_backward") == layer_kind("groupnorm") == "normalization"
    assert op_kind("aten::_scaled_dot_product_flash_attention_for_cpu") == layer_kind("sdpa") == "attention"
    assert op_kind("aten::threshold_backward") == layer_kind("relu") == layer_kind("generic") == "memory-bound"
    assert op_kind("aten::nll_loss_forward") == layer_kind("cross_entropy") == "loss"


@pytest.fixture
def nets(tmp_path):
    pytest.importorskip("torch")
    path = tmp_path / "nets.py"
    path.write_text(NETS)
    return path


@pytest.mark.torch
def test_training_model_appends_the_loops_loss(nets):
    from dlsim.api.validate_torch import training_model
    model, imported = training_model(f"{nets}:seg", [3, 6, 6])
    assert model.params == imported.model.params == (3 * 9 * 8 + 8) + (8 * 4 + 4)
    view, loss = model.layers[-2:]
    assert loss.type == "cross_entropy" and view.type == "reshape" and view.out_shape == (4 * 6, 6)
    model, _ = training_model(f"{nets}:mlp", [32])
    assert model.layers[-1].type == "cross_entropy" and model.layers[-1].in_shapes == ((10,),)


@pytest.mark.torch
def test_validate_torch_end_to_end(nets, tmp_path, cli):
    out = tmp_path / "rec.json"
    plot = tmp_path / "rec.png"
    rate = 5e-10
    prof = profile_with_rate(tmp_path, rate, alpha=0.1)
    code, text, err = cli("validate", "torch", f"{nets}:mlp", "--input-shape", "32", "--batch", "4",
                          "-c", prof, "--repeats", "3", "--warmup", "1", "--json", out, "--plot", plot)
    assert code == 0, err
    rec = json.loads(out.read_text())
    assert rec["kind"] == "validate-torch" and rec["allocator"] in ("default", "jemalloc", "tcmalloc", "mimalloc")
    assert len(rec["measured"]["iteration_samples_s"]) == 3 and rec["measured"]["iteration_s"] > 0
    assert rec["predicted"]["iteration_s"] > 0 and rec["parameters"] == 32 * 64 + 64 + 64 * 10 + 10
    kinds = {r["name"]: r for r in rec["layers"]}
    assert {"matmul", "loss", "optimizer"} <= set(kinds)
    assert kinds["matmul"]["measured_s"] > 0 and kinds["matmul"]["predicted_s"] > 0
    assert rec["error"]["iteration"] == pytest.approx(rec["predicted"]["iteration_s"] / rec["measured"]["iteration_s"]
                                                      - 1)
    assert plot.stat().st_size > 0
    # the step's fresh pages, predicted (α x requested bytes) and measured (faults), set apart at the profile's rate
    fresh = rec["fresh_pages"]
    assert fresh["seconds_per_byte"] == rate and fresh["predicted_s"] > 0 and fresh["measured_bytes_per_step"] >= 0
    assert fresh["measured_s"] == pytest.approx(fresh["measured_bytes_per_step"] * rate)
    assert fresh["without"]["error"] == pytest.approx(
        (rec["predicted"]["iteration_s"] - fresh["predicted_s"]) / (rec["measured"]["iteration_s"] - fresh["measured_s"])
        - 1)
    assert "fresh pages (allocator default)" in text and "without them" in text


def test_fresh_page_lines():
    from dlsim.cli.validate import RETAIN_HINT, fresh_page_lines
    fresh = {"seconds_per_byte": 5e-10, "predicted_bytes_per_step": 2 * 2**20, "predicted_s": 1e-3,
             "measured_bytes_per_step": 10 * 2**20, "measured_s": 5e-3,
             "without": {"predicted_s": 14e-3, "measured_s": 15e-3, "error": 14 / 15 - 1}}
    rec = {"allocator": "default", "measured": {"iteration_s": 20e-3}, "fresh_pages": fresh}
    lines = fresh_page_lines(rec)
    assert "predicted 2 MiB" in lines[0] and "measured 10 MiB" in lines[0] and "-6.7%" in lines[1]
    assert RETAIN_HINT in lines[2]  # the measured pages cost 25% of the step
    assert not any(RETAIN_HINT in line for line in fresh_page_lines({**rec, "allocator": "retained"}))
    assert len(fresh_page_lines({**rec, "fresh_pages": {**fresh, "measured_s": 0.5e-3}})) == 2
    assert fresh_page_lines({"allocator": "default", "measured": {"iteration_s": 1.0}}) == []


@pytest.mark.torch
def test_untrainable_output_is_one_line(nets, cli):
    code, _, err = cli("validate", "torch", f"{nets}:tuple_out", "--input-shape", "8", "--batch", "2",
                       "-c", "cpu-epyc-2core", "--repeats", "1")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.torch
def test_bad_shape_is_one_line(nets, cli):
    code, _, err = cli("validate", "torch", f"{nets}:mlp", "--input-shape", "3x", "--batch", "2",
                       "-c", "cpu-epyc-2core")
    assert code == 1 and "--input-shape" in err


@pytest.mark.torch
def test_calibrate_exactly_the_factorys_kernels(nets, tmp_path, cli):
    """calibrate compute --model FILE.py:FACTORY (issue 15 item 6): its GEMMs, resumable, nothing overwritten."""
    import csv
    out = tmp_path / "prof"
    args = ("calibrate", "compute", "--out", out, "--model", f"{nets}:mlp", "--input-shape", "32", "--batch", "4",
            "--no-grid", "--repeats", "1", "--no-flush-cache", "--threads", "1", "-q")
    code, text, err = cli(*args)
    assert code == 0, err
    gemms = {(int(r["m"]), int(r["n"]), int(r["k"])) for r in csv.DictReader(open(out / "gemm.csv"))}
    # forward y = x W^T of both linears at batch 4, and their weight gradients (out x in over the batch)
    assert {(4, 64, 32), (4, 10, 64)} <= gemms and len(gemms) >= 4
    memory = (out / "memory.csv").read_text()
    assert "cross_entropy" in memory and "relu" in memory
    before = (out / "gemm.csv").read_text()
    code, text, _ = cli(*args)
    assert code == 0 and "nothing to do" in text and (out / "gemm.csv").read_text() == before
    code, _, err = cli("calibrate", "compute", "--out", out, "--model", f"{nets}:mlp", "--batch", "4")
    assert code == 1 and "--input-shape" in err
