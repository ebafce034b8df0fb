"""The uniform pipeline split (strategy and stack key `pipeline_split`, `dlsim.plan.partition.uniform_counts`):
Megatron-LM's and Megatron-Core's layers per chunk, used by both clocks and by the search."""

from __future__ import annotations

from collections import Counter

import pytest

from dlsim.api.analytic import estimate_strategy
from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import simulate
from dlsim.api.stacks import apply_stack, choose_stack
from dlsim.cli import run
from dlsim.errors import InfeasibleError
from dlsim.plan.blocks import block_instance
from dlsim.plan.partition import uniform_counts
from dlsim.plan.search import SEARCHED, SearchSpace, candidates

SMALL = {"layers": 8, "hidden": 256, "heads": 4, "seq_len": 128, "positions": 128}


@pytest.mark.parametrize("chunks", [1, 2, 4, 8, 24])
def test_every_chunk_gets_the_same_blocks_embeddings_first_and_the_head_last(chunks):
    model = as_model("gpt3-175b")
    counts = uniform_counts(model, chunks)
    assert len(counts) == chunks and sum(counts) == len(model.layers)
    edges = [0]
    for c in counts:
        edges.append(edges[-1] + c)
    names = [layer.name for layer in model.layers]
    for k in range(chunks):
        blocks = {block_instance(n) for n in names[edges[k]:edges[k + 1]]} - {None}
        assert len(blocks) == 96 // chunks  # each block whole, the same number in every chunk
    first_block = next(i for i, n in enumerate(names) if block_instance(n))
    last_block = max(i for i, n in enumerate(names) if block_instance(n))
    assert edges[1] > first_block and edges[-2] <= last_block  # the embeddings in chunk 0, the head in the last


def test_a_block_count_the_chunks_do_not_divide_is_refused_in_one_line(capsys):
    with pytest.raises(InfeasibleError, match="96 blocks of gpt3-175b divisible by pp x virtual_stages = 7"):
        uniform_counts(as_model("gpt3-175b"), 7)
    assert run(["simulate", "gpt2", "-c", "dgx-a100", "--pp", "5", "--global-batch", "10",
                "--stage-partition", "uniform"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "12 blocks of gpt2" in err


def test_the_megatron_stacks_split_uniformly_and_a_flag_overrides_the_stack(capsys):
    args = ["simulate", "gpt2", "-c", "dgx-a100", "--pp", "4", "--global-batch", "8", "--stack", "megatron-lm-2022"]
    assert run(args) == 0
    uniform = capsys.readouterr().out
    assert run(args + ["--stage-partition", "balanced"]) == 0
    balanced = capsys.readouterr().out
    counts = uniform_counts(as_model("gpt2"), 4)
    assert f"the same blocks per chunk): {counts}" in uniform
    assert "balanced by cost" in balanced and str(counts) not in balanced  # gpt2's head tips the balance


def test_the_evaluator_prices_the_uniform_split_as_the_simulation_does():
    model, cluster = as_model("gpt2", SMALL), as_cluster("dgx-a100")
    fields = {"dp": 1, "tp": 1, "pp": 4, "microbatch_size": 2, "num_microbatches": 8, "schedule": "1f1b",
              "stack": "eager"}  # a stack the evaluator times exactly
    times = {}
    for split in ("uniform", "balanced"):
        est = estimate_strategy(model, cluster, pipeline_split=split, **fields)
        sim = simulate(model, cluster, pipeline_split=split, **fields)
        assert not est["approximate"] and est["iteration_time_s"] == pytest.approx(sim.iteration_time_s, rel=1e-9), split
        times[split] = sim.iteration_time_s
    assert times["uniform"] != times["balanced"]  # the head on the last chunk: the two splits differ here


def test_the_search_keeps_only_layouts_the_uniform_split_can_build():
    model, cluster = as_model("gpt2"), as_cluster("dgx-a100")
    stack, _ = choose_stack("megatron-lm-2022", model)
    fixed = apply_stack(stack, {}, set(SEARCHED), model, cluster)
    assert fixed["pipeline_split"] == "uniform"
    dropped: Counter = Counter()
    pool = list(candidates(model, SearchSpace(40, 120, cluster.devices_per_node, fixed=fixed), dropped))
    assert pool and all(12 % (s.pp * s.virtual_stages) == 0 for s in pool)
    assert dropped["the stack's uniform pipeline split: pp does not divide the blocks"] > 0  # pp 5 and 10


def _plain_bisection(costs, parts):
    """The balanced split's bisection without its least-limit shortcut (`balanced_starts` before it)."""
    from dlsim.plan.partition import _greedy
    lo, hi = max(costs), sum(costs)
    best = _greedy(costs, hi) or [0]
    for _ in range(100):
        if hi - lo <= 1e-12 * max(hi, 1e-300):
            break
        mid = (lo + hi) / 2
        found = _greedy(costs, mid, parts)
        if found is not None:
            hi, best = mid, found
        else:
            lo = mid
    return best


def test_the_balanced_split_shortcut_gives_the_plain_bisections_cuts():
    import random
    from dlsim.plan.partition import balanced_starts
    rng = random.Random(7)
    for trial in range(400):
        n = rng.randint(2, 60)
        kind = trial % 4
        if kind == 0:  # repeated blocks with an embedding and a head (a transformer's units)
            block = rng.uniform(1e-3, 2e-3)
            costs = [rng.uniform(0, 5e-3)] + [block] * (n - 2) + [rng.uniform(0, 5e-3)]
        elif kind == 1:
            costs = [rng.uniform(0, 1) for _ in range(n)]
        elif kind == 2:
            costs = [float(rng.randint(0, 4)) for _ in range(n)]
        else:  # a negative cost: the plain bisection's packings throughout
            costs = [rng.uniform(-0.2, 1) for _ in range(n)]
        parts = rng.randint(2, n)
        want = _plain_bisection(costs, parts)
        while len(want) < parts:
            bounds = want + [n]
            for j in range(len(want) - 1, -1, -1):
                if bounds[j + 1] - bounds[j] >= 2:
                    want.insert(j + 1, bounds[j + 1] - 1)
                    break
        assert balanced_starts(costs, parts) == want, (costs, parts)
