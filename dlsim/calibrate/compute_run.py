"""Running a compute calibration: measure each planned kernel once, append its row, resume after a stop.

Tables (in the output directory; columns in `dlsim.cost.lookup`): ``gemm.csv``, ``conv.csv``,
``memory.csv``, and ``device.csv`` with the device-level numbers the roofline fallback needs:

* ``launch_overhead_s``: one tiny operator with autograd recording (``x * 2`` on one element that
  requires grad): the fixed cost PyTorch pays per operator in a training step, dispatch included.
* ``stream_bandwidth_bytes_per_s``: ``torch.add(a, b, out=c)`` over 3 × 2^25 fp32 elements (STREAM's
  "add"; 3 × 128 MiB, far beyond any cache), bytes counted as 2 reads + 1 write.
* ``elementwise_flops_per_s``: softmax over 2^22 fp32 elements at dlsim's 5 FLOP per element (the
  attention remainder the roofline prices with vector FLOP/s).
* on a CPU, the host probes' rows (the fresh-page cost, the heap's re-fault share, the optimizer step's
  in-loop extras, the host time per ATen operator), added before the kernels by `dlsim.api.host_probes`,
  which measures each once per host. The kernels themselves are timed with freed memory retained
  (`compute_timer.warm_allocator`), so the tables hold no page faults and the estimate adds them
  where a step allocates such tensors.

A row is written (and fsynced) as soon as it is measured (`compute_store.TableFile`), and a
restart skips every key already in the tables: an interrupted run loses no measured row and
repeats none. A kernel that fails (an unsupported shape or out of memory) is reported and left
out, so the next run tries it again. A caller's `stop()` (a time budget) is asked before each kernel: when
it says so the run ends there, with every row measured so far in the tables.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from dlsim.calibrate.compute_ops import conv_algorithm, conv_fn, gemm_fn, memory_op, optimizer_step_fn, torch_dtype
from dlsim.calibrate.compute_plan import ConvTask, GemmTask, OptimizerTask, Task
from dlsim.calibrate.compute_store import TableFile
from dlsim.calibrate.compute_timer import KernelTimer, Timing, warm_allocator
from dlsim.cost.lookup import CHANNELS_LAST, CONV_COLUMNS, CONV_SHAPE_FIELDS, GEMM_COLUMNS, MEMORY_COLUMNS, ConvRow, GemmRow, \
    MemoryRow, record
from dlsim.errors import one_line
from dlsim.units import format_time

DEVICE_COLUMNS = ("quantity", "value", "unit", "how")
KEYS = {"gemm": ("dtype", "m", "n", "k", "count"), "conv": ("dtype", "pass", "algorithm", "n", *CONV_SHAPE_FIELDS),
        "memory": ("dtype", "op", "pass", "signature"), "device": ("quantity",)}
FILES = {"gemm": ("gemm.csv", GEMM_COLUMNS), "conv": ("conv.csv", CONV_COLUMNS), "memory": ("memory.csv", MEMORY_COLUMNS),
         "device": ("device.csv", DEVICE_COLUMNS)}
DEVICE_QUANTITIES = ("launch_overhead_s", "stream_bandwidth_bytes_per_s", "elementwise_flops_per_s")
"""The device-level rows every profile has (`device_quantities`)."""
STREAM_ELEMENTS = 2**25
SOFTMAX_ELEMENTS = 2**22


@dataclass(frozen=True)
class Backend:
    """Where kernels run: "cpu" or "cuda", the torch device, and how to read peak device memory
    (for convolution workspace; None on a CPU, where oneDNN's scratchpad is not observable)."""

    name: str
    device: Any
    peak_memory: tuple[Callable[[], None], Callable[[], int], Callable[[], int]] | None = None

    @staticmethod
    def create(name: str) -> "Backend":
        import torch
        if name == "cuda":
            c = torch.cuda
            return Backend("cuda", torch.device("cuda"), (c.reset_peak_memory_stats, c.memory_allocated,
                                                          c.max_memory_allocated))
        return Backend("cpu", torch.device("cpu"))

    def workspace(self, fn: Callable[[], Any], out_bytes: int, sync: Callable[[], None]) -> float:
        """Bytes a call allocates beyond its output at its peak (0 where it cannot be observed)."""
        if self.peak_memory is None:
            return 0.0
        reset, allocated, peak = self.peak_memory
        sync()
        reset()
        base = allocated()
        result = fn()
        sync()
        used = peak() - base
        del result
        return float(max(used - out_bytes, 0))


@dataclass
class RunSummary:
    measured: int = 0
    skipped: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    dropped_partial: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # seconds of each kernel measured in this run
    stopped: int = 0  # kernels left unmeasured because the caller's stop() said so


def table_file(name: str, suffix: str = "") -> str:
    """``gemm.csv`` → ``gemm-warm.csv`` for suffix "-warm" (the warm tables beside the cold ones)."""
    stem, dot, ext = name.rpartition(".")
    return f"{stem}{suffix}{dot}{ext}"


def row_key(kind: str, rec: dict[str, str]) -> tuple:
    """The key of a row of table `kind` ("gemm", "conv", "memory", "device"): what makes it one measurement."""
    return tuple((rec.get(c) or "").strip() for c in KEYS[kind])


def read_keys(path: Path, kind: str) -> dict[tuple, dict[str, str]]:
    """A table's rows by their key, read only (empty when the file does not exist)."""
    import csv
    if not path.exists():
        return {}
    with open(path, newline="") as handle:
        return {row_key(kind, r): r for r in csv.DictReader(handle)}


def open_tables(out_dir: Path, suffix: str = "") -> dict[str, TableFile]:
    """The four tables of a profile directory (``-warm`` suffix: the warm ones), created with their
    headers when new."""
    return {kind: TableFile(out_dir / table_file(name, suffix), cols, lambda rec, kind=kind: row_key(kind, rec))
            for kind, (name, cols) in FILES.items() if not (suffix and kind == "device")}


def task_key(task: Task) -> tuple:
    """The key of the row `task` measures (`row_key`)."""
    return row_key(kind_of(task), _row(task, None))


def missing(tasks: Iterable[Task], out_dir: Path, suffix: str = "") -> list[Task]:
    """The tasks whose rows `out_dir`'s tables lack (read only: nothing is created)."""
    present = {kind: read_keys(Path(out_dir) / table_file(name, suffix), kind) for kind, (name, _) in FILES.items()}
    return [t for t in tasks if task_key(t) not in present[kind_of(t)]]


def _row(task: Task, timing: Timing | None, workspace: float = 0.0) -> dict[str, str]:
    t, iqr, reps = (timing.seconds, timing.iqr_s, timing.repeats) if timing else (1.0, 0.0, 1)
    if isinstance(task, GemmTask):
        g = task.gemm
        return record(GemmRow(task.dtype, g.m, g.n, g.k, g.count, t, iqr, reps, task.set))
    if isinstance(task, ConvTask):
        return record(ConvRow(task.dtype, task.pass_name, task.algorithm, task.n, task.shape, t, iqr, workspace, reps,
                              task.set))
    if isinstance(task, OptimizerTask):
        nbytes, flops = task.traffic
        return record(MemoryRow(task.dtype, task.optimizer, "step", task.signature, nbytes, flops, t, iqr, reps,
                                task.set))
    return record(MemoryRow(task.dtype, task.op, task.pass_name, task.signature, task.bytes, task.flops, t, iqr,
                            reps, task.set))


def kind_of(task: Task) -> str:
    return "gemm" if isinstance(task, GemmTask) else "conv" if isinstance(task, ConvTask) else "memory"


def label(task: Task) -> str:
    if isinstance(task, GemmTask):
        g = task.gemm
        return f"gemm {task.dtype} {g.m}x{g.n}x{g.k}" + (f" x{g.count}" if g.count > 1 else "")
    if isinstance(task, ConvTask):
        return f"conv {task.pass_name} {task.algorithm} {task.dtype} n{task.n} {task.shape.signature}"
    if isinstance(task, OptimizerTask):
        return f"{task.optimizer} step {sum(task.sizes)} parameters in {len(task.sizes)} tensors"
    return f"{task.layer.type} {task.pass_name} {task.dtype} {task.signature.split('|', 2)[2]} n{task.batch}"


def measure(task: Task, backend: Backend, timer: KernelTimer) -> dict[str, str]:
    """Time one task and return its table row."""
    if isinstance(task, GemmTask):
        return _row(task, timer.time(gemm_fn(task.gemm, task.dtype, backend.device)))
    if isinstance(task, ConvTask):
        with conv_algorithm(task.algorithm):
            fn, out_bytes = conv_fn(task.shape, task.n, task.pass_name, task.dtype, backend.device,
                                    channels_last=task.algorithm.endswith(CHANNELS_LAST))
            timing = timer.time(fn)
            ws = backend.workspace(fn, out_bytes, timer.sync)
        return _row(task, timing, ws)
    if isinstance(task, OptimizerTask):
        return _row(task, timer.time(optimizer_step_fn(task.optimizer, task.sizes, backend.device)))
    return _row(task, timer.time(memory_op(task.layer, task.batch, task.pass_name, task.dtype, backend.device)))


def device_quantities(backend: Backend, timer: KernelTimer) -> list[tuple[str, float, str, str, Callable[[], Any]]]:
    """(quantity, value-from-time, unit, how, function) for the device-level measurements."""
    import torch
    dev = backend.device
    tiny = torch.ones(1, device=dev, requires_grad=True)
    a, b = torch.rand(STREAM_ELEMENTS, device=dev), torch.rand(STREAM_ELEMENTS, device=dev)
    c = torch.empty_like(a)
    s = torch.rand(SOFTMAX_ELEMENTS // 1024, 1024, device=dev, dtype=torch_dtype("fp32"))
    return [
        ("launch_overhead_s", 1.0, "s", "x * 2 on 1 element requiring grad (dispatch + autograd record)",
         lambda: tiny * 2.0),
        ("stream_bandwidth_bytes_per_s", 3.0 * 4 * STREAM_ELEMENTS, "bytes/s",
         f"torch.add(a, b, out=c), 3 x {STREAM_ELEMENTS} fp32 elements", lambda: torch.add(a, b, out=c)),
        ("elementwise_flops_per_s", 5.0 * SOFTMAX_ELEMENTS, "FLOP/s",
         f"softmax over {SOFTMAX_ELEMENTS} fp32 elements at 5 FLOP/element", lambda: torch.softmax(s, -1)),
    ]


def run_calibration(tasks: Iterable[Task], out_dir: Path | str, backend: Backend, timer: KernelTimer, *,
                    device_params: bool = True, suffix: str = "",
                    progress: Callable[[int, int, str, str], None] | None = None,
                    stop: Callable[[], bool] | None = None) -> RunSummary:
    """Measure every task whose row is missing from the tables in `out_dir` (see the module docstring);
    `suffix` "-warm" writes the warm tables (timer without a cache flush); `stop()`, asked before each
    kernel, ends the run early (the summary counts the kernels left in `stopped`). The CPU host probes are
    the caller's (`dlsim.api.host_probes`)."""
    out_dir = Path(out_dir)
    warm_allocator()
    tables = open_tables(out_dir, suffix)
    summary = RunSummary(dropped_partial=[str(t.path) for t in tables.values() if t.dropped_partial])
    tasks = list(tasks)
    start = time.perf_counter()
    todo = [t for t in tasks if not tables[kind_of(t)].has(_row(t, None))]
    summary.skipped = len(tasks) - len(todo)
    total = len(tasks)
    if device_params and "device" in tables and not all(tables["device"].has({"quantity": q}) for q in DEVICE_QUANTITIES):
        dev_table = tables["device"]
        for quantity, amount, unit, how, fn in device_quantities(backend, timer):
            if dev_table.has({"quantity": quantity}):
                continue
            timing = timer.time(fn)
            value = timing.seconds if unit == "s" else amount / timing.seconds
            dev_table.append({"quantity": quantity, "value": f"{value:.9g}", "unit": unit, "how": how})
    first = summary.skipped + 1
    for j, task in enumerate(todo):
        i = first + j
        if stop is not None and stop():
            summary.stopped = len(todo) - j
            break
        table = tables[kind_of(task)]
        if table.has(_row(task, None)):  # the same key planned twice (a grid GEMM a model also needs)
            summary.skipped += 1
            continue
        try:
            rec = measure(task, backend, timer)
        except Exception as exc:  # a kernel the library cannot run here: report it, keep going
            summary.failed.append(f"{label(task)}: {one_line(exc)}")
            if progress:
                progress(i, total, label(task), f"failed ({type(exc).__name__})")
            continue
        table.append(rec)
        summary.measured += 1
        summary.times.append(float(rec["time_s"]))
        if progress:
            progress(i, total, label(task), format_time(float(rec["time_s"])))
    summary.seconds = time.perf_counter() - start
    return summary
