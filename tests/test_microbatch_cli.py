"""`dlsim plan microbatch`: bad benchmark tables give one line and exit 1; JSON shape; profile tables; model mode."""

from __future__ import annotations

import json
import shutil

import pytest

from dlsim.api.microbatch import plan_microbatches
from dlsim.io.bench_table import load_bench_table, resume_rows
from tests.conftest import ROOT

GOOD = """layer,pass,microbatch_size,algorithm,time_s,workspace_bytes
conv1,forward,4,slow,4.0,0
conv1,forward,4,fast,1.0,400
conv1,forward,2,fast,0.5,200
conv1,forward,1,fast,0.25,100
conv1,forward,2,slow,2.0,0
conv1,forward,1,slow,1.0,0
conv2,backward_data,4,gemm,3.0,10
"""

TINY_MODEL = """
name: tiny
input: {shape: [3, 8, 8]}
layers:
  - {name: conv1, type: conv2d, out_channels: 4, kernel: 3, padding: 1}
  - {name: relu, type: relu}
  - {name: conv2, type: conv2d, out_channels: 4, kernel: 3, padding: 1}
"""


def _write(tmp_path, text, name="t.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_plan_from_table_text_and_json(tmp_path, cli):
    path = _write(tmp_path, GOOD)
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4, "--workspace-limit", "250B")
    assert code == 0, err
    assert "4 x 1 fast" in out and "speedup 1.750x" in out     # equal times: the smaller workspace wins
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4, "--workspace-limit", "250B", "--json")
    rec = json.loads(out)
    assert {"layers", "time_s", "undivided_time_s", "speedup"} <= set(rec)
    assert rec["time_s"] == pytest.approx(1.0 + 3.0) and rec["undivided_time_s"] == pytest.approx(4.0 + 3.0)
    first = rec["layers"][0]
    assert {"microbatches", "time_s", "workspace_bytes"} <= set(first)
    assert [m["size"] for m in first["microbatches"]["forward"]] == [1, 1, 1, 1]
    assert first["workspace_bytes"] == 100
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4, "--workspace-limit", "1KiB",
                         "--mode", "wd", "--json")
    assert json.loads(out)["time_s"] == pytest.approx(1.0 + 3.0)


@pytest.mark.parametrize("text,reason", [
    (GOOD.replace("time_s,", "seconds,"), "missing column 'time_s'"),
    (GOOD.replace("conv1,forward,2,fast,0.5,200", "conv1,forward,2,fast,-0.5,200"), "line 4: negative time_s -0.5"),
    (GOOD.replace("conv1,forward,2,fast,0.5,200", "conv1,forward,2,fast,abc,200"), "line 4: time_s must be a number"),
    (GOOD.replace("conv1,forward,1,slow", "conv1,sideways,1,slow"), "line 7: unknown pass 'sideways'"),
    (GOOD.replace("conv1,forward,1,slow", "conv1,forward,0,slow"), "line 7: microbatch_size must be a positive integer"),
    (GOOD + "conv1,forward,4,fast,1.1,400\n", "line 9: duplicate row"),
    (GOOD.replace(",400\n", ",-4\n"), "negative workspace_bytes"),
    ("", "empty file"),
])
def test_bad_csv_one_line_exit_1(tmp_path, cli, text, reason):
    path = _write(tmp_path, text)
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and str(path) in err and reason in err, err


def test_unknown_layer_against_the_model_one_line_exit_1(tmp_path, cli):
    model = _write(tmp_path, TINY_MODEL, "tiny.yaml")
    path = _write(tmp_path, GOOD.replace("conv2,backward_data", "conv9,backward_data"))
    code, out, err = cli("plan", "microbatch", model, "--bench-table", path, "--batch", 4)
    assert code == 1 and err.count("\n") == 1 and "line 8: unknown layer 'conv9'" in err


def test_infeasible_limit_one_line(tmp_path, cli):
    path = _write(tmp_path, GOOD.replace("conv2,backward_data,4,gemm,3.0,10", "conv2,backward_data,4,gemm,3.0,1000"))
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4, "--workspace-limit", "500B")
    assert code == 1 and err.count("\n") == 1 and "smallest limit every kernel fits is" in err
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4, "--workspace-limit", "500B",
                         "--mode", "wd")
    assert code == 1 and err.count("\n") == 1 and "smallest feasible budget is" in err


def test_model_needs_a_source(cli):
    code, out, err = cli("plan", "microbatch", "resnet50", "--batch", 8)
    assert code == 1 and "MODEL needs --cluster" in err


