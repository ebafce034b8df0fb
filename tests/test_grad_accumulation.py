"""Gradient accumulation across micro-batches: the kernel that adds each micro-batch's weight
gradients into the gradient buffer (strategy key `grad_accumulation`)."""

import pytest

from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import simulate
from dlsim.cost.memory import grad_accumulation_bytes
from dlsim.cost.roofline import roofline_time
from dlsim.errors import SpecError
from dlsim.plan.layertable import build_layer_table

GPT = {"layers": 2}
RUN = dict(dp=1, tp=1, pp=1, microbatch_size=2, dtype="fp16")


@pytest.mark.parametrize("mode, m, expected", [
    ("autograd", 1, 0.0), ("autograd", 4, 3 * 2 * 3 / 4), ("main_grad", 1, 6.0), ("main_grad", 8, 6.0),
    ("main_grad_fp32", 3, 10.0), ("fused_fp32", 8, 0.0), ("none", 8, 0.0),
])
def test_bytes_per_parameter_per_micro_batch(mode, m, expected):
    assert grad_accumulation_bytes(mode, "fp16", m) == pytest.approx(expected)


@pytest.mark.parametrize("mode, dtype, per_param", [("main_grad", "fp16", 6.0), ("cast_add_fp32", "bf16", 18.0)])
def test_every_micro_batch_pays_one_memory_bound_kernel_per_layer_with_parameters(mode, dtype, per_param):
    """dp = tp = pp = 1: nothing overlaps the backward pass, so the iteration grows by exactly
    m x sum over layers of the roofline time of params x its bytes per parameter (main_grad in fp16:
    6; DeepSpeed's cast then add into the fp32 buffer in bf16: 18)."""
    model, cluster = as_model("gpt2", GPT), as_cluster("dgx-a100")
    m = 3
    run = {**RUN, "dtype": dtype}
    base = simulate(model, cluster, num_microbatches=m, grad_accumulation="none", **run)
    charged = simulate(model, cluster, num_microbatches=m, grad_accumulation=mode, **run)
    entries = build_layer_table(model, cluster.device, dtype, batch=2, tp=1)
    kernels = sum(roofline_time(0.0, e.params * per_param, cluster.device, "fp32", matrix=False,
                                kernel="grad_accumulation").seconds for e in entries if e.params)
    assert charged.iteration_time_s - base.iteration_time_s == pytest.approx(m * kernels, rel=1e-9)
    assert kernels > 0


def test_autograd_keeps_the_first_micro_batch_gradient():
    model, cluster = as_model("gpt2", GPT), as_cluster("dgx-a100")
    one = [simulate(model, cluster, num_microbatches=1, grad_accumulation=g, **RUN).iteration_time_s
           for g in ("autograd", "none")]
    assert one[0] == one[1]
    four = [simulate(model, cluster, num_microbatches=4, grad_accumulation=g, **RUN).iteration_time_s
            for g in ("none", "autograd", "main_grad")]
    assert four[0] < four[1] < four[2]


def test_megatron_fp16_stack_pays_more_than_the_fused_fp32_one():
    model, cluster = as_model("gpt2", GPT), as_cluster("dgx-a100")
    t = {g: simulate(model, cluster, num_microbatches=4, grad_accumulation=g, **RUN).iteration_time_s
         for g in ("fused_fp32", "main_grad", "main_grad_fp32")}
    assert t["fused_fp32"] < t["main_grad"] < t["main_grad_fp32"]


def test_unknown_mode_is_one_clear_error(tmp_path, cli):
    with pytest.raises(SpecError, match="grad_accumulation"):
        simulate("gpt2", "dgx-a100", grad_accumulation="sometimes")
    path = tmp_path / "s.yaml"
    path.write_text("dp: 2\ngrad_accumulation: sometimes\n")
    code, out, err = cli("simulate", "gpt2", "--cluster", "dgx-a100", "--strategy", path)
    assert code == 1
    assert "grad_accumulation" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_flag_reaches_the_record(cli):
    code, out, err = cli("simulate", "gpt2", "--cluster", "dgx-a100", "--num-microbatches", "2",
                         "--grad-accumulation", "main_grad", "--json")
    assert code == 0, err
    assert '"grad_accumulation": "main_grad"' in out
