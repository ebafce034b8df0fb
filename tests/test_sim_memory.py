"""Memory: ZeRO stages against the ZeRO paper's formulas, recomputation, out-of-memory verdicts."""

import json

import pytest

from dlsim.api.models import as_model
from dlsim.api.simulate import simulate
from dlsim.cost.memory import state_bytes_per_param
from dlsim.plan.pipeline import closed_form_iteration
from dlsim.plan.zero import model_state_bytes
from dlsim.units import GB
from simkit import run_uniform


def test_zero_paper_figure_1():
    """Rajbhandari et al. SC'20 Fig. 1: Ψ = 7.5B, N_d = 64, K = 12 (mixed-precision Adam):
    120 GB, 31.4 GB, 16.6 GB, 1.9 GB."""
    totals = [sum(model_state_bytes(7.5e9, "fp16", "adam", z, 64).values()) / GB for z in range(4)]
    assert totals == pytest.approx([120.0, 30 + 90 / 64, 15 + 105 / 64, 120 / 64], rel=1e-12)
    assert state_bytes_per_param("fp16", "adam").optimizer == 12  # K


@pytest.fixture(scope="module")
def gpt():
    return as_model("gpt2", {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024})


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_simulated_model_states_match_formula(gpt, zero):
    psi, nd = gpt.params, 8
    r = simulate(gpt, "dgx-h100", dp=nd, microbatch_size=2, num_microbatches=2, zero=zero, dtype="fp16", stack="eager")
    mem = r.devices[0].memory
    expected = {0: 16 * psi, 1: 4 * psi + 12 * psi / nd, 2: 2 * psi + 14 * psi / nd, 3: 16 * psi / nd}[zero]
    assert mem["weights"] + mem["gradients"] + mem["optimizer"] == pytest.approx(expected, rel=1e-12)
    static = sum(v for k, v in mem.items() if k not in ("activations", "gathered_params", "comm_buffers"))
    assert r.peak_memory_bytes == pytest.approx(static + mem["activations"] + mem["gathered_params"], rel=1e-12)
    if zero == 3:  # at most two parameter units gathered at a time (prefetch one ahead)
        assert 0 < mem["gathered_params"] <= 2 * 2 * psi * (nd - 1) / nd


def test_zero3_communicates_more_than_zero2(gpt):
    z2 = simulate(gpt, "dgx-h100", dp=8, microbatch_size=2, zero=2, dtype="fp16")
    z3 = simulate(gpt, "dgx-h100", dp=8, microbatch_size=2, zero=3, dtype="fp16")
    assert z3.communication_s > z2.communication_s


@pytest.mark.parametrize("every", [1, 3])
def test_full_recompute_closed_form_and_memory(every):
    """Each backward pass first re-runs its forward: T = (m + p − 1)(2t_f + t_b). Memory keeps, per
    micro-batch in flight, the input of every group of `every` layers (a checkpoint, 0.25 each),
    plus one group's activations rematerialised (1.0 per layer) during a backward pass."""
    p, m, per = 4, 6, 3
    graph, tl, _ = run_uniform("gpipe", p, m, layers_per_chunk=per, saved=1.0, out_bytes=0.25, recompute="full",
                               recompute_layers=every)
    assert tl.makespan == closed_form_iteration("gpipe", p, m, 1, 2.0, 2.0)
    checkpoints = per // every
    assert tl.memory_peak[1] == pytest.approx(m * checkpoints * 0.25 + every * 1.0)
    plain = run_uniform("gpipe", p, m, layers_per_chunk=per, saved=1.0, out_bytes=0.25)[1]
    assert plain.memory_peak[1] == m * per


def test_selective_recompute_trades_attention_memory_for_time(gpt):
    kw = dict(microbatch_size=8, pp=2, num_microbatches=4, stack="eager")  # unfused attention: a core to recompute
    none = simulate(gpt, "dgx-h100", **kw)
    sel = simulate(gpt, "dgx-h100", recompute="selective", **kw)
    full = simulate(gpt, "dgx-h100", recompute="full", **kw)
    act = [r.devices[0].memory["activations"] for r in (none, sel, full)]
    assert act[0] > act[1] > act[2]
    assert none.breakdown.recompute == 0 < sel.breakdown.recompute < full.breakdown.recompute
    assert none.iteration_time_s < sel.iteration_time_s < full.iteration_time_s


def test_out_of_memory_is_infeasible_with_numbers(cli, tmp_path):
    r = simulate("gpt3-175b", "dgx-h100", dp=2, tp=8, pp=2, microbatch_size=1, num_microbatches=4)
    assert not r.feasible
    assert r.infeasible_reason.startswith("out of memory on rank0") and "needs" in r.infeasible_reason
    assert "capacity" in r.infeasible_reason and "over by" in r.infeasible_reason
    out = tmp_path / "oom.json"
    code, stdout, err = cli("simulate", "gpt3-175b", "--cluster", "dgx-h100", "--dp", "2", "--tp", "8", "--pp", "2",
                            "--microbatch-size", "1", "--num-microbatches", "4", "--json", str(out))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and errors[0].startswith("error: out of memory on rank0")
    rec = json.loads(out.read_text())
    assert rec["feasible"] is False and rec["peak_memory_bytes"] > rec["devices"][0]["capacity_bytes"]
