"""Offload to host memory: copy times over the host link against latency + bytes / bandwidth,
memory moved off the device, one-line refusals."""

from __future__ import annotations

import pytest

from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import run_simulation, simulate
from dlsim.errors import SpecError
from dlsim.plan.layertable import build_layer_table
from dlsim.plan.offload import OFFLOAD_SLICES, host_transfer
from dlsim.plan.partition import partition

TINY = {"layers": 4, "hidden": 512, "heads": 8, "kv_heads": 4, "ffn_hidden": 1024, "seq_len": 1024, "vocab": 1000}
KW = dict(dp=1, tp=1, pp=2, microbatch_size=1, num_microbatches=4, dtype="bf16", measured=False, overrides=TINY,
          stack="eager")


def _events(sim, prefix):
    return [e for e in sim.trace["traceEvents"] if e.get("ph") == "X" and e["name"].startswith(prefix)]


def test_host_transfer_closed_form():
    link = as_cluster("dgx-h100").host
    assert link.name == "pcie-gen5-x16"
    n = 3.0e9
    assert host_transfer(link, n).seconds == pytest.approx(link.latency + n / (link.bandwidth * link.bandwidth_efficiency))
    assert host_transfer(link, 0).seconds == 0.0


def test_activation_copies_take_latency_plus_bytes_over_bandwidth():
    """Each D2H / H2D copy of a chunk's kept activations lasts t = L + n / (B · e) exactly."""
    sim = run_simulation("llama3-8b", "dgx-h100", offload="activations", trace=True, **KW)
    cluster, model = as_cluster("dgx-h100"), as_model("llama3-8b", TINY)
    entries = build_layer_table(model, cluster.device, "bf16", batch=1, tp=1)
    ranges = partition(model, [e.forward.seconds + e.backward.seconds for e in entries], 2)
    link = cluster.host
    expected = {round((link.latency + sum(e.saved_bytes for e in entries[a:b]) / link.effective_bandwidth) * 1e6, 6)
                for a, b in ranges}
    d2h, h2d = _events(sim, "D2H activations"), _events(sim, "H2D activations")
    assert d2h and len(d2h) == len(h2d)
    assert {round(e["dur"], 6) for e in d2h} <= expected
    assert {round(e["dur"], 6) for e in h2d} <= expected
    # the last stage's backward follows its forward for the last micro-batch: nothing to offload there
    assert len(d2h) < 2 * KW["num_microbatches"]


def test_optimizer_state_leaves_the_device():
    plain = simulate("llama3-8b", "dgx-h100", **KW).devices[0]
    off = simulate("llama3-8b", "dgx-h100", offload="optimizer", **KW).devices[0]
    assert plain.memory["optimizer"] > 0 and off.memory["optimizer"] == 0
    # the state is off the device but for at most two of its streamed slices at a time
    state, slice_ = plain.memory["optimizer"], plain.memory["optimizer"] / OFFLOAD_SLICES
    assert plain.peak_memory_bytes - state <= off.peak_memory_bytes <= plain.peak_memory_bytes - state + 2 * slice_


def test_optimizer_copies_priced_on_the_host_link():
    sim = run_simulation("llama3-8b", "dgx-h100", offload="optimizer", trace=True, **KW)
    plain = simulate("llama3-8b", "dgx-h100", **KW).devices[0].memory["optimizer"]
    link = as_cluster("dgx-h100").host
    ins = _events(sim, "H2D optimizer state")
    assert len(ins) == 2 * OFFLOAD_SLICES  # two stages
    durations = sorted({round(e["dur"], 6) for e in ins})
    # the first stage holds the simulated device 0's state; its slices last L + (state / 8) / (B e)
    assert round((link.latency + plain / OFFLOAD_SLICES / link.effective_bandwidth) * 1e6, 6) in durations


def test_offload_refusals():
    with pytest.raises(SpecError, match="host_link"):
        simulate("llama3-8b", "dgx1-v100", offload="activations", overrides=TINY, dtype="fp16")
    with pytest.raises(SpecError, match="offload"):
        simulate("llama3-8b", "dgx-h100", offload="disk", overrides=TINY)
