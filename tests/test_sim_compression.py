"""Gradient compression: payload sizes by hand (reference/algorithms.md §7) and their effect."""

import math

import pytest

from dlsim.api.models import as_model
from dlsim.api.simulate import simulate
from dlsim.plan.comm import sparse_op
from dlsim.plan.compression import error_feedback_bytes, plan_sync
from dlsim.spec.strategy import Compression

N = 1_000_000  # fp32 gradient elements
NB = 4 * N


def test_payloads():
    assert plan_sync(Compression("none"), NB, 4, 8).collectives == (("allreduce", NB),)
    assert plan_sync(Compression("fp16"), NB, 4, 8).collectives == (("allreduce", 2 * N),)
    q = 4 * N / 8 + 4 * math.ceil(N / 512)
    assert plan_sync(Compression("qsgd", bits=4), NB, 4, 8).collectives == (("reduce_scatter", q), ("allgather", q))
    one = N / 8 + 8 * math.ceil(N / 512)
    assert plan_sync(Compression("1bit"), NB, 4, 8).payload == one
    top = plan_sync(Compression("topk", density=0.01), NB, 4, 8)
    # SparCML's sparse allreduce of the dense bucket (dlsim.cost.collectives.sparse); its buffers hold
    # the 8-byte items sent and the reduced sum, sparse while smaller than the dense bucket
    assert top.payload == 8 * 10_000 and top.collectives == ((sparse_op(0.01, 4), NB),)
    assert top.buffer_bytes == pytest.approx(8 * 10_000 + 8 * N * (1 - 0.99 ** 8))
    assert plan_sync(Compression("topk", density=0.7), NB, 4, 8).buffer_bytes == 2 * NB  # sent and summed dense
    # SparCML's quantised top-k (TopK_Q4): 4-bit values and one fp32 scale per 512 elements beside 32-bit indices
    q4 = plan_sync(Compression("topk", density=0.01, value_bits=4), NB, 4, 8)
    assert q4.payload == pytest.approx((4 + 0.5 + 4 / 512) * 10_000)
    assert q4.collectives == ((sparse_op(0.01, 0.5 + 4 / 512), N * (0.5 + 4 / 512)),)
    assert plan_sync(Compression("fp16"), 2 * N, 2, 8).compress == (0.0, 0.0)  # already 16-bit
    assert error_feedback_bytes(Compression("topk"), N) == 4 * N and error_feedback_bytes(Compression("fp16"), N) == 0


def test_compression_cuts_communication_on_a_slow_network():
    kw = dict(dp=16, microbatch_size=32, overlap=False)
    plain = simulate("alexnet", "gpu-2013", **kw)
    half = simulate("alexnet", "gpu-2013", compression=Compression("fp16"), **kw)
    sparse = simulate("alexnet", "gpu-2013", compression=Compression("topk", density=0.001), **kw)
    assert sparse.communication_s < half.communication_s < plain.communication_s
    assert half.communication_s == pytest.approx(plain.communication_s / 2, rel=0.05)
    assert sparse.iteration_time_s < plain.iteration_time_s
    assert sparse.devices[0].memory["error_feedback"] == 4 * as_model("alexnet").params


def test_compressed_payloads_are_held_until_decompressed():
    r = simulate("alexnet", "gpu-2013", dp=8, microbatch_size=32, compression=Compression("qsgd", bits=4))
    assert r.devices[0].memory["comm_buffers"] > 0
    plain = simulate("alexnet", "gpu-2013", dp=8, microbatch_size=32)
    assert plain.devices[0].memory["comm_buffers"] == 0
