"""The plain loop's shares beyond the tables (dlsim.calibrate.loop_probe, measured in fresh default processes): the
heap's re-faulted bytes α, the bytes α applies to (measured per layer at capture), the optimizer step's in-loop
extras h and h_fit."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")


def test_probe_networks_train_and_request_at_least_their_activations():
    from dlsim.calibrate.loop_probe import PROBES, measure_in_this_process, probe_network
    for name in PROBES:
        shape, batch = PROBES[name]
        out = probe_network(name)(torch.randn(batch, *shape))
        assert tuple(out.shape) == (batch, 10)
    run = measure_in_this_process("mlp")
    # one step allocates at least the two 2048-wide hidden activations of 128 samples, forward and backward
    assert run["requested"] >= 2 * 2 * 128 * 2048 * 4 and run["faulted"] >= 0
    assert run["optimizer_in_loop_s"] > 0 and run["optimizer_flushed_s"] > 0 and run["optimizer_back_to_back_s"] > 0
    # footprint: what the step requests plus 16 bytes per parameter (weights, gradients, Adam's two moments)
    params = 512 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 10 + 10
    assert run["footprint"] == pytest.approx(run["requested"] + 16 * params)


def test_loop_rows_are_medians_over_fresh_processes(monkeypatch):
    from dlsim.calibrate import compute_timer
    from dlsim.calibrate.loop_probe import OPTIMIZER, OPTIMIZER_FIT, REFAULT, loop_probe_rows, probe_values
    monkeypatch.setattr(compute_timer, "last_level_cache_bytes", lambda device: 32 * 2**20)
    values = probe_values(1, ("mlp", "conv1d", "mlp_small"))
    assert set(values) == {REFAULT, OPTIMIZER, OPTIMIZER_FIT}
    # α from the heap probes only; each probe's optimizer extra goes to its footprint's regime (32 MiB cache)
    assert set(values[REFAULT]) == {"mlp", "conv1d"} and all(len(x) == 1 and 0 <= x[0] <= 1
                                                              for x in values[REFAULT].values())
    assert set(values[OPTIMIZER]) == {"mlp", "conv1d"} and set(values[OPTIMIZER_FIT]) == {"mlp_small"}
    assert all(0 <= x[0] < 0.1 for q in (OPTIMIZER, OPTIMIZER_FIT) for x in values[q].values())  # seconds
    rows = {r["quantity"]: r for r in loop_probe_rows(1, ("mlp",))}
    assert set(rows) == {REFAULT, OPTIMIZER}  # no probe fitted the cache: no h_fit row
    assert rows[REFAULT]["unit"] == "fraction" and 0 <= float(rows[REFAULT]["value"]) <= 1
    assert rows[OPTIMIZER]["unit"] == "s" and float(rows[OPTIMIZER]["value"]) >= 0
    assert all("median over 1 processes of 1 probe networks (mlp " in r["how"] for r in rows.values())
    with pytest.raises(ValueError, match="unknown probe"):
        from dlsim.calibrate.loop_probe import probe_network
        probe_network("lenet")


def test_capture_measures_each_layers_allocations_at_two_batches(tmp_path):
    import torch.nn as nn
    from dlsim.api.importers import import_torch_module
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
    model = import_torch_module(net, [torch.randn(4, 64)], name="tiny").model
    first = model.layers[0]
    fwd_fixed, fwd_per_sample, bwd_fixed, bwd_per_sample = first.attrs["allocated_bytes"]
    # forward: the 256-wide output per sample; backward: the 64 x 256 weight gradient is fixed
    assert fwd_per_sample >= 256 * 4 and fwd_fixed < 256 * 4
    assert bwd_fixed >= 64 * 256 * 4


def test_capture_without_a_profiler_falls_back_to_the_layer_model(monkeypatch):
    import torch.nn as nn
    import torch.profiler
    from dlsim.api.importers import import_torch_module

    def broken(*args, **kwargs):
        raise RuntimeError("no profiler here")
    monkeypatch.setattr(torch.profiler, "profile", broken)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
    model = import_torch_module(net, [torch.randn(4, 64)], name="tiny").model
    assert all("allocated_bytes" not in layer.attrs for layer in model.layers)
    assert model.layers[0].attrs.get("host_ops")


def test_probe_processes_count_as_the_calibrations_own_cpu():
    from dlsim.calibrate import health
    from dlsim.calibrate.loop_probe import probe_values
    before = health._own_cpu()
    probe_values(1, ("conv1d",))
    # the spawned child ran the probe for a second or more; the load watch must not call it another user's
    assert health._own_cpu() - before > 0.3
