"""`dlsim compare`, `dlsim plot` and `dlsim simulate --gantt`: every figure comes from a CLI command,
opens as a PNG, and says what and where (its titles, labels and legends, read back from the PNG's
Description metadata that `dlsim.report.compare_plots.save_figure` writes)."""

import csv
import json

import pytest

from dlsim.api.compare import compare, parse_grid

GPT = ["--set", "layers=4", "--set", "hidden=256", "--set", "heads=4", "--set", "seq_len=128", "--set", "vocab=1024"]
OVERRIDES = {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024}


def png_text(path) -> str:
    """Check `path` is a real, non-trivial PNG that matplotlib reads back; return its figure text."""
    import matplotlib.image as mpimg
    from PIL import Image
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
    pixels = mpimg.imread(str(path))
    assert pixels.shape[0] > 200 and pixels.shape[1] > 400
    assert pixels.std() > 0.05  # not a blank canvas
    with Image.open(path) as im:
        return im.text.get("Description", "")


@pytest.fixture
def strategies(tmp_path):
    files = {"a": "tp: 2\npp: 2\nmicrobatch_size: 2\nnum_microbatches: 4\n",
             "b": "tp: 4\nmicrobatch_size: 2\nnum_microbatches: 4\n",
             "odd": "tp: 3\n",  # 3 does not divide 8 GPUs
             "huge": "microbatch_size: 16384\n"}  # does not fit in 80 GB
    out = {}
    for name, text in files.items():
        out[name] = tmp_path / f"{name}.yaml"
        out[name].write_text(text)
    return out


def test_compare_table_csv_json_and_figure(cli, tmp_path, strategies):
    png, csv_path, js = tmp_path / "cmp.png", tmp_path / "cmp.csv", tmp_path / "cmp.json"
    args = ["compare", "gpt2", "--cluster", "dgx-h100", "--gpus", "8", *GPT, "--plot", png, "--csv", csv_path,
            "--json", js, "--stack", "eager"]
    for name in ("a", "b", "odd", "huge"):
        args += ["--strategy", strategies[name]]
    code, out, err = cli(*args)
    assert code == 0, err  # two of four feasible: the comparison succeeds
    # one line per infeasible strategy, naming the limit and by how much
    assert "x odd (8 GPUs): tp x pp = 3 x 1 = 3 does not divide 8 GPUs (remainder 2)" in out
    huge = [line for line in out.splitlines() if line.startswith("x huge")]
    assert len(huge) == 1 and "out of memory" in huge[0] and "over by" in huge[0]
    assert "fastest feasible:" in out
    rec = json.loads(js.read_text())
    assert rec["kind"] == "comparison" and rec["feasible"] == 2 and rec["infeasible"] == 2
    by = {e["name"]: e for e in rec["entries"]}
    assert by["a"]["strategy"]["dp"] == 2 and by["b"]["strategy"]["dp"] == 2  # dp = 8 / (tp x pp)
    bd = by["a"]["breakdown_s"]
    assert sum(bd.values()) == pytest.approx(by["a"]["iteration_time_s"])  # seconds, adding up
    assert by["huge"]["limit"] == "memory" and by["odd"]["limit"] == "build"
    rows = list(csv.DictReader(csv_path.open()))
    assert [r["strategy"] for r in rows] == ["a", "b", "odd", "huge"]
    assert float(rows[0]["bubble_s"]) > 0 and rows[2]["feasible"] == "False" and "remainder" in rows[2]["reason"]
    text = png_text(png)
    for needle in ("gpt2 on dgx-h100", "time per iteration (s)", "peak memory of the fullest device (GiB)",
                   "throughput (samples/s)", "device capacity", "exposed communication", "pipeline bubble",
                   "recomputation", "idle", "compute", "Not feasible", "remainder 2", "over by"):
        assert needle in text, needle
    # redrawn from the record alone
    again = tmp_path / "again.png"
    code, _, err = cli("plot", js, "--out", again)
    assert code == 0, err
    assert png_text(again) == text


def test_all_infeasible_exits_1_after_writing(cli, tmp_path, strategies):
    png = tmp_path / "bad.png"
    code, out, err = cli("compare", "gpt2", "--cluster", "dgx-h100", "--gpus", "8", *GPT, "--strategy",
                         strategies["odd"], "--strategy", strategies["huge"], "--plot", png, "--stack", "eager")
    assert code == 1
    assert len(err.strip().splitlines()) == 2 and err.strip().splitlines()[-1].startswith("error: none of the 2")
    assert "x odd" in out and "x huge" in out
    assert "cannot be built" in png_text(png)


def test_strong_scaling_figure(cli, tmp_path):
    png, csv_path = tmp_path / "strong.png", tmp_path / "strong.csv"
    code, out, err = cli("compare", "gpt2", "--cluster", "dgx-h100", *GPT, "--grid", "tp=1,2 pp=2",
                         "--global-batch", "64", "--scaling", "strong",
                         "--gpus", "4,8,16", "--plot", png, "--csv", csv_path)
    assert code == 0, err
    rows = list(csv.DictReader(csv_path.open()))
    assert {r["global_batch"] for r in rows if r["feasible"] == "True"} == {"64"}  # strong: fixed batch
    first = [r for r in rows if r["strategy"] == "tp1" and r["gpus"] == "4"][0]
    assert float(first["speedup"]) == pytest.approx(1.0) and float(first["parallel_efficiency"]) == pytest.approx(1.0)
    text = png_text(png)
    for needle in ("Strong scaling: gpt2 on dgx-h100", "GPUs", "speedup", "parallel efficiency (%)",
                   "throughput (samples/s)", "ideal (linear from 4 GPUs)", "ideal (100 %)", "tp1", "tp2",
                   "time per iteration (ms)"):
        assert needle in text, needle


