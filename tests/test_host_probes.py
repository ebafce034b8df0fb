"""A CPU calibration's host probes (dlsim.api.host_probes): sized to what the predictions charge, measured once
per host and kept in the host cache (dlsim.io.host_cache), resumed without measuring a finished probe again
(issue 34). The probe functions are faked here: tests/test_loop_probe.py and test_host_ops.py run them."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from dlsim.api import host_probes
from dlsim.api.host_probes import ProbeNeeds, needs, present, run_probes
from dlsim.calibrate import alloc_probe, host_ops, loop_probe
from dlsim.calibrate.compute_run import open_tables
from dlsim.io.host_cache import HostCache

KEY = {"cpu": "Fake CPU 9000", "logical_cpus": 2, "torch": "9.9"}
TINY = ("name: tiny\ndtype: fp32\ninput: {shape: [16]}\nlayers:\n  - {name: fc1, type: linear, out_features: 8}\n"
        "  - {name: act, type: relu}\n  - {name: fc2, type: linear, out_features: 4}\n"
        "  - {name: loss, type: cross_entropy}\n")


def tiny_model(folder: Path) -> str:
    """A four-layer model (a handful of kernels: a calibration of it takes a second)."""
    path = folder / "tiny.yaml"
    path.write_text(TINY)
    return str(path)


class Fakes:
    """Counting stand-ins for the three probes; the loop probe's networks fit a cache of `cache_bytes`."""

    def __init__(self, monkeypatch, cache_bytes: float = 32 * 2**20, stop_after: int | None = None):
        self.fresh, self.loop, self.host = [], [], []
        self.stop_after = stop_after
        from dlsim.calibrate import compute_timer
        monkeypatch.setattr(compute_timer, "last_level_cache_bytes", lambda device: cache_bytes)
        monkeypatch.setattr(alloc_probe, "fresh_memory_in_fresh_process",
                            lambda t, repeats: self.fresh.append(t) or 5e-10)
        monkeypatch.setattr(loop_probe, "probe_run", self.run)
        monkeypatch.setattr(host_ops, "host_op_seconds", lambda: self.host.append(1) or (4e-6, 2e-6, 100, 80))

    def run(self, name: str) -> dict:
        if self.stop_after is not None and len(self.loop) >= self.stop_after:
            raise KeyboardInterrupt
        self.loop.append(name)
        return {"faulted": 1e6, "requested": 2e7, "footprint": 5e7 if name == "mlp" else 3e6,
                "optimizer_in_loop_s": 3e-4, "optimizer_flushed_s": 2e-4, "optimizer_back_to_back_s": 1e-4}


def device_rows(path: Path) -> dict[str, dict]:
    return {r["quantity"]: r for r in csv.DictReader(open(path / "device.csv"))}


def test_needs_follow_what_the_estimate_charges():
    """Every model on a CPU profile pays fresh pages (rate and α); only layers captured from PyTorch (carrying
    ``host_ops``) pay host time per operator and the optimizer step's in-loop extras."""
    from dataclasses import replace
    from dlsim.api.models import as_model
    zoo = as_model("lenet5")
    captured = replace(zoo, layers=tuple(replace(layer, attrs={**layer.attrs, "host_ops": [3, 2]})
                                         for layer in zoo.layers))
    plain = needs([zoo], 2)
    assert (plain.threads, plain.heap, plain.fit, plain.host_ops) == (2, True, False, False)
    assert needs([zoo, captured], 2).fit and needs([zoo, captured], 2).host_ops
    assert needs([], 2).fit and needs([], 2).host_ops  # a generic calibration serves any prediction


