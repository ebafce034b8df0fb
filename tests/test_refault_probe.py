"""The heap re-fault fraction α (dlsim.calibrate.refault_probe): measured in fresh default processes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_probe_networks_train_and_request_at_least_their_activations():
    from dlsim.calibrate.refault_probe import PROBES, measure_in_this_process, probe_network
    for name in PROBES:
        shape, batch = PROBES[name]
        out = probe_network(name)(torch.randn(batch, *shape))
        assert tuple(out.shape) == (batch, 10)
    faulted, requested = measure_in_this_process("mlp")
    # one step allocates at least the two 2048-wide hidden activations of 128 samples, forward and backward
    assert requested >= 2 * 2 * 128 * 2048 * 4 and faulted >= 0


def test_refault_row_is_the_median_over_fresh_processes():
    from dlsim.calibrate.refault_probe import QUANTITY, refault_fractions, refault_rows
    fractions = refault_fractions(1, ("mlp", "conv1d"))
    assert set(fractions) == {"mlp", "conv1d"} and all(len(v) == 1 and 0 <= v[0] <= 1 for v in fractions.values())
    row = refault_rows(1, ("mlp",))[0]
    assert row["quantity"] == QUANTITY and row["unit"] == "fraction" and 0 <= float(row["value"]) <= 1
    assert "median over 1 processes of 1 probe networks (mlp " in row["how"]
    with pytest.raises(ValueError, match="unknown probe"):
        from dlsim.calibrate.refault_probe import probe_network
        probe_network("lenet")
