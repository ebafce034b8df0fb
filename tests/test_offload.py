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
    d2h, h2d = _events(sim, "D2H activations chunk"), _events(sim, "H2D activations chunk")
    assert d2h and len(d2h) == len(h2d)
    assert {round(e["dur"], 6) for e in d2h} <= expected
    assert {round(e["dur"], 6) for e in h2d} <= expected
    # where a backward follows its forward directly (the last stage's last micro-batch) the chunk is
    # offloaded one unit at a time inside the passes instead
    assert len(d2h) < 2 * KW["num_microbatches"]
    assert _events(sim, "D2H activations unit")


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


DP = dict(dp=2, microbatch_size=1, num_microbatches=2, dtype="bf16", measured=False, overrides=TINY, stack="eager")


def test_data_parallel_offloads_unit_by_unit():
    """Without a pipeline every forward is followed by its backward: each transformer layer's
    activations go to the host while the next layers compute (one copy out and one back per unit
    but the last, per micro-batch), each copy lasting L + n / (B e) for its unit's bytes; the peak
    activations fall to what the double-buffered window holds."""
    from dlsim.plan.offload import offload_units, unit_offload_plan
    from dlsim.plan.blocks import recompute_layers
    sim = run_simulation("llama3-8b", "dgx-h100", offload="activations", trace=True, **DP)
    plain = simulate("llama3-8b", "dgx-h100", **DP)
    cluster, model = as_cluster("dgx-h100"), as_model("llama3-8b", TINY)
    entries = build_layer_table(model, cluster.device, "bf16", batch=1, tp=1)
    units, kept = unit_offload_plan(entries, recompute_layers(model), False)
    assert units == offload_units(entries, recompute_layers(model))
    assert len(kept) == TINY["layers"] + 1  # the embedding, then one unit per transformer layer (the head joins the last)
    assert sum(kept.values()) == pytest.approx(sum(e.saved_bytes for e in entries))
    link = cluster.host
    expected = {round((link.latency + kept[u] / link.effective_bandwidth) * 1e6, 6) for u in list(kept)[:-1]}
    d2h, h2d = _events(sim, "D2H activations unit"), _events(sim, "H2D activations unit")
    assert len(d2h) == len(h2d) == (len(kept) - 1) * DP["num_microbatches"]
    assert {round(e["dur"], 6) for e in d2h + h2d} == expected
    assert not _events(sim, "D2H activations chunk")
    off, on = sim.result.devices[0].memory["activations"], plain.devices[0].memory["activations"]
    assert on == pytest.approx(sum(kept.values()))
    assert off < on and off <= 4 * max(kept.values())
    assert sim.result.iteration_time_s > plain.iteration_time_s  # the copies are not free


def test_fsdp_offloads_its_parameter_units():
    """Under ZeRO-3 the offload units are FSDP's parameter units (a wrapped module's activations):
    with 1 MiB units (a dozen here) all but the last leave the device. The norms and the gated unit
    are fused here: eager, their activations are kept by the consumer (the gated unit keeps the gate
    and up projections' output), and a unit holding only the gate and up projections keeps nothing."""
    kw = dict(DP, zero=3, bucket_size=2 ** 20, fused_kernels=("rmsnorm", "glu"))
    sim = run_simulation("llama3-8b", "dgx-h100", offload="activations", trace=True, **kw)
    plain = simulate("llama3-8b", "dgx-h100", **kw)
    assert len(_events(sim, "D2H activations unit")) >= 10 * DP["num_microbatches"]
    assert sim.result.devices[0].memory["activations"] < 0.5 * plain.devices[0].memory["activations"]
