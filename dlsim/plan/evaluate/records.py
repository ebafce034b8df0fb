"""What the analytic evaluator returns (`Evaluation`, `StageMemory`), which strategies it
models (`supports`), and the sizes up to which it walks schedules step by step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlsim.spec.strategy import Strategy


@dataclass(frozen=True)
class StageMemory:
    """Peak bytes of one pipeline stage's devices, by kind."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    transient: float
    workspace: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.transient + self.workspace

    def to_dict(self) -> dict[str, float]:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "gathered_params": self.transient, "workspace": self.workspace}


@dataclass(frozen=True)
class Evaluation:
    """The analytic estimate of one strategy: iteration time and its split (means over stages, as
    the simulator's breakdown), peak memory per stage, and whether every stage fits `capacity`."""

    strategy: Strategy
    iteration_time_s: float
    compute_s: float
    recompute_s: float
    exposed_comm_s: float
    bubble_s: float
    memory: tuple[StageMemory, ...]
    capacity_bytes: float
    approximate: tuple[str, ...] = field(default_factory=tuple)
    """Features of `strategy` outside the space where the evaluator is held to the simulation
    (within 3%); for these the estimate is rougher (observed up to ~12% off) and only the
    simulation should decide."""

    @property
    def peak_memory_bytes(self) -> float:
        return max(m.total for m in self.memory)

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.capacity_bytes

    def breakdown(self) -> dict[str, float]:
        return {"compute": self.compute_s, "recompute": self.recompute_s, "exposed_comm": self.exposed_comm_s,
                "bubble": self.bubble_s}


def supports(s: Strategy) -> str:
    """'' when the evaluator models strategy `s`, else why not."""
    if s.sync != "allreduce":
        return f"sync {s.sync} (parameter-server training) is not modelled analytically"
    if s.layer_groups:
        return "layer groups are not modelled analytically"
    if s.variability.active:
        return "run-time variability is not modelled analytically"
    if s.compression.kind != "none":
        return "gradient compression is not modelled analytically"
    return ""


def replicas(s: Strategy) -> int:
    """The ranks whose gradients the evaluator reduces (and over which it shards ZeRO states): the dp
    replicas times the spatial ranks of each (`Strategy.dp_cp` but for context parallelism's ranks,
    whose reduction it does not time: flagged)."""
    return s.dp * s.spatial


VALIDATED_FIELDS = ("dp", "tp", "pp", "microbatch_size", "num_microbatches", "schedule", "virtual_stages",
                    "recompute", "sequence_parallel", "zero")
"""The strategy fields of the space tests/test_optimize.py holds the evaluator to the simulation on
(every other field at its default there, but `PRICED_FIELDS`)."""
PRICED_FIELDS = ("stack", "dtype", "fused_kernels", "loss_kernel", "optimizer", "optimizer_impl", "grad_accumulation",
                 "grad_reduce_dtype", "zero_grad_reduce")
"""Fields that change only what the scenario prices (the layer table, the optimizer-step timer, the
gradient buckets' bytes and collective), which both clocks read from one `dlsim.plan.scenario.ScenarioBuilder`, not
how its pieces compose in time: off their defaults they keep an estimate exact where it was
(tests/test_optimize.py holds a space on a stack to the simulation too)."""
WALK_OPS = 16384
"""ZeRO-2/3 pipelines with at most this many (stage, chunk, micro-batch) passes have every pass walked
beside the communication stream (`Timing._programs`, memoised per relative stream state: tens of
milliseconds at this size); longer ones hide each chunk's reduction leftover under the next forward
pass (flagged approximate). Walking them instead of flagging them spares the simulations the
approximate tolerance would otherwise call for (benchmarks/bench_optimize.py)."""
WALK_PLAIN_OPS = 1 << 15
"""Pipelines whose passes are walked without the communication stream (no ZeRO-2/3 walk pass by
pass) are timed by walking the op orders up to this many passes (a few microseconds each)."""
WALK_MEMORY_OPS = 256
"""Interleaved schedules with at most this many chunk-micro-batches per stage have their activation
peak walked op by op; longer ones use `peak_inflight` with the largest chunk."""
