"""Cold/warm kernel tables and the cache rule that picks between them (dlsim.cost.lookup.CacheAwareKernelTimes)."""

from __future__ import annotations

import csv

import pytest

from dlsim.cost.layers import layer_cost
from dlsim.cost.lookup import GEMM_COLUMNS, CacheAwareKernelTimes, GemmRow, MeasuredKernelTimes, record
from dlsim.cost.memory import training_working_set
from dlsim.io.kernel_tables import load_kernel_times
from dlsim.io.profile_yaml import load_profile
from dlsim.results import Source
from dlsim.spec.model import build_model

from tests.test_lookup import write_profile


def mlp():
    return build_model("mlp", "fp32", (32,), "tensor", [{"name": "fc", "type": "linear", "out_features": 16, "bias": False},
                                                         {"name": "loss", "type": "cross_entropy"}])


def test_training_working_set_by_hand():
    model, batch = mlp(), 4
    costs = {layer.name: layer_cost(layer, batch, "fp32") for layer in model.layers}
    ws = training_working_set(model, costs, batch, "fp32", "adam")
    # 512 weights: 4 B weight + 4 B gradient + 8 B Adam state = 16 B each
    state = 512 * 16
    from dlsim.cost.memory import activation_bytes
    kept = sum(activation_bytes(model, costs, batch, "fp32").values())
    largest = 4 * 16 * 4  # fc output 16 features x 4 samples x 4 bytes (the loss outputs one number)
    assert ws == state + kept + largest
    assert kept > 0


def test_rule_mixes_warm_and_cold_by_the_share_of_the_working_set_the_cache_cannot_hold():
    cold = MeasuredKernelTimes([GemmRow("fp32", 4, 16, 32, 1, 2e-5, set="model")])
    warm = MeasuredKernelTimes([GemmRow("fp32", 4, 16, 32, 1, 1e-5, set="model")])
    from dlsim.cost.layers import Gemm
    g = Gemm(4, 16, 32)
    both = CacheAwareKernelTimes(cold, warm, cache_bytes=1000.0)
    assert both.gemm(g, "fp32").seconds == 2e-5  # no share set yet: cold
    fits, note = both.for_working_set(1000.0)
    assert fits.regime == "warm" and "warm" in note and fits.gemm(g, "fp32").seconds == 1e-5
    assert fits.gemm(g, "fp32").note.startswith("warm ")
    over, note = both.for_working_set(1250.0)  # the cache holds 1000 of 1250 bytes: a fifth misses
    assert over.regime == "mixed" and "0.20" in note
    assert over.gemm(g, "fp32").seconds == pytest.approx(1e-5 + 0.2 * 1e-5)
    huge, _ = both.for_working_set(1e9)
    assert huge.gemm(g, "fp32").seconds == pytest.approx(2e-5, rel=1e-5)
    no_warm, note = CacheAwareKernelTimes(cold, None, 1000.0).for_working_set(10.0)
    assert no_warm.regime == "cold" and "no warm tables" in note
    unknown, note = CacheAwareKernelTimes(cold, warm, None).for_working_set(10.0)
    assert unknown.regime == "cold" and "no last-level cache size" in note


def test_warm_regime_falls_back_to_cold_for_unmeasured_kernels():
    from dlsim.cost.layers import Gemm
    cold = MeasuredKernelTimes([GemmRow("fp32", 8, 8, 8, 1, 3e-5, set="model")])
    warm = MeasuredKernelTimes([GemmRow("fp32", 4, 16, 32, 1, 1e-5, set="model")])
    w, _ = CacheAwareKernelTimes(cold, warm, 1e9).for_working_set(1.0)
    est = w.gemm(Gemm(8, 8, 8), "fp32")
    assert est.seconds == 3e-5 and est.source == Source.MEASURED and "no warm row" in est.note
    with pytest.raises(ValueError):
        CacheAwareKernelTimes(cold, warm, 1.0, cold_share=1.5)


def _profile_with_warm(folder, cache_bytes):
    model = mlp()
    cost = layer_cost(model.layers[0], 4)
    shapes = [cost.forward.gemms[0], cost.backward_data.gemms[0], cost.backward_weight.gemms[0]]
    cold = [GemmRow("fp32", g.m, g.n, g.k, 1, t, set="model") for t, g in zip((1e-5, 2e-5, 3e-5), shapes)]
    warm = [GemmRow("fp32", g.m, g.n, g.k, 1, t / 2, set="model") for t, g in zip((1e-5, 2e-5, 3e-5), shapes)]
    write_profile(folder, cold, extra="tables: {gemm: gemm.csv, conv: conv.csv, memory: memory.csv, "
                                      "gemm_warm: gemm-warm.csv}\n")
    with open(folder / "gemm-warm.csv", "w", newline="") as handle:
        w = csv.DictWriter(handle, GEMM_COLUMNS)
        w.writeheader()
        for r in warm:
            w.writerow(record(r))
    if cache_bytes is not None:
        (folder / "meta.yaml").write_text(f"device: {{last_level_cache_bytes: {cache_bytes}}}\n")
    return model, folder


@pytest.mark.parametrize("cache_bytes", [32 * 2**20, 1000, None])
def test_estimate_chooses_tables_by_working_set(tmp_path, cache_bytes):
    from dlsim.api.estimate import estimate
    from dlsim.cost.memory import training_working_set
    model, folder = _profile_with_warm(tmp_path / "p", cache_bytes)
    times, notes = load_kernel_times(load_profile(folder))
    assert isinstance(times, CacheAwareKernelTimes) and times.warm is not None
    assert "warm tables" in notes[0]
    result = estimate(model, folder, 4, optimizer="sgd")
    costs = {layer.name: layer_cost(layer, 4) for layer in model.layers}
    ws = training_working_set(model, costs, 4, "fp32", "sgd")
    share = 1.0 if cache_bytes is None else max(0.0, 1 - cache_bytes / ws)
    assert ws > 1000 and (cache_bytes is None or cache_bytes > ws or share > 0.5)
    assert result.layers[0].forward.seconds == pytest.approx(0.5e-5 + share * 0.5e-5)
    assert any(n.startswith("cache regime:") for n in result.notes)


def test_profile_without_warm_tables_reads_as_before(tmp_path):
    from dlsim.api.estimate import estimate
    model = mlp()
    cost = layer_cost(model.layers[0], 4)
    folder = write_profile(tmp_path / "p", [GemmRow("fp32", cost.forward.gemms[0].m, cost.forward.gemms[0].n,
                                                    cost.forward.gemms[0].k, 1, 7e-6, set="model")],
                           extra="tables: {gemm: gemm.csv, conv: conv.csv, memory: memory.csv}\n")
    times, _ = load_kernel_times(load_profile(folder))
    assert times.warm is None
    assert estimate(model, folder, 4, optimizer="sgd").layers[0].forward.seconds == 7e-6


def test_bad_cache_size_in_meta_is_one_error(tmp_path):
    from dlsim.errors import SpecError
    _, folder = _profile_with_warm(tmp_path / "p", None)
    (folder / "meta.yaml").write_text("device: {last_level_cache_bytes: -3}\n")
    with pytest.raises(SpecError, match="last_level_cache_bytes"):
        load_kernel_times(load_profile(folder))
