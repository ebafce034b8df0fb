"""Tensor-parallel overlap as Transformer Engine's userbuffers run it (`dlsim.plan.tpoverlap`): the
simulation held to the ring-exchange, pipelined and bulk closed forms, the per-chunk GEMMs priced as
GEMMs of their own shapes, the userbuffers' memory, the evaluator held to the simulation, the field
refused where it means nothing, dropped from a stack where it does not apply, and round-tripped
through a strategy file. Tests that compute by hand name the `eager` stack."""

from __future__ import annotations

import math

import pytest
import yaml

from dlsim.api.analytic import estimate_strategy
from dlsim.api.optimize import EVALUATOR_TOLERANCE
from dlsim.api.simulate import prepare, simulate
from dlsim.cost.layers import Gemm
from dlsim.cost.pricing import gemm_seconds
from dlsim.errors import SpecError
from dlsim.io.strategy_yaml import load_strategy, strategy_document
from dlsim.plan.tpoverlap import BULK, CONFIGS, PIPELINE, RING
from dlsim.spec.strategy import make_strategy

H, SEQ, TP = 1024, 1024, 4
SMALL = {"layers": 1, "hidden": H, "heads": 16, "seq_len": SEQ, "positions": SEQ}
RUN = dict(tp=TP, dp=1, pp=1, microbatch_size=1, num_microbatches=1, sequence_parallel=True, stack="eager",
           dtype="bf16", fused_kernels=("flash_attention",))


def _closed(g, c: float, first: float, sms: int, config: bool | str) -> float:
    """The module docstring's closed forms, a step beside a chunk x as the bulk form prices it:
    x + o·σ/(1 + σ) + max(0, c − x(1 + σ)), o = min(c, x(1 + σ)) (max(x, c) at σ = 0), σ = 0 where the
    GEMM runs on the SMs the communication leaves (a ring's copy engines, a pipeline's SM margin), else
    num_sm/(S − num_sm); ring (n − 1)·beside + x after its pair exchange where aggregated, pipelined
    x + (N − 1)·beside + c, bulk beside."""
    u = CONFIGS[config][g.buffer]
    sigma = 0.0 if g.method == RING or (g.method == PIPELINE and u.set_sm_margin) else u.num_sm / (sms - u.num_sm)
    x = g.chunk
    o = min(c, x * (1 + sigma))
    beside = x + o * sigma / (1 + sigma) + max(0.0, c - x * (1 + sigma))
    if g.method == RING:
        return (first if u.aggregate else 0.0) + (g.chunks - 1) * beside + x
    if g.method == PIPELINE:
        return x + (g.chunks - 1) * beside + c
    return beside


def _chunked(config: bool | str = True, **fields):
    """The layers' chunked GEMMs, the price of a collective over the tp group, the device."""
    p = prepare("gpt3-175b", "dgx-h100", overrides=SMALL, **dict(RUN, tp_comm_overlap=config, **fields))
    s, b = p.strategy, p.builder
    pricer, ranks = b.pricer(s), b.layout(s).tp_group(0, 0)

    def price(c) -> float:
        if c is None:
            return 0.0
        if c.op == "sendrecv":
            return max(pricer.p2p(c.nbytes, a, z).seconds for a, z in zip(ranks, ranks[1:] + ranks[:1]))
        return pricer.collective(c.op, c.nbytes, ranks).seconds
    return [(e, g) for e in b.strategy_base(s).entries for g in e.tp_overlap], price, b.device


@pytest.mark.parametrize("config", list(CONFIGS))
def test_simulation_equals_the_closed_forms(config):
    """One micro-batch on one pipeline stage: the iteration with overlap is the blocking one with each
    collective and its GEMM replaced by the closed form of its method (all three methods present), in
    Transformer Engine's default configuration and in each recipe's (the 405B's rings aggregated)."""
    chunked, price, device = _chunked(config)
    assert {g.method for _, g in chunked} == {RING, PIPELINE, BULK}
    assert any(g.first is not None for _, g in chunked) == (config == "llama3.1-405b" or config == "gpt3-175b")
    blocking = simulate("gpt3-175b", "dgx-h100", overrides=SMALL, **RUN).iteration_time_s
    overlapped = simulate("gpt3-175b", "dgx-h100", overrides=SMALL, **RUN, tp_comm_overlap=config).iteration_time_s
    expected = blocking + sum(_closed(g, price(g.step), price(g.first), device.sm_count, config) - g.whole
                              - price(g.replaces) for _, g in chunked)
    assert overlapped == pytest.approx(expected, rel=1e-9)
    assert overlapped != pytest.approx(blocking, rel=1e-3)


