"""`dlsim compare` at its limits: scaling studies where nothing (or only part) is feasible, the
micro-batch a global batch implies, and parameter-server / asynchronous / stale-synchronous modes."""

import json

import pytest

from dlsim.api.compare import compare, no_feasible_reason
from test_compare_plots import GPT, OVERRIDES, png_text


def test_scaling_with_every_point_unbuildable_is_one_line(cli, tmp_path):
    png = tmp_path / "none.png"
    code, out, err = cli("compare", "gpt2", "--cluster", "dgx-h100", *GPT, "--grid", "tp=3", "--scaling", "strong",
                         "--gpus", "4,8", "--global-batch", "64", "--plot", png)
    assert code == 1
    lines = err.strip().splitlines()
    assert "Traceback" not in err and "internal error" not in err
    assert lines[-1] == ("error: none of the 2 points (1 strategy x GPU counts) is feasible: 2 cannot be built "
                         "(every one for the same reason): first, tp3 on 4 GPUs: tp x pp = 3 x 1 = 3 does not "
                         "divide 4 GPUs (remainder 1)")
    assert "x tp3 (8 GPUs): tp x pp = 3 x 1 = 3 does not divide 8 GPUs (remainder 2)" in out
    text = png_text(png)  # the figure is still drawn, every point marked
    assert "no feasible point (reasons below)" in text and "Not feasible" in text and "remainder 2" in text


def test_scaling_with_every_point_out_of_memory_names_the_closest(cli, tmp_path):
    js = tmp_path / "oom.json"
    gpt = [a if a != "seq_len=128" else "seq_len=1024" for a in GPT]
    code, out, err = cli("compare", "gpt2", "--cluster", "dgx-h100", *gpt, "--grid", "tp=1,2 microbatch_size=4096",
                         "--global-batch", "32768", "--scaling", "strong", "--gpus", "4,8", "--plot",
                         tmp_path / "oom.png", "--json", js)
    assert code == 1
    line = err.strip().splitlines()[-1]
    rec = json.loads(js.read_text())
    # the closest entry: the smallest need over capacity of its fullest device
    ratios = {(e["name"], e["gpus"]): max(d["peak_memory_bytes"] / d["capacity_bytes"] for d in e["devices"])
              for e in rec["entries"]}
    name, gpus = min(ratios, key=ratios.get)
    assert line.startswith("error: none of the 4 points (2 strategies x GPU counts) is feasible: 4 run out of "
                           f"memory: the closest, {name} on {gpus} GPUs, needs ")
    assert "over by" in line and f"{ratios[(name, gpus)]:.0%} of capacity" in line
    assert "Traceback" not in err


def test_scaling_with_some_points_feasible_draws_them_and_marks_the_rest(cli, tmp_path):
    png = tmp_path / "part.png"
    code, out, err = cli("compare", "gpt2", "--cluster", "dgx-h100", *GPT, "--grid", "tp=1,3 microbatch_size=4",
                         "--global-batch", "64", "--scaling", "strong", "--gpus", "4,8,16", "--plot", png)
    assert code == 0, err
    text = png_text(png)
    assert "not feasible (reason below)" in text and "tp1 (from 4 GPUs)" in text
    assert "no feasible point" not in text and "does not divide 16 GPUs" in text


def test_no_feasible_reason_mixed_limits():
    rec = {"scaling": None, "entries": [
        {"name": "a", "gpus": 8, "feasible": False, "limit": "build", "reason": "tp x pp = 3 x 1 = 3 does not divide 8"},
        {"name": "b", "gpus": 8, "feasible": False, "limit": "memory", "reason": "out of memory",
         "devices": [{"peak_memory_bytes": 3.0 * 2**30, "capacity_bytes": 2.0 * 2**30}]},
        {"name": "c", "gpus": 8, "feasible": False, "limit": "memory", "reason": "out of memory",
         "devices": [{"peak_memory_bytes": 5.0 * 2**30, "capacity_bytes": 2.0 * 2**30}]}]}
    assert no_feasible_reason(rec) == (
        "none of the 3 strategies is feasible: 1 cannot be built: first, a on 8 GPUs: tp x pp = 3 x 1 = 3 does not "
        "divide 8; 2 run out of memory: the closest, b on 8 GPUs, needs 3 GiB per device against 2 GiB usable "
        "(over by 1 GiB, 150% of capacity)")


