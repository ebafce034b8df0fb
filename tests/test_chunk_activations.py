"""The evaluator's per-table shortcuts hold to the functions they stand for, to the bit: the activation
bytes of any chunk (`dlsim.plan.recompute.ChunkActivations` against `full_recompute_memory`,
`selective_recompute_memory` and the plain sum) and the bytes crossing each cut (`boundary_bytes`
against the walk over every layer's output and its last consumer)."""

from __future__ import annotations

from bisect import bisect_right

import pytest

from dlsim.api.models import as_cluster, as_model
from dlsim.plan.blocks import recompute_layers
from dlsim.plan.layertable import _last_consumers, boundary_bytes, build_layer_table
from dlsim.plan.recompute import ChunkActivations, full_recompute_memory, selective_recompute_memory

CASES = [("gpt2", {"layers": 3}, 1, False), ("gpt2", {"layers": 3}, 2, True), ("llama3-8b", {"layers": 2}, 2, False),
         ("bert-base", {"layers": 2}, 1, False), ("resnet18", {}, 1, False)]


def _table(name, overrides, tp, sp):
    model = as_model(name, overrides or None)
    entries = build_layer_table(model, as_cluster("dgx-a100").device, "bf16", batch=2, tp=tp, sequence_parallel=sp)
    return model, entries


def _walked_boundaries(model, entries, ranges):
    """Each layer's output added to every boundary between its chunk and its last consumer's."""
    position, last_use = _last_consumers(model)
    starts = [a for a, _ in ranges]
    out = [0.0] * (len(ranges) - 1)
    for e in entries:
        i = position[e.name]
        c = bisect_right(starts, i) - 1
        last = bisect_right(starts, last_use[i]) - 1 if last_use[i] >= 0 else -1
        for boundary in range(c, last):
            out[boundary] += e.out_bytes
    return out


@pytest.mark.parametrize("name,overrides,tp,sp", CASES)
def test_chunk_activations_equal_the_functions_for_every_chunk(name, overrides, tp, sp):
    model, entries = _table(name, overrides, tp, sp)
    instance = recompute_layers(model)
    fast = ChunkActivations(model, entries, instance)
    assert fast.exact
    n = len(entries)
    step = max(1, n // 40)
    checked = 0
    for a in range(0, n, step):
        for b in range(a + 1, n + 1, step):
            es = entries[a:b]
            incoming = float(sum(e.out_bytes for e in entries[max(a - 2, 0):a]))
            assert fast.plain(a, b) == (sum(e.saved_bytes for e in es), 0.0, 0.0)
            if any(e.core.seconds > 0 for e in es):
                assert fast.selective(a, b) == selective_recompute_memory(es)
            if fast.contiguous:
                assert fast.full(a, b, incoming) == full_recompute_memory(model, es, 1, incoming, instance)
            checked += 1
    assert checked > 100


@pytest.mark.parametrize("name,overrides,tp,sp", CASES)
def test_boundary_bytes_equal_the_walk_over_every_output(name, overrides, tp, sp):
    model, entries = _table(name, overrides, tp, sp)
    n = len(entries)
    for chunks in (2, 3, 5, 8):
        cuts = sorted({round(k * n / chunks) for k in range(1, chunks)} - {0, n})
        edges = [0] + cuts + [n]
        ranges = list(zip(edges, edges[1:]))
        assert boundary_bytes(model, entries, ranges) == _walked_boundaries(model, entries, ranges)
    with pytest.raises(KeyError):
        boundary_bytes(model, entries, [(0, n // 2), (n // 2 + 1, n)])
