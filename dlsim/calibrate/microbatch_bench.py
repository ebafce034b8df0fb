"""Benchmark the NumPy convolution algorithms per layer, pass and micro-batch size: the μ-cuDNN table on a CPU.

Like μ-cuDNN's per-micro-batch ``cudnnFind…Ex`` (spcl/ucudnn src/optimizer.cpp): for each layer shape,
pass, micro-batch size b of the policy (largest first) and algorithm whose workspace fits the cap,
time the algorithm and record (time, workspace). Identical layers share one measurement (μ-cuDNN's
cache keys on the convolution parameters). Timing runs the way a plan executes: a repetition runs
k = min(B // b, ⌈min_samples / b⌉) consecutive micro-batches over different slices of a full-batch
tensor in one workspace arena (∇w accumulating after the first), the time per micro-batch is the
repetition's time / k, and the table keeps the median over repetitions after one warm-up. Before
each repetition the caches are flushed (a buffer twice the last-level cache is rewritten, outside
the timing): in a training iteration other layers run between two calls of a kernel, so a kernel
timed back to back on cache-hot operands would look faster than it runs in a plan.

Dominated configurations are skipped: if, at the same size, an algorithm already measured needs no
more workspace and the candidate's warm-up run is more than 1.5× slower, the candidate can never be
part of a Pareto-optimal split, so it is not timed further (its row is left out; ``--no-prune``
keeps everything).

Resumable: the caller passes the rows it already has (`done`) and a sink (`emit`) that stores each
new measurement at once (`dlsim.io.bench_table.append_rows`: one write, fsynced); a restart measures
only what is missing.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from dlsim.calibrate.conv_numpy import numpy_applicable, run_pass, workspace_size
from dlsim.calibrate.compute_timer import last_level_cache_bytes as _device_cache_bytes
from dlsim.calibrate.conv_workspace import Workspace
from dlsim.cost.conv_methods import METHODS, PASSES, ConvGeometry
from dlsim.plan.microbatch.configs import Kernel
from dlsim.units import format_bytes, format_time

PRUNE_FACTOR = 1.5
_FLUSH: list[np.ndarray] = []


def last_level_cache_bytes() -> int:
    """The CPU's largest cache (Linux sysfs; 32 MiB when it cannot be read)."""
    return _device_cache_bytes("cpu")


def flush_caches() -> None:
    """Rewrite a buffer of twice the last-level cache so that no kernel operand stays cached."""
    if not _FLUSH:
        _FLUSH.append(np.zeros(2 * last_level_cache_bytes(), dtype=np.uint8))
    np.add(_FLUSH[0], 1, out=_FLUSH[0])


@dataclass(frozen=True)
class Tensors:
    """Full-batch operands of one layer shape (fp32, random normal, fixed seed)."""

    x: np.ndarray
    w: np.ndarray
    dy: np.ndarray
    y: np.ndarray
    dx: np.ndarray
    dw: np.ndarray

    @staticmethod
    def make(g: ConvGeometry, batch: int, seed: int = 0) -> "Tensors":
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((batch, g.c_in, g.h, g.w), dtype=np.float32)
        w = rng.standard_normal((g.c_out, g.c_in, g.k_h, g.k_w), dtype=np.float32)
        dy = rng.standard_normal((batch, g.c_out, g.h_out, g.w_out), dtype=np.float32)
        return Tensors(x, w, dy, np.zeros_like(dy), np.zeros_like(x), np.zeros_like(w))

    def run(self, method: str, pass_name: str, g: ConvGeometry, start: int, ws: Workspace, accumulate: bool) -> None:
        """One micro-batch of g.n samples starting at `start`."""
        s = slice(start, start + g.n)
        out = {"forward": self.y[s], "backward_data": self.dx[s], "backward_weight": self.dw}[pass_name]
        run_pass(method, pass_name, g, ws, x=self.x[s], w=self.w, dy=self.dy[s], out=out, accumulate=accumulate)


def time_once(t: Tensors, method: str, pass_name: str, g: ConvGeometry, k: int, ws: Workspace, *,
              flush: Callable[[], object] = flush_caches, clock: Callable[[], float] = time.perf_counter) -> float:
    """One repetition: `flush` (outside the timing), then k consecutive micro-batches of g.n samples on
    consecutive slices (∇w accumulating after the first); seconds per micro-batch."""
    flush()
    start = clock()
    for i in range(k):
        t.run(method, pass_name, g, i * g.n, ws, accumulate=i > 0)
    return (clock() - start) / k