def test_probes_measured_once_per_host_and_reused(tmp_path, monkeypatch):
    fakes = Fakes(monkeypatch)
    cache = HostCache(KEY, tmp_path / "cache")
    first = run_probes(open_tables(tmp_path / "a")["device"], ProbeNeeds(2), cache=cache)
    assert fakes.fresh == [2] and sorted(fakes.loop) == ["mlp", "mlp_small"] and fakes.host == [1]
    assert set(first.sources.values()) == {"measured"}
    rows = device_rows(tmp_path / "a")
    assert {"fresh_memory_s_per_byte_t2", "heap_refault_fraction", "optimizer_in_loop_extra_s",
            "optimizer_in_loop_extra_fit_s", "host_op_forward_s", "host_op_backward_s"} <= set(rows)
    assert float(rows["heap_refault_fraction"]["value"]) == pytest.approx(0.05)
    # a second profile on the same host: every probe from the cache, nothing measured, provenance in `how`
    second = run_probes(open_tables(tmp_path / "b")["device"], ProbeNeeds(2), cache=cache)
    assert fakes.fresh == [2] and len(fakes.loop) == 2 and fakes.host == [1]
    assert set(second.sources.values()) == {"cache"} and second.seconds == 0
    again = device_rows(tmp_path / "b")
    assert {q: r["value"] for q, r in again.items()} == {q: r["value"] for q, r in rows.items()}
    assert "reused from" in again["fresh_memory_s_per_byte_t2"]["how"]
    assert "reused from the host cache" in again["heap_refault_fraction"]["how"]
    # --reprobe: measured again, the cache refreshed
    run_probes(open_tables(tmp_path / "c")["device"], ProbeNeeds(2), cache=cache, reuse=False)
    assert fakes.fresh == [2, 2] and len(fakes.loop) == 4 and fakes.host == [1, 1]
    # another host (or torch version) never reads these results
    other = HostCache({**KEY, "torch": "10.0"}, tmp_path / "cache")
    run_probes(open_tables(tmp_path / "d")["device"], ProbeNeeds(2), cache=other)
    assert fakes.fresh == [2, 2, 2]


def test_a_zoo_model_calibration_runs_only_what_its_prediction_charges(tmp_path, monkeypatch):
    fakes = Fakes(monkeypatch)
    report = run_probes(open_tables(tmp_path)["device"], ProbeNeeds(1, fit=False, host_ops=False),
                        cache=HostCache(KEY, None))
    assert fakes.fresh == [1] and fakes.loop == ["mlp"] and fakes.host == []
    assert report.sources["host_op"] == "not needed" and report.sources["optimizer_in_loop_extra_fit_s"] == "not needed"
    assert "host_op_forward_s" not in device_rows(tmp_path)


def test_resume_when_every_probe_fits_the_cache(tmp_path, monkeypatch):
    """On a host whose last-level cache holds every probe network's step, the loop probe writes α and h_fit but
    no h; the skip check wanted h, so every resumed calibration ran the whole 15-minute probe again (issue 34)."""
    fakes = Fakes(monkeypatch, cache_bytes=2**30)
    nocache = HostCache(KEY, None)
    table = open_tables(tmp_path)["device"]
    run_probes(table, ProbeNeeds(2), cache=nocache)
    rows = device_rows(tmp_path)
    assert "optimizer_in_loop_extra_s" not in rows and "optimizer_in_loop_extra_fit_s" in rows
    measured = list(fakes.loop)
    again = run_probes(open_tables(tmp_path)["device"], ProbeNeeds(2), cache=nocache)
    assert fakes.loop == measured and set(again.sources.values()) == {"present"}
    assert present(lambda q: q in rows, ProbeNeeds(2))


def test_an_interrupted_loop_probe_resumes_at_the_process_it_stopped_in(tmp_path, monkeypatch):
    monkeypatch.setattr(host_probes, "ROUNDS", 3)
    monkeypatch.setattr(host_probes, "NETWORKS", {**host_probes.NETWORKS,
                                                  "heap_refault_fraction": ("mlp", "cnn")})
    fakes = Fakes(monkeypatch, stop_after=4)
    cache = HostCache(KEY, tmp_path / "cache")
    with pytest.raises(KeyboardInterrupt):
        run_probes(open_tables(tmp_path / "p")["device"], ProbeNeeds(2, fit=False, host_ops=False), cache=cache)
    assert fakes.loop == ["mlp", "cnn", "mlp", "cnn"]
    fakes.stop_after = None
    run_probes(open_tables(tmp_path / "p")["device"], ProbeNeeds(2, fit=False, host_ops=False), cache=cache)
    assert fakes.loop == ["mlp", "cnn", "mlp", "cnn", "mlp", "cnn"]  # the 2 missing processes only
    how = device_rows(tmp_path / "p")["heap_refault_fraction"]["how"]
    assert "median over 6 processes" in how and "4 of the 6 processes reused" in how


def test_progress_counts_the_probe_processes(tmp_path, monkeypatch):
    Fakes(monkeypatch)
    seen = []
    run_probes(open_tables(tmp_path)["device"], ProbeNeeds(2), cache=HostCache(KEY, None),
               progress=lambda i, n, label, status: seen.append((i, n, label, status)))
    assert (0, 1, "fresh-page probe (2 threads, a fresh process)", "waiting") in seen  # the clock may tick
    assert any(label.startswith("loop probe (heap) 1/1: mlp") for _, _, label, _ in seen)
    assert (0, 1, "host probe (an eager step against its operators replayed)", "running") in seen  # timed here