def test_global_batch_without_a_microbatch_size_is_derived_as_simulate_does_and_stated(cli, tmp_path):
    from dlsim.api.simulate import simulate
    js = tmp_path / "gb.json"
    code, out, err = cli("compare", "gpt2", "--cluster", "dgx-h100", *GPT, "--grid", "tp=1,2", "--gpus", "8",
                         "--global-batch", "64", "--json", js)
    assert code == 0, err
    rec = json.loads(js.read_text())
    by = {e["name"]: e for e in rec["entries"]}
    for name, tp in (("tp1", 1), ("tp2", 2)):
        sim = simulate("gpt2", "dgx-h100", tp=tp, dp=8 // tp, global_batch=64, overrides=OVERRIDES)
        assert (by[name]["strategy"]["microbatch_size"], by[name]["strategy"]["num_microbatches"]) == (
            sim.strategy["microbatch_size"], sim.strategy["num_microbatches"]) == (64 * tp // 8, 1)
        assert by[name]["iteration_time_s"] == pytest.approx(sim.iteration_time_s, rel=1e-12)
        assert "one micro-batch of global batch / dp samples per replica" in by[name]["assumed"]["microbatch_size"]
    assert rec["assumed"]["microbatch_size"].endswith(": tp1, tp2")
    code, out, err = cli("compare", "gpt2", "--cluster", "dgx-h100", *GPT, "--grid", "tp=1,2", "--gpus", "8",
                         "--global-batch", "64")
    assert "assumed microbatch_size: as dlsim simulate derives it from a global batch: one micro-batch of global " \
        "batch / dp samples per replica" in out


def test_a_strategy_that_sets_its_microbatches_keeps_them_and_assumes_nothing():
    rec = compare("gpt2", "dgx-h100", grid="tp=2 num_microbatches=4", gpus=[8], global_batch=64, overrides=OVERRIDES)
    e = rec["entries"][0]
    assert (e["strategy"]["microbatch_size"], e["strategy"]["num_microbatches"]) == (4, 4)  # 64 / (dp 4 x 4)
    assert "assumed" not in e and "assumed" not in rec
    rec = compare("gpt2", "dgx-h100", grid="tp=2 microbatch_size=2", gpus=[8], global_batch=64, overrides=OVERRIDES)
    e = rec["entries"][0]
    assert (e["strategy"]["microbatch_size"], e["strategy"]["num_microbatches"]) == (2, 8)
    assert "assumed" not in rec


@pytest.mark.parametrize("sync,extra", [("ps", {}), ("async", {}), ("ssp", {"staleness": 2})])
def test_parameter_server_modes_run_the_simulation_simulate_runs(sync, extra):
    from dlsim.api.simulate import simulate
    rec = compare("gpt2", "dgx-h100", grid="tp=1", gpus=[4], global_batch=16, overrides=OVERRIDES,
                  fields={"sync": sync, "iterations": 6, **extra})
    e = rec["entries"][0]
    assert e["feasible"], e.get("reason")
    sim = simulate("gpt2", "dgx-h100", dp=4, global_batch=16, sync=sync, iterations=6, overrides=OVERRIDES,
                   **extra).to_dict()
    assert sim["kind"] == "async_simulation" and e["sync"] == sync
    assert e["iteration_time_s"] == pytest.approx(sim["iteration_time_s"], rel=1e-12)
    assert e["throughput_samples_per_s"] == pytest.approx(sim["throughput_samples_per_s"], rel=1e-12)
    assert sum(e["breakdown_s"].values()) == pytest.approx(e["iteration_time_s"])  # the split adds up
    workers = sim["workers_detail"]
    comm = sum(w["comm_s"] / w["iterations"] for w in workers) / len(workers)
    assert e["breakdown_s"]["exposed_comm"] == pytest.approx(comm) and comm > 0  # server traffic
    assert e["breakdown_s"]["compute"] == pytest.approx(sim["iteration_compute_s"])
    assert e["peak_memory_bytes"] is None and "not simulated" in e["memory_note"]
    assert rec["fixed"] == " ".join(f"{k}={v}" for k, v in {"sync": sync, "iterations": 6, **extra}.items())


def test_compare_cli_sync_ssp_against_allreduce(cli, tmp_path):
    png, csv_path, js = tmp_path / "ssp.png", tmp_path / "ssp.csv", tmp_path / "ssp.json"
    code, out, err = cli("compare", "gpt2", "--cluster", "dgx-h100", *GPT, "--grid", "staleness=0,4", "--sync", "ssp",
                         "--iterations", "6", "--gpus", "4", "--global-batch", "16", "--plot", png, "--csv", csv_path,
                         "--json", js)
    assert code == 0, err
    assert "every strategy sync=ssp iterations=6" in out
    assert "memory per worker not simulated (parameter-server training): staleness=0, staleness=4" in out
    rows = {r["strategy"]: r for r in __import__("csv").DictReader(csv_path.open())}
    assert rows["staleness=4"]["sync"] == "ssp" and rows["staleness=4"]["staleness"] == "4"
    assert float(rows["staleness=4"]["staleness_mean"]) > float(rows["staleness=0"]["staleness_mean"]) == 0.0
    assert "memory per worker not simulated" in png_text(png)
    # a mode's own field the other mode would ignore is still refused, one line per entry
    code, out, err = cli("compare", "gpt2", "--cluster", "dgx-h100", *GPT, "--grid", "sync=allreduce,ssp",
                         "--staleness", "2", "--gpus", "4", "--global-batch", "16")
    assert code == 0, err
    assert "x sync=allreduce (4 GPUs): staleness: is the SSP staleness bound and needs sync ssp" in out
    # varied by the grid and set for all: refused once
    code, out, err = cli("compare", "gpt2", "--cluster", "dgx-h100", *GPT, "--grid", "sync=ps,ssp", "--sync", "ssp")
    assert code == 1 and err.strip() == "error: sync: sync is set for every strategy and varied by --grid: give it once"


def test_plot_redraws_saved_parameter_server_and_allreduce_records_together(cli, tmp_path):
    recs = []
    for sync in ("allreduce", "async"):
        js = tmp_path / f"{sync}.json"
        code, _, err = cli("simulate", "gpt2", "--cluster", "dgx-h100", "--dp", "4", "--global-batch", "16", "--sync",
                           sync, *GPT, "--json", js)
        assert code == 0, err
        recs.append(js)
    png = tmp_path / "both.png"
    code, _, err = cli("plot", *recs, "--out", png)
    assert code == 0, err
    text = png_text(png)
    assert "Strategies compared: gpt2 on dgx-h100" in text and "memory per worker not simulated" in text