def test_weak_scaling_grows_the_batch():
    rec = compare("gpt2", "dgx-h100", grid="tp=2", gpus=[2, 4, 8], scaling="weak", global_batch=8,
                  overrides=OVERRIDES)
    assert [e["global_batch"] for e in rec["entries"]] == [8, 16, 32]
    assert [e["strategy"]["dp"] for e in rec["entries"]] == [1, 2, 4]
    curve = rec["scaling_curves"]["tp2"]
    assert curve[0]["speedup"] == 1.0 and all(0 < p["efficiency"] <= 1.05 for p in curve)


def test_grid_parsing_and_dp_filter():
    assert parse_grid("dp=8,16 tp=1,2") == [{"dp": 8, "tp": 1}, {"dp": 8, "tp": 2}, {"dp": 16, "tp": 1},
                                            {"dp": 16, "tp": 2}]
    assert parse_grid("schedule=1f1b,gpipe overlap=false")[1] == {"schedule": "gpipe", "overlap": False}
    rec = compare("gpt2", "dgx-h100", grid="dp=1,2,4 tp=1,2", gpus=[4], overrides=OVERRIDES)
    assert sorted(e["name"] for e in rec["entries"]) == ["dp2 tp2", "dp4 tp1"]  # only dp x tp x pp = 4


def test_plot_simulation_records(cli, tmp_path):
    recs = []
    for pp in (1, 2):
        js = tmp_path / f"sim-pp{pp}.json"
        code, _, err = cli("simulate", "gpt2", "--cluster", "dgx-h100", "--dp", "2", "--pp", str(pp),
                           "--microbatch-size", "2", "--num-microbatches", "4", *GPT, "--json", js)
        assert code == 0, err
        recs.append(js)
    one, both = tmp_path / "one.png", tmp_path / "both.png"
    assert cli("plot", recs[1], "--out", one)[0] == 0
    text = png_text(one)
    for needle in ("gpt2 on dgx-h100", "dp 2 x tp 1 x pp 2", "time per iteration (ms)",
                   "peak memory of the device (GiB)", "device capacity", "pipeline bubble"):
        assert needle in text, needle
    assert cli("plot", *recs, "--out", both)[0] == 0
    assert "Strategies compared: gpt2 on dgx-h100" in png_text(both)


def test_plot_comm_sweep(cli, tmp_path):
    js, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    code, _, err = cli("comm", "allreduce", "--sweep", "1KiB:64MiB", "--ranks", "8", "--cluster", "dgx-h100",
                       "--json", js)
    assert code == 0, err
    code, _, err = cli("plot", js, "--out", png)
    assert code == 0, err
    png_text(png)


def test_simulate_gantt(cli, tmp_path):
    png, trace = tmp_path / "gantt.png", tmp_path / "trace.json.gz"
    args = ["simulate", "gpt2", "--cluster", "dgx-h100", "--dp", "2", "--tp", "2", "--pp", "4",
            "--microbatch-size", "1", "--num-microbatches", "8", *GPT]
    code, _, err = cli(*args, "--gantt", png, "--gantt-devices", "2", "--trace", trace)
    assert code == 0, err
    text = png_text(png)
    for needle in ("Timeline of one iteration: gpt2 on dgx-h100", "first 2 of 4 simulated devices",
                   "time since the iteration started (ms)", "device streams and link ports", "compute",
                   "communication (stream)", "link port busy", "pipeline bubble"):
        assert needle in text, needle
    # an existing figure is never replaced without --force
    code, _, err = cli(*args, "--gantt", png)
    assert code == 1 and "--force" in err
    assert cli(*args, "--gantt", png, "--force")[0] == 0
    # the saved trace redraws the same chart
    again = tmp_path / "again.png"
    code, _, err = cli("plot", trace, "--out", again, "--devices", "2")
    assert code == 0, err
    assert "first 2 of 4 simulated devices" in png_text(again)


def test_outputs_refused(cli, tmp_path, strategies):
    code, _, err = cli("compare", "gpt2", "--cluster", "dgx-h100", "--strategy", strategies["a"], "--plot",
                       strategies["a"], *GPT)
    assert code == 1 and "error:" in err
    code, _, err = cli("compare", "gpt2", "--cluster", "dgx-h100", "--strategy", strategies["a"], "--plot",
                       tmp_path / "x.txt", *GPT)
    assert code == 1 and "unknown figure format" in err
    code, _, err = cli("simulate", "gpt2", "--cluster", "dgx-h100", "--gantt-devices", "2", *GPT)
    assert code == 1 and "--gantt" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "mystery"}')
    code, _, err = cli("plot", bad, "--out", tmp_path / "m.png")
    assert code == 1 and "cannot draw a record of kind" in err