def microbatches_per_repetition(b: int, batch: int, min_samples: int) -> int:
    """k = min(B // b, ⌈min_samples / b⌉), at least 1."""
    return max(1, min(batch // b, -(-min_samples // b)))


def time_microbatches(t: Tensors, method: str, pass_name: str, g: ConvGeometry, batch: int, *,
                      repeats: int = 5, min_samples: int = 8, ws: Workspace | None = None,
                      flush: Callable[[], object] = flush_caches,
                      clock: Callable[[], float] = time.perf_counter) -> tuple[float, list[float]]:
    """Median seconds per micro-batch of g.n samples (and the per-repetition values), after one warm-up."""
    k = microbatches_per_repetition(g.n, batch, min_samples)
    ws = ws or Workspace(workspace_size(method, pass_name, g))
    samples = [time_once(t, method, pass_name, g, k, ws, flush=flush, clock=clock) for _ in range(repeats + 1)]
    return statistics.median(samples[1:]), samples[1:]


Row = tuple[str, str, Kernel]


def bench_layers(layers: Sequence[tuple[str, ConvGeometry]], batch: int, sizes: Sequence[int], *,
                 done: Mapping[tuple[str, str, int, str], Kernel] | None = None,
                 emit: Callable[[list[Row]], None] | None = None, passes: Sequence[str] = PASSES,
                 methods: Sequence[str] = METHODS, max_workspace: float | None = None, repeats: int = 5,
                 min_samples: int = 8, prune: bool = True, progress: Callable[[str], None] | None = None,
                 stop: Callable[[], bool] | None = None) -> list[Row]:
    """Measure every (layer shape, pass, size, algorithm) not in `done`; each measurement goes to `emit` at once.

    `layers` are (name, per-sample geometry); `done` maps (layer, pass, size, algorithm) to rows
    measured before (a resumed run); `max_workspace` skips configurations needing more (like
    ``cudnnFind…Ex`` with a workspace limit). `stop` is asked before each configuration; when it says
    True the run ends there (a time-boxed chunk of a long calibration; the next run resumes). Returns
    the new rows.
    """
    done = dict(done or {})
    new_rows: list[Row] = []
    groups: dict[str, list[str]] = {}
    shapes: dict[str, ConvGeometry] = {}
    for name, g in layers:
        groups.setdefault(g.signature, []).append(name)
        shapes[g.signature] = g.with_batch(1)
    say = progress or (lambda _msg: None)
    for index, (sig, names) in enumerate(groups.items(), 1):
        g1 = shapes[sig]
        tensors = None
        for pass_name in passes:
            for b in sorted(sizes, reverse=True):
                g = g1.with_batch(b)
                cands = [(workspace_size(m, pass_name, g), m) for m in methods if numpy_applicable(m, g) is None]
                measured = [(done[n, pass_name, b, m].workspace_bytes, done[n, pass_name, b, m].time_s)
                            for n in names[:1] for _, m in cands if (n, pass_name, b, m) in done]
                for ws_bytes, method in sorted(cands):
                    if max_workspace is not None and ws_bytes > max_workspace:
                        continue
                    if all((n, pass_name, b, method) in done for n in names):
                        continue
                    if stop is not None and stop():
                        say("stopped before the table is complete; run again to resume")
                        return new_rows
                    tensors = tensors or Tensors.make(g1, batch)
                    ws = Workspace(ws_bytes)
                    if prune and measured:
                        trial = float("inf")
                        for _ in range(2):          # the first run also faults the arena's pages in
                            start = time.perf_counter()
                            tensors.run(method, pass_name, g, 0, ws, accumulate=False)
                            trial = min(trial, time.perf_counter() - start)
                        if any(w <= ws_bytes and trial > PRUNE_FACTOR * t for w, t in measured):
                            say(f"[{index}/{len(groups)}] {names[0]} {pass_name} b={b} {method}: dominated, skipped")
                            continue
                    seconds, _ = time_microbatches(tensors, method, pass_name, g, batch, repeats=repeats,
                                                   min_samples=min_samples, ws=ws)
                    measured.append((ws_bytes, seconds))
                    kernel = Kernel(method, b, seconds, float(ws_bytes))
                    rows = [(n, pass_name, kernel) for n in names if (n, pass_name, b, method) not in done]
                    if emit:
                        emit(rows)
                    new_rows += rows
                    done.update({(n, pass_name, b, method): kernel for n in names})
                    say(f"[{index}/{len(groups)}] {names[0]} {pass_name} b={b} {method}: {format_time(seconds)}, "
                        f"{format_bytes(ws_bytes)}")
    return new_rows
