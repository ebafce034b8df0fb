"""What `dlsim validate gpu` measures, at which size, and how its time budget is spent (pure planning).

Networks (`step_cases`), each trained for real (`dlsim.validate.gpu_steps`) from its zoo description
through `dlsim.validate.torch_model`, so the network timed and the network predicted are one:

* a Llama-style decoder of 1.1B parameters (the zoo's ``tinyllama-1.1b``: Llama 2 architecture, 22
  layers, hidden 2048, GQA 32/4 heads) in bf16 (parameters, activations and Adam state) with
  ``F.scaled_dot_product_attention``, at sequence 2048 and 4096;
* a GPT-2-class model (the zoo's ``gpt2``, 124M, sequence 1024) with SDPA, in automatic mixed precision
  (fp32 parameters, bf16 autocast), as nanoGPT trains it;
* ResNet-50 (the zoo's ``resnet50``) with channels-last convolutions and input, in bf16 autocast.

On a GPU they run at full size (`CUDA_CASES`; the batch shrinks until dlsim's predicted peak memory fits
in `MEMORY_SHARE` of the device); on a CPU the same architectures run at small sizes (`CPU_CASES`), so
that every part of the pipeline but the CUDA calls runs end to end in minutes.

The budget (`Budget`) is spent in phases of decreasing value (`PHASES`): device facts; the GEMM curve
and the networks' own GEMMs; eager training steps; the networks' other kernels (memory-bound, convolution,
optimizer step: what the calibrated profile needs to predict the steps); kernel families (element-wise,
normalisation, softmax, dropout, copies, attention backends, fused Adam); compiled training steps last,
because compiling takes minutes and cannot be sized in advance. Each phase may run until its cumulative
share of the budget is spent (time an earlier phase left over carries on); a reserve at the end writes
the report. `Scale` sets sizes and repeats from the device and the budget.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dlsim.spec.model import Model, with_input

PHASES = (("device", 0.02), ("gemm", 0.08), ("steps", 0.30), ("kernels", 0.14), ("families", 0.08),
          ("compiled", 0.38))
"""(phase, share of the budget), in the order they run."""
MEMORY_SHARE = 0.6
"""A network's batch is halved until dlsim's predicted peak memory is at most this share of the device's."""
REFERENCE_BUDGET_S = 480.0
"""The budget the full sizes and repeats are chosen for (8 minutes)."""


@dataclass(frozen=True)
class StepCase:
    """One network configuration trained for real: zoo model, parameter overrides, batch, the dtype the
    parameters are kept in, autocast dtype (None: none), channels-last convolutions, the attention
    implementation, and `dtype` and `fused`, what dlsim's prediction assumes (training dtype, fused kernels)."""

    key: str
    label: str
    model: str
    overrides: tuple[tuple[str, Any], ...] = ()
    batch: int = 1
    dtype: str = "bf16"
    params_dtype: str = "bf16"
    amp: str | None = None
    channels_last: bool = False
    attention: str = "sdpa"
    fused: tuple[str, ...] = ()

    @property
    def override_map(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.overrides}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "StepCase":
        """The case `to_dict` wrote (in a run's records)."""
        overrides = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in (d.get("overrides") or {}).items())
        return StepCase(d["key"], d["label"], d["model"], overrides, int(d["batch"]), d["dtype"], d["params_dtype"],
                        d.get("amp"), bool(d.get("channels_last")), d.get("attention", "sdpa"),
                        tuple(d.get("fused_kernels") or ()))

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "model": self.model, "overrides": self.override_map,
                "batch": self.batch, "dtype": self.dtype, "params_dtype": self.params_dtype, "amp": self.amp,
                "channels_last": self.channels_last, "attention": self.attention, "fused_kernels": list(self.fused)}


FLASH = ("flash_attention",)
LLAMA = "tinyllama-1.1b"
CUDA_CASES = (
    StepCase("llama-1.1b-s2048", "Llama-style 1.1B (TinyLlama), seq 2048, bf16, SDPA", LLAMA, (("seq_len", 2048),),
             8, fused=FLASH),
    StepCase("llama-1.1b-s4096", "Llama-style 1.1B (TinyLlama), seq 4096, bf16, SDPA", LLAMA, (("seq_len", 4096),),
             4, fused=FLASH),
    StepCase("gpt2-124m-s1024", "GPT-2 124M, seq 1024, AMP bf16, SDPA", "gpt2", (), 16, params_dtype="fp32",
             amp="bf16", fused=FLASH),
    StepCase("resnet50-cl-amp", "ResNet-50, 224x224, channels-last, AMP bf16", "resnet50", (), 256,
             params_dtype="fp32", amp="bf16", channels_last=True, attention="math"),
)
_SMALL_LLAMA = (("layers", 2), ("hidden", 128), ("heads", 4), ("kv_heads", 2), ("ffn_hidden", 256), ("vocab", 512))
CPU_CASES = (
    StepCase("llama-1.1b-s2048", "Llama-style (TinyLlama shape, 2 layers, hidden 128), seq 128, bf16, SDPA", LLAMA,
             _SMALL_LLAMA + (("seq_len", 128),), 2, fused=FLASH),
    StepCase("llama-1.1b-s4096", "Llama-style (TinyLlama shape, 2 layers, hidden 128), seq 256, bf16, SDPA", LLAMA,
             _SMALL_LLAMA + (("seq_len", 256),), 1, fused=FLASH),
    StepCase("gpt2-124m-s1024", "GPT-2 (2 layers, hidden 128), seq 128, AMP bf16, SDPA", "gpt2",
             (("layers", 2), ("hidden", 128), ("heads", 4), ("seq_len", 128), ("vocab", 512)), 2,
             params_dtype="fp32", amp="bf16", fused=FLASH),
    StepCase("resnet50-cl-amp", "ResNet-50 (one block per stage, 10 classes), 32x32, channels-last, AMP bf16",
             "resnet50", (("depths", (1, 1, 1, 1)), ("classes", 10)), 2, params_dtype="fp32", amp="bf16",
             channels_last=True, attention="math"),
)
"""The CPU cases keep the GPU cases' keys: the same four networks, small."""
CPU_IMAGE = (3, 32, 32)
"""Image size of the small ResNet-50 (the zoo's 224x224 would take seconds per step on a small CPU)."""
COMPILE_ORDER = ("gpt2-124m-s1024", "resnet50-cl-amp", "llama-1.1b-s2048", "llama-1.1b-s4096")
"""Compiled steps, cheapest compilation first (the budget stops the last ones first)."""


