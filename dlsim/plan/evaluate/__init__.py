"""The strategy search's analytic evaluator: iteration time and memory per device of a strategy
without running the event simulation, from the scenario the simulator times (`dlsim.plan.scenario`).

Nothing here re-states a cost formula: the scenario prices the layers (`build_layer_table`), cuts the
stages (`partition`) and holds the communication pricer; passes are the step lists of
`dlsim.plan.templates` (tensor-parallel collectives priced by the same `CommPricer`, asynchronous
ones through `dlsim.cost.overlap.overlap_cost`), activation memory comes from `dlsim.plan.recompute`,
model states from `dlsim.plan.zero`, buckets from `dlsim.plan.dataparallel`, their collectives from
`dlsim.plan.compression.plan_sync`, the schedule's in-flight micro-batches from
`dlsim.plan.pipeline.peak_inflight`, the optimizer step from `dlsim.plan.steptime`. What the
evaluator adds is how these compose in time, by concern:

* `timing` — per micro-batch, stage r runs forward F_r and backward B_r (recomputation included),
  the sum of its chunks' step lists; then the data-parallel reductions, the tied-embedding
  all-reduce between the first and last stage, the optimizer step and ZeRO-1/2's all-gather of the
  updated parameters. The iteration ends when the slowest stage does.
* `pipeline` — the stages' op orders walked with those per-micro-batch times, or for long
  pipelines the closed forms (Narayanan et al. SC'21 §2.2, reference/algorithms.md §4.1,
  generalised to unequal stages and point-to-point transfers c_k): 1F1B ends its last backward on
  stage 0 at Σ_r (F_r + B_r) + 2·Σ_k c_k + (m − 1)·max_r (F_r + B_r); GPipe at Σ F + (m − 1)·max F +
  Σ B + (m − 1)·max B + 2·Σ c; interleaved (v chunks) at m·max + (Σ − max)/v + 2·Σ c / v (each
  uniform case is `closed_form_iteration`). Stage r's last backward ends earlier by the backward
  path from r to stage 0.
* `stream` — data-parallel gradient buckets are reduced on the communication stream as the last
  backward pass makes them ready (ZeRO-2/3: every backward pass); the pass is walked step by step
  with the bucket queue beside it, compute slowed by the device's overlap slowdown σ while a
  collective is in flight, a tensor-parallel collective on the same link tier waiting for the
  bucket that holds the ports; what the queue has left when the pass ends is exposed. ZeRO-2/3
  walk every pass of every stage this way in the schedule's op order, the stream carrying over
  from pass to pass (`Timing._programs`). ZeRO-3's parameter gathers are queued as the simulator
  issues them (`walk_steps`: a unit's once the previous unit's first step has ended, the first
  unit's once the previous pass's first step has). A pass's end and stream are a piecewise-affine
  function of when the stream is free and the previous pass ended (`affine`): the schedule walk
  (ops in the dependency order of `wavefront`) evaluates its pieces, one walk per piece, shared by
  the chunks whose priced passes are alike, in this strategy and every other the evaluator times
  (a pass is named by its content); a whole schedule walk is kept by what it reads, so candidates
  that differ in nothing it reads share it.

What strategies share is priced once per evaluator, kept by exactly what it depends on: priced step
lists by the stage's group tiers (a deep pipeline's stages share them), a chunk's plain forward pass
by its layers, bucket bytes and ZeRO-3 unit prices by the chunk's content, transfers, port checks and
optimizer steps by layout, the lower bounds' per-stage prefix sums by table and layout.
* `memory` — peak memory per stage, as the simulator's memory tracker counts it: what a stage holds
  besides activations kept by the table, its chunks and the sharding, the stages' activations by the
  table, its chunks, the recomputation and the schedule, the chunks' activation bytes from a table's
  prefix sums (`dlsim.plan.recompute.ChunkActivations`); the search asks `peak_memory`, which builds
  no per-stage records.
* `bounds` — lower bounds of the iteration time for the search's pruning.
* `records` — `Evaluation`, `StageMemory`, `supports`.

Where the evaluator matches the simulation: tests/test_optimize.py holds it within 3% of the
simulation on every candidate of small GPT spaces (dp × tp × pp with tensor parallelism inside a
node, 1F1B / interleaved, recomputation none / selective / full, sequence parallelism, ZeRO 0-3;
2.3% at most there). Flagged `Evaluation.approximate` (only the simulation should decide): ZeRO-2/3
pipelines too long to walk pass by pass (p·m·v > WALK_OPS: the per-chunk leftover of the reduction
queue is hidden under the next forward pass instead), other pipelines too long to walk
(p·m·v > WALK_PLAIN_OPS: the closed forms), interleaved with m = pp, pipeline transfers
on the tensor-parallel link tier (their port contention is not modelled; within 2.3% on the test
spaces), scatter-gather pipeline transfers (1/tp of a boundary sent, then all-gathered over the
receiver's tensor-parallel group, Megatron-LM's scatter_gather_tensors_in_pipeline: the gathers'
contention with the tensor-parallel collectives on the same ports is not modelled; 0.5% on GPT-3 175B
on 1,024 A100s, up to 9% on small models whose collectives are latency-bound), strategies across the
nodes of a network with shared links (contention: the simulation prices each group where it sits).
Long pipelines are walked through their periodic regime (`periodic`), deep ones level by level
(`wavefront`). Not modelled: gradient compression's kernels (`supports` says no), layer groups, run-time
variability, parameter-server training; `supports` refuses them.
"""

from dlsim.plan.evaluate.core import Evaluator, evaluate_all
from dlsim.plan.evaluate.pipeline import pipeline_walk
from dlsim.plan.evaluate.records import (VALIDATED_FIELDS, WALK_MEMORY_OPS, WALK_OPS, WALK_PLAIN_OPS, Evaluation,
                                         StageMemory, supports)

__all__ = ["Evaluation", "Evaluator", "StageMemory", "VALIDATED_FIELDS", "WALK_MEMORY_OPS", "WALK_OPS",
           "WALK_PLAIN_OPS", "evaluate_all", "pipeline_walk", "supports"]