def test_chunks_are_gemms_of_their_own_shapes():
    """A ring-exchange chunk is the GEMM of 1/tp of the rows, a pipelined chunk the GEMM of 1/4 of the
    output features on the SMs the reduce-scatter kernels leave, each priced as a GEMM (not a fraction
    of the whole GEMM's time)."""
    chunked, _, device = _chunked("llama3.1-70b")
    by = {g.buffer: g for _, g in chunked}
    rows = SEQ  # one sample
    fc1 = Gemm(rows // TP, 4 * H // TP, H)  # column-parallel: output features split over tp
    assert by["fc1_fprop"].chunk == gemm_seconds(fc1, device, "bf16")
    assert by["fc1_fprop"].chunks == TP
    fc2 = Gemm(rows, H // 4, 4 * H // TP)  # row-parallel: the reduction split over tp
    margin = device.sm_count / (device.sm_count - CONFIGS["llama3.1-70b"]["fc2_fprop"].num_sm)
    assert by["fc2_fprop"].chunk == pytest.approx(gemm_seconds(fc2, device, "bf16") * margin, rel=1e-12)
    assert by["fc2_fprop"].chunks == 4
    assert by["fc1_fprop"].chunk * TP > by["fc1_fprop"].whole  # smaller GEMMs, lower efficiency
    assert by["fc1_fprop"].step.nbytes == pytest.approx(rows * H * 2 / TP)  # 1/tp of the gathered input


def test_an_aggregated_ring_runs_two_blocks_at_a_time():
    """The 405B recipe's rings (``aggregate`` 1): a pair exchange of one block, then tp/2 GEMMs of two
    blocks' rows beside exchanges of two blocks (TE comm_gemm_overlap.h split_overlap_ag, _aggregate2)."""
    chunked, _, device = _chunked("llama3.1-405b")
    g = {g.buffer: g for _, g in chunked}["fc1_fprop"]
    assert g.chunks == TP // 2
    assert g.chunk == gemm_seconds(Gemm(2 * SEQ // TP, 4 * H // TP, H), device, "bf16")
    assert g.first.nbytes == pytest.approx(SEQ * H * 2 / TP)
    assert g.step.nbytes == pytest.approx(2 * SEQ * H * 2 / TP)


def test_userbuffers_are_the_devices_workspace():
    """Ten userbuffers of the local sequence x micro-batch x hidden in bf16 (TE's initialize_ub)."""
    kw = dict(overrides=SMALL, **RUN)
    buffers = len(CONFIGS[True]) * SEQ * H * 2
    plain = simulate("gpt3-175b", "dgx-h100", **kw).peak_memory_bytes
    r = simulate("gpt3-175b", "dgx-h100", tp_comm_overlap=True, **kw)
    assert r.peak_memory_bytes - plain == pytest.approx(buffers)
    assert r.devices[0].memory["workspace"] == pytest.approx(buffers)


@pytest.mark.parametrize("fields", [dict(pp=2, dp=2, num_microbatches=4, zero=1),
                                    dict(pp=2, num_microbatches=4, schedule="interleaved", virtual_stages=2)])
def test_evaluator_agrees_with_the_simulation(fields):
    kw = dict(RUN, overrides={**SMALL, "layers": 4}, tp_comm_overlap=True, **fields)
    sim = simulate("gpt3-175b", "dgx-h100", **kw).iteration_time_s
    est = estimate_strategy("gpt3-175b", "dgx-h100", **kw)["iteration_time_s"]
    assert est == pytest.approx(sim, rel=EVALUATOR_TOLERANCE)


@pytest.mark.parametrize("fields, needs", [(dict(tp=1), "tp >= 2"), (dict(tp=4), "sequence_parallel")])
def test_refused_without_sequence_parallelism(cli, fields, needs):
    with pytest.raises(SpecError, match=needs):
        make_strategy(tp_comm_overlap=True, **fields)
    args = ["simulate", "gpt2", "--cluster", "dgx-h100", "--tp", str(fields["tp"]), "--tp-comm-overlap"]
    code, out, err = cli(*args, *(["--no-sequence-parallel"] if fields["tp"] > 1 else []))
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and "tp_comm_overlap" in err and needs in err


@pytest.mark.parametrize("fields, applied", [(dict(tp=4), True), (dict(tp=4, sequence_parallel=False), False),
                                             (dict(tp=1), False)])
def test_a_stack_sets_it_only_where_it_applies(fields, applied):
    """megatron-core runs it (the Llama 3.1 70B recipe's configuration) with tensor and sequence
    parallelism; without them its value is dropped."""
    s = prepare("gpt2", "dgx-h100", stack="megatron-core", dp=1, microbatch_size=1, **fields).strategy
    assert s.tp_comm_overlap == ("llama3.1-70b" if applied else False)


@pytest.mark.parametrize("value", [True, "gpt3-175b"])
def test_round_trips_through_a_strategy_file(tmp_path, value):
    s = make_strategy(tp=4, dp=2, sequence_parallel=True, tp_comm_overlap=value, microbatch_size=2, stack="eager")
    doc = strategy_document(s)
    assert doc["tp_comm_overlap"] == value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert load_strategy(path) == s


def test_optimize_searches_it_where_the_stack_runs_it():
    """With megatron-core the search weighs every sequence-parallel candidate with and without it."""
    from collections import Counter

    from dlsim.api.models import as_model
    from dlsim.plan.search import SearchSpace, candidates
    model = as_model("gpt3-175b", {**SMALL, "layers": 2})
    both = list(candidates(model, SearchSpace(8, 8, 8, max_microbatch_size=1, tp_comm_overlap=(False, True),
                                              fixed={"pp": 1, "recompute": "none"}), Counter()))
    sp = [s for s in both if s.sequence_parallel]
    assert sp and sum(s.tp_comm_overlap for s in sp) * 2 == len(sp)
    assert not any(s.tp_comm_overlap for s in both if not s.sequence_parallel)
    assert math.isclose(len(both) - len(sp) // 2, len(list(candidates(
        model, SearchSpace(8, 8, 8, max_microbatch_size=1, fixed={"pp": 1, "recompute": "none"}), Counter()))))