def step_cases(device: str) -> tuple[StepCase, ...]:
    return CUDA_CASES if device == "cuda" else CPU_CASES


def prepared_model(model: Model, case: StepCase, device: str) -> Model:
    """The zoo model as the case trains it: convolutions channels-last where the case says so, and on a CPU
    an image model at `CPU_IMAGE` (`dlsim.spec.model.with_input`: shapes inferred again)."""
    image = CPU_IMAGE if device != "cuda" and model.input_kind == "tensor" and len(model.input_shape) == 3 else None
    if not case.channels_last and image is None:
        return model
    attrs = {"conv2d": {"memory_format": "channels_last"}} if case.channels_last else {}
    return with_input(model, image or model.input_shape, layer_attrs=attrs)


@dataclass(frozen=True)
class Scale:
    """Sizes and repeats of one run: square GEMM sizes, elements per memory-bound kernel, SDPA shapes
    (batch, heads, sequence, head width), Adam parameter counts, kernel timer repeats, and per training
    step measurement the warm-up steps, at least `steps` timed steps lasting at least `min_step_s`."""

    gemm_sizes: tuple[int, ...]
    elements: tuple[int, ...]
    sdpa_shapes: tuple[tuple[int, int, int, int], ...]
    adam_params: tuple[int, ...]
    repeats: int
    warmup: int
    steps: int
    min_step_s: float
    memory_bytes_cap: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


def scale_for(device: str, budget_s: float) -> Scale:
    """Sizes from the device, repeats and step counts from the budget (`REFERENCE_BUDGET_S` gets the full
    counts; a budget under half of it 3 kernel repeats and shorter step measurements)."""
    ratio = budget_s / REFERENCE_BUDGET_S
    repeats = 5 if ratio >= 0.5 else 3
    min_step_s = min(3.0, max(0.3, 3.0 * ratio))
    if device == "cuda":
        return Scale(gemm_sizes=tuple(2**e for e in range(8, 15)) + (1536, 3072, 6144, 12288),
                     elements=tuple(4**e for e in range(8, 14)),
                     sdpa_shapes=((8, 32, 2048, 64), (4, 32, 4096, 64), (16, 12, 1024, 64)),
                     adam_params=tuple(2**e for e in range(20, 31, 2)), repeats=repeats, warmup=3, steps=10,
                     min_step_s=min_step_s)
    return Scale(gemm_sizes=(32, 64, 128, 256, 512), elements=tuple(4**e for e in range(5, 9)),
                 sdpa_shapes=((2, 4, 128, 32),), adam_params=(2**14, 2**16, 2**18),
                 repeats=repeats, warmup=2, steps=3, min_step_s=min(min_step_s, 0.2))


class Budget:
    """The run's clock: when each phase must end (its cumulative share of the budget less the reserve for
    the report), how long is left; `clock` is injectable for tests."""

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic,
                 phases: tuple[tuple[str, float], ...] = PHASES):
        if not total_s > 0 or math.isinf(total_s):
            raise ValueError(f"a budget must be a positive number of seconds, got {total_s!r}")
        self.total_s, self.clock, self.phases = float(total_s), clock, phases
        self.start = clock()
        self.reserve_s = min(max(0.03 * total_s, 2.0), 20.0)
        usable, done, self.ends = total_s - self.reserve_s, 0.0, {}
        for name, share in phases:
            done += share
            self.ends[name] = self.start + usable * min(done, 1.0)
        self.ends[phases[-1][0]] = self.start + usable

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        """Seconds until the budget (less the report's reserve) is spent."""
        return max(0.0, self.start + self.total_s - self.reserve_s - self.clock())

    def phase_left(self, phase: str) -> float:
        """Seconds until `phase` must end."""
        return max(0.0, min(self.ends[phase], self.start + self.total_s - self.reserve_s) - self.clock())

    def stop(self, phase: str) -> Callable[[], bool]:
        """A function that says when `phase` has used its time."""
        return lambda: self.phase_left(phase) <= 0.0
