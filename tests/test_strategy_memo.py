"""make_strategy keeps the strategies it built (a sweep builds the same one many times): a kept one
is returned only for the same values of the same types, and bad input is refused every time."""

import pytest

from dlsim.errors import SpecError
from dlsim.spec.strategy import make_strategy


def test_same_fields_give_the_same_strategy():
    a = make_strategy(tp=2, dp=4, global_batch=64, fused_kernels=("flash_attention",))
    b = make_strategy(tp=2, dp=4, global_batch=64, fused_kernels=("flash_attention",))
    assert a is b and a == make_strategy(tp=2, dp=4, global_batch=64, fused_kernels=["flash_attention"])


def test_equal_values_of_another_type_are_validated_again():
    make_strategy(tp=1, dp=2, global_batch=8)
    with pytest.raises(SpecError) as bad:
        make_strategy(tp=True, dp=2, global_batch=8)  # True == 1 in Python; the validator refuses it
    assert bad.value.field == "tp"
    make_strategy(tp=2, stage_partition=(1, 2), pp=2, dp=1, global_batch=4)
    with pytest.raises(SpecError):
        make_strategy(tp=2, stage_partition=(True, 2), pp=2, dp=1, global_batch=4)


def test_refused_input_is_refused_every_time():
    for _ in range(2):
        with pytest.raises(SpecError):
            make_strategy(tp=3, dp=2, global_batch=7, microbatch_size=2)
