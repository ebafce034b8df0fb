"""The plain loop's shares beyond the tables (dlsim.calibrate.loop_probe, measured in fresh default processes): the
heap's re-faulted bytes α, the bytes α applies to (measured per layer at capture), the optimizer's in-loop factor ρ."""

from __future__ import annotations

import pytest

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
    assert run["optimizer_in_loop_s"] > 0 and run["optimizer_flushed_s"] > 0


def test_loop_rows_are_medians_over_fresh_processes():
    from dlsim.calibrate.loop_probe import OPTIMIZER, REFAULT, loop_probe_rows, probe_values
    values = probe_values(1, ("mlp", "conv1d"))
    assert set(values) == {REFAULT, OPTIMIZER}
    assert all(set(v) == {"mlp", "conv1d"} for v in values.values())
    assert all(len(x) == 1 and 0 <= x[0] <= 1 for x in values[REFAULT].values())
    assert all(len(x) == 1 and 0 <= x[0] < 0.1 for x in values[OPTIMIZER].values())  # seconds a step pays extra
    rows = {r["quantity"]: r for r in loop_probe_rows(1, ("mlp",))}
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
    # the forkserver's child ran the probe for a second or more; the load watch must not call it another user's
    assert health._own_cpu() - before > 0.3
