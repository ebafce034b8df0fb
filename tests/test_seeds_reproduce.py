"""The seeds' reproductions (benchmarks/seeds_reproduce.py, issue 14 item 4) at tiny sizes: each runs
dlsim's own commands and must show the seed's qualitative result, which could fail."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "seeds"))

import seeds_reproduce  # noqa: E402


def _png_ok(path: str | Path) -> str:
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image
    desc = Image.open(path).info.get("Description", "")
    assert desc, "figure carries its titles and labels as metadata"
    return desc


@pytest.fixture()
def out(tmp_path: Path) -> Path:
    return tmp_path


def test_dp_knee_falls_between_64_and_512_gpus_on_50gbe_not_on_edr(out: Path) -> None:
    res = seeds_reproduce.reproduce("dp-knee", out, tiny=True)
    c = res["curves"]
    strong = c["Big Basin, 1x 50 GbE per node, strong, minibatch 8192"]
    assert strong["gpus"] == [8, 64, 512]
    assert strong["efficiency"][1] >= 0.9 > strong["efficiency"][2]       # knee in (64, 512]
    assert strong["knee_gpus"] == 512
    assert c["DGX-1, 4x EDR IB per node, weak, 32 per GPU"]["knee_gpus"] is None
    desc = _png_ok(res["png"])
    assert "GPUs (8 per node)" in desc and "parallel efficiency" in desc


def test_distbelief_communication_overtakes_compute_for_the_fc_model(out: Path) -> None:
    res = seeds_reproduce.reproduce("distbelief", out, tiny=True)
    pts = res["per_batch"][128]["points"]
    assert [p["devices"] for p in pts] == [1, 8, 64]
    assert pts[0]["comm_s"] == 0 and pts[1]["comm_s"] < pts[1]["compute_s"] and pts[2]["comm_s"] > pts[2]["compute_s"]
    assert res["per_batch"][128]["comm_dominates_after"] == 8
    assert "time per iteration (ms)" in _png_ok(res["png"])


def test_parameter_server_exchange_is_the_seed_formula_and_grows_with_workers(out: Path) -> None:
    rows = seeds_reproduce.reproduce("ps-allreduce", out, tiny=True)["rows"]
    for r in rows:
        assert r["dlsim_comm_ps_s"] == pytest.approx(r["seed_ps_s"], rel=1e-3)
        assert r["throughput"]["ps1"] < r["throughput"]["allreduce"]
        assert r["throughput"]["ps1"] < r["throughput"]["psn"]          # sharding relieves the server
    assert rows[1]["ps1_comm_s"] > 2 * rows[0]["ps1_comm_s"]           # linear in p past one node
    assert rows[1]["allreduce_comm_s"] < 3 * rows[0]["allreduce_comm_s"]


def test_quantised_exchange_beats_dense_when_bandwidth_bound(out: Path) -> None:
    res = seeds_reproduce.reproduce("compression", out, tiny=True)
    assert res["q4"]["alexnet, exchange after backprop"]["speedup"][0] > 1.2
    assert res["q4"]["vgg19, exchange after backprop"]["speedup"][0] > 1.0
    fp32, onebit = res["speech_speedup"]["none"], res["speech_speedup"]["1bit"]
    assert fp32[0] == onebit[0] == pytest.approx(1.0)
    assert onebit[1] > 1.5 * fp32[1]                                    # 40 GPUs: 1-bit well ahead


def test_allreduce_crossover_is_the_closed_form(out: Path) -> None:
    (row,) = seeds_reproduce.reproduce("crossover", out, tiny=True)["rows"]
    assert row["best_smallest"] == "recursive-doubling" and row["best_largest"] == "rabenseifner"
    assert row["dlsim_bytes"] == pytest.approx(row["closed_form_bytes"], rel=0.02)


def test_stale_synchronous_throughput_rises_with_the_bound_under_a_straggler(out: Path) -> None:
    c = seeds_reproduce.reproduce("staleness", out, tiny=True)["curves"]["1 in 8 workers 2x slower"]
    bsp, s4 = c["throughput"]
    assert bsp < s4 <= c["async_throughput"] * (1 + 1e-9)
    assert c["async_throughput"] > 1.3 * bsp
    assert c["staleness_mean"][0] == 0 < c["staleness_mean"][1]


def test_microbatch_plans_beat_the_undivided_algorithm(out: Path) -> None:
    res = seeds_reproduce.reproduce("microbatch", out, tiny=True)
    assert res["nets"]["alexnet"]["speedup_64mib"] > 1.0
    for cluster in ("dgx1-p100", "dgx1-v100"):
        assert res["deepbench"][cluster]["max_layer_speedup"]["any"] > 1.0


def test_unknown_reproduction_is_one_line() -> None:
    with pytest.raises(SystemExit, match="unknown reproduction"):
        seeds_reproduce.reproduce("nope")


def test_dryden_filter_split_quarters_the_allreduce_and_spatial_splits_a_large_image(out: Path) -> None:
    res = seeds_reproduce.reproduce("dryden", out, tiny=True)
    assert res["allreduce_volume_reduction"] == pytest.approx(4.0)
    assert 1.0 < res["allreduce_reduction"] <= 4.0
    t, mem = res["large_time_s"], res["large_memory_gib"]
    assert res["large_gpus"] == [1, 4] and t[1] < t[0] / 2.5 and mem[1] < mem[0] / 2.5


def test_hybrid_beats_data_and_model_parallelism_when_exchanged_after_backprop(out: Path) -> None:
    res = seeds_reproduce.reproduce("hybrid", out, tiny=True)
    s = res["speedup"]
    assert s["hybrid (DP conv + MP FC)"]["8"] > s["data parallel"]["8"] > s["model parallel"]["8"]
    assert all(f > 1 for f in res["slower_exchange"].values())  # the seeds' systems exchanged more slowly
