"""The cyclic collector is paused only while a prediction runs (`dlsim.api.gcpause`)."""

import gc

import pytest

from dlsim.api.gcpause import paused_gc
from dlsim.api.simulate import simulate


def test_paused_inside_restored_after_return_and_error():
    seen = []

    @paused_gc
    def probe(fail: bool = False):
        seen.append(gc.isenabled())
        if fail:
            raise ValueError("boom")
        return 7

    assert gc.isenabled()
    assert probe() == 7
    assert seen == [False] and gc.isenabled()
    with pytest.raises(ValueError):
        probe(fail=True)
    assert seen == [False, False] and gc.isenabled()


def test_left_disabled_when_the_caller_disabled_it():
    gc.disable()
    try:
        paused_gc(lambda: None)()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_simulation_restores_the_collector():
    r = simulate("gpt2", "dgx-a100", dp=2, global_batch=8)
    assert r.iteration_time_s > 0 and gc.isenabled()