def test_model_mode_says_times_are_modelled(cli):
    code, out, err = cli("plan", "microbatch", "resnet50", "--cluster", "dgx-h100", "--batch", 64, "--dtype", "bf16",
                         "--layers", "layer1.0", "--json")
    assert code == 0, err
    rec = json.loads(out)
    assert rec["source"] == "model" and any("modelled" in n for n in rec["notes"])
    assert [layer["name"] for layer in rec["layers"]] == ["layer1.0.conv1", "layer1.0.conv2", "layer1.0.conv3",
                                                          "layer1.0.down"]
    assert all(sum(m["size"] for m in mbs) == 64 for layer in rec["layers"] for mbs in layer["microbatches"].values())


def test_profile_conv_algorithms_table_is_used(tmp_path):
    """A profile with `tables: {conv_algorithms: ...}` keyed by geometry signature prices matching layers as
    measured, the rest are modelled (and the notes say which)."""
    prof = tmp_path / "prof"
    shutil.copytree(ROOT / "hardware_profiles" / "dgx-h100", prof)
    text = (prof / "profile.yaml").read_text()
    (prof / "profile.yaml").write_text(text + "\ntables:\n  conv_algorithms: conv.csv\n")
    sig = "conv3x8x8-4-k3x3-s1x1-p1x1-d1x1-g1"          # tiny's conv1; conv2 (4 input channels) is not in it
    (prof / "conv.csv").write_text("layer,pass,microbatch_size,algorithm,time_s,workspace_bytes\n"
                                   f"{sig},forward,2,x,1e-3,0\n{sig},forward,1,x,4e-4,0\nother-shape,forward,2,x,1,0\n")
    model = _write(tmp_path, TINY_MODEL, "tiny.yaml")
    plan = plan_microbatches(model, prof, 2, "1MiB", "wr", "powerOfTwo")
    assert plan.source == "mixed"
    assert plan.layer("conv1").get("forward").time_s == pytest.approx(8e-4)
    assert plan.layer("conv1").get("backward_data") is None
    assert plan.layer("conv2").get("backward_data").source == "model"
    assert any("measured" in n for n in plan.notes) and any("1 of 2 convolutions" in n for n in plan.notes)
    assert plan.pass_time_s("conv1", "forward") == pytest.approx(8e-4)


def test_resume_drops_a_partial_last_line(tmp_path):
    path = _write(tmp_path, GOOD + "conv2,forward,2,gemm,1.")
    rows = resume_rows(path)
    assert len(rows) == 7 and path.read_text() == GOOD
    assert len(load_bench_table(path).kernels) == 2


def test_plot_writes_a_figure(tmp_path, cli):
    path = _write(tmp_path, GOOD)
    png = tmp_path / "fig.png"
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4, "--plot", png, "--json")
    assert code == 0, err
    rec = json.loads(out)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sweep = rec["sweep"]
    assert sweep["kind"] == "microbatch_sweep" and len(sweep["limits_bytes"]) == len(sweep["series"][0]["time_s"])


def test_unknown_layer_without_a_model_one_line_exit_1(tmp_path, cli):
    """Without MODEL the table's own layers are the known ones: --layers naming none of them is an unknown layer."""
    path = _write(tmp_path, GOOD)
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4, "--layers", "conv1,conv7")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "unknown layer 'conv7': not in the benchmark table (its layers: conv1, conv2)" in err and str(path) in err
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4, "--layers", "conv2", "--json")
    assert code == 0, err
    assert [layer["name"] for layer in json.loads(out)["layers"]] == ["conv2"]


@pytest.mark.parametrize("mode", ["wr", "wd"])
def test_pareto_lists_every_desirable_configuration(tmp_path, cli, mode):
    from dlsim.plan.microbatch import wr_desirable
    path = _write(tmp_path, GOOD)
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4, "--workspace-limit", "1KiB",
                         "--mode", mode, "--pareto", "--json")
    assert code == 0, err
    rec = json.loads(out)
    fwd = rec["layers"][0]["passes"]["forward"]
    expected = wr_desirable(load_bench_table(path).kernel("conv1", "forward"), 4, 1024.0, "powerOfTwo")
    assert [(c["time_s"], c["workspace_bytes"]) for c in fwd["pareto"]] == [(c.time_s, c.workspace_bytes)
                                                                           for c in expected]
    # by hand: slow undivided (4 s, 0 B), fast in micro-batches of 1 (1 s, 100 B): nothing else is non-dominated
    assert [(c["time_s"], c["workspace_bytes"]) for c in fwd["pareto"]] == [(4.0, 0.0), (1.0, 100.0)]
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4, "--workspace-limit", "1KiB",
                         "--mode", mode, "--pareto")
    assert code == 0 and out.count("desirable") == 3 and "4 x 1 fast" in out