def test_cache_entries_are_keyed_atomic_and_survive_garbage(tmp_path):
    cache = HostCache(KEY, tmp_path)
    assert cache.get("p", {"threads": 2}) is None
    entry = cache.put("p", {"threads": 2}, [1.5, 2], 3.0)
    assert cache.get("p", {"threads": 2}).value == [1.5, 2] and cache.get("p", {"threads": 1}) is None
    entry.path.write_text("{not json")  # a damaged entry is measured again, never an error
    assert cache.get("p", {"threads": 2}) is None
    data = {"format": 1, "probe": "p", "params": {"threads": 2}, "host": {**KEY, "cpu": "x"}, "value": 1}
    entry.path.write_text(json.dumps(data))
    assert cache.get("p", {"threads": 2}) is None  # an entry of another host is not read
    assert HostCache(KEY, None).put("p", {}, 1, 1.0) is None and not HostCache(KEY, None).enabled


def test_cache_root_honours_the_environment(monkeypatch, tmp_path):
    from dlsim.io.host_cache import cache_root
    monkeypatch.setenv("DLSIM_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.setenv("DLSIM_CACHE_DIR", "off")
    assert cache_root() is None
    monkeypatch.delenv("DLSIM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "dlsim" / "hosts"


@pytest.mark.torch
def test_the_generic_grid_is_measured_once_per_host(tmp_path, monkeypatch):
    """A second profile on the same host copies the generic grid's rows from the host cache instead of timing
    them again (2 x 2,912 kernels: 12 of a ResNet-18 calibration's 18 minutes on the shared machine)."""
    pytest.importorskip("torch")
    import dlsim.api.calibrate_compute as cc
    from dlsim.calibrate.compute_plan import GemmTask, memory_sweep
    from dlsim.cost.layers import Gemm
    from dlsim.api.host_grid import grid_params
    from dlsim.calibrate import compute_run
    from dlsim.calibrate import host_probe
    Fakes(monkeypatch)
    monkeypatch.setenv("DLSIM_CACHE_DIR", str(tmp_path / "cache"))  # this test's own cache: its speeds are fakes
    monkeypatch.setattr(host_probe, "reference_speeds", lambda threads: {"threads": 1, "gemm_flops_per_s": 1e10,
                                                                       "stream_bytes_per_s": 1e10})
    monkeypatch.setattr(compute_run, "STREAM_ELEMENTS", 2**16)  # the device rows on small tensors: a quick test
    monkeypatch.setattr(compute_run, "SOFTMAX_ELEMENTS", 2**14)
    monkeypatch.setattr(cc, "gemm_grid", lambda dtypes: [GemmTask("fp32", Gemm(m, 8, 8)) for m in (1, 2, 4, 8)])
    monkeypatch.setattr(cc, "memory_sweep", lambda dtypes: memory_sweep(dtypes, ops=("relu",), elements=(4096,)))
    monkeypatch.setattr(cc, "optimizer_sweep", lambda: [])
    kw = dict(models=[tiny_model(tmp_path)], batches=[2], repeats=1, flush_cache=False, threads=1)
    first = cc.calibrate_compute(tmp_path / "a", **kw)
    assert first["grid_rows"]["copied_from_host_cache"] == 0 and first["grid_rows"]["kept_in_host_cache"]
    second = cc.calibrate_compute(tmp_path / "b", **kw)
    grid = second["grid_rows"]
    assert grid["kernels"] == 6 and grid["copied_from_host_cache"] == 6 and grid["measured"]
    assert second["measured"] == first["measured"] - 6  # the model's kernels only
    rows = lambda p: sorted(r["time_s"] for r in csv.DictReader(open(p / "gemm.csv")) if r["set"] == "grid")
    assert rows(tmp_path / "b") == rows(tmp_path / "a")
    third = cc.calibrate_compute(tmp_path / "c", **kw, reuse_probes=False)  # --reprobe: timed again
    assert third["grid_rows"]["copied_from_host_cache"] == 0 and third["measured"] == first["measured"]
    tasks = cc.gemm_grid(["fp32"])
    timing = dict(dtypes=["fp32"], threads=1, repeats=1, flush=False, statistic="median", passes=1)
    assert grid_params(tasks, **timing) != grid_params(tasks, **{**timing, "repeats": 2})  # another timing, key
    assert grid_params(tasks, **timing) != grid_params(tasks[:3], **timing)  # another grid, another key
