"""Kernels timed for their family's efficiency only, not for a profile's tables: attention by backend, copies.

A profile's memory table has one row per (operator, pass, shape), the kernel PyTorch's dispatch picks;
`dlsim validate gpu` also wants to know what each scaled dot-product attention backend attains (flash,
memory-efficient, cuDNN: `dlsim.calibrate.cuda_calls.sdpa_backend`) and what a plain device-to-device
copy attains, to set the built-in profile's efficiencies against them. Each is timed with the
calibration's `KernelTimer` on the calibration's callables (`memory_op` for ``sdpa``, `copy_fn`) and
returned as a record: what ran, dlsim's FLOPs and bytes of it, the time; or, where a backend cannot run
these inputs on this device, the reason in one line.
"""

from __future__ import annotations

from typing import Any

from dlsim.calibrate.compute_ops import copy_fn, memory_op
from dlsim.calibrate.compute_plan import sdpa_layer
from dlsim.calibrate.compute_timer import KernelTimer
from dlsim.calibrate.cuda_calls import sdpa_backend
from dlsim.cost.layers import layer_cost
from dlsim.errors import one_line


def _timed(rec: dict[str, Any], fn: Any, timer: KernelTimer) -> dict[str, Any]:
    timing = timer.time(fn)
    return {**rec, "status": "measured", "time_s": timing.seconds, "iqr_s": timing.iqr_s, "repeats": timing.repeats}


def _failed(rec: dict[str, Any], exc: Exception) -> dict[str, Any]:
    return {**rec, "status": "unavailable", "reason": one_line(exc)}


def time_sdpa(shape: tuple[int, int, int, int], backend: str, pass_name: str, dtype: str, device: Any,
              timer: KernelTimer, causal: bool = True) -> dict[str, Any]:
    """Causal SDPA over (batch, heads, steps, width) with one backend only, forward or its whole backward
    ("backward_data"); a record (see the module docstring)."""
    batch, heads, steps, width = shape
    layer = sdpa_layer(heads, steps, width, dtype, causal)
    p = getattr(layer_cost(layer, batch, dtype), pass_name)
    rec = {"kind": "kernel", "family": f"sdpa-{backend}", "op": "sdpa", "pass": pass_name, "dtype": dtype,
           "shape": list(shape), "causal": causal, "flops": p.flops, "bytes": p.bytes}
    try:
        with sdpa_backend(backend):
            return _timed(rec, memory_op(layer, batch, pass_name, dtype, device), timer)
    except Exception as exc:  # the backend cannot run these inputs here
        return _failed(rec, exc)


def time_copy(elements: int, dtype: str, device: Any, timer: KernelTimer) -> dict[str, Any]:
    """``dst.copy_(src)`` of `elements` elements; a record."""
    rec = {"kind": "kernel", "family": "copy", "op": "copy", "pass": "forward", "dtype": dtype,
           "shape": [elements], "flops": 0.0}
    try:
        fn, nbytes = copy_fn(elements, dtype, device)
    except Exception as exc:
        return _failed({**rec, "bytes": 0.0}, exc)
    return _timed({**rec, "bytes": nbytes}, fn, timer)
