"""Typed public API (issue 16): explicit keywords, dataclass records with to_dict(), MFU on SimResult."""

import dataclasses
import inspect
import json

import pytest

from dlsim.api.comm import AlgorithmTime, CommResult, CommSweep, comm, comm_sweep
from dlsim.api.fields import StrategyFields
from dlsim.api.simulate import run_simulation, simulate
from dlsim.cli.output import json_safe
from dlsim.spec.strategy import Strategy

SMALL = {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024}


def test_strategy_fields_name_every_strategy_field():
    assert set(StrategyFields.__annotations__) == set(Strategy.__dataclass_fields__) | {"global_batch"}


def test_simulate_keywords_are_explicit():
    params = inspect.signature(simulate).parameters
    for name in ("measured", "symmetry", "expand_collectives", "microbatch_plan", "workspace_limit", "overrides",
                 "pricer", "nodes", "given"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
    assert set(params) - {"model", "cluster", "strategy", "fields"} <= set(inspect.signature(run_simulation).parameters)


def test_mfu_is_a_property_and_in_the_record():
    r = simulate("gpt2", "dgx-h100", dp=2, microbatch_size=2, overrides=SMALL)
    assert 0 < r.mfu < 1
    assert r.to_dict()["model_flops_utilisation"] == r.mfu
    assert r.mfu == pytest.approx(r.flops_per_iteration / (r.iteration_time_s * r.total_devices * r.peak_flops))


def test_comm_returns_dataclasses_with_the_cli_json(cli):
    res = comm("allreduce", "100MB", 8, algorithm="all", cluster="dgx-h100")
    assert isinstance(res, CommResult) and all(isinstance(r, AlgorithmTime) for r in res.results)
    assert res.best == min(res.results, key=lambda r: r.time_s).algorithm
    assert all(r.lower_bound_ratio >= 1 - 1e-9 for r in res.results)
    code, out, err = cli("comm", "allreduce", "--size", "100MB", "--ranks", "8", "--cluster", "dgx-h100",
                         "--algorithm", "all", "--json")
    assert code == 0, err
    rec = json.loads(out)
    rec.pop("assumed", None)
    assert json_safe(res.to_dict()) == rec
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.best = "ring"


def test_comm_sweep_returns_a_dataclass(cli):
    sweep = comm_sweep("allreduce", "1KB:1MB", 16, algorithm="all", latency="5us", bandwidth="10GB/s")
    assert isinstance(sweep, CommSweep) and len(sweep.best) == len(sweep.sizes_bytes)
    code, out, err = cli("comm", "allreduce", "--sweep", "1KB:1MB", "--ranks", "16", "--latency", "5us",
                         "--bandwidth", "10GB/s", "--algorithm", "all", "--json")
    assert code == 0, err
    rec = json.loads(out)
    rec.pop("assumed", None)
    assert json_safe(sweep.to_dict()) == rec


def test_comm_refuses_unknown_keywords():
    with pytest.raises(TypeError):
        comm("allreduce", "1MB", 8, bandwith="10GB/s")  # a typo is a TypeError, as for any keyword call
