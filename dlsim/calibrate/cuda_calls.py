"""The CUDA-specific calls of a calibration, kept thin so that tests can replace them with fakes.

* `EventBlockTimer`: a block of calls timed between two CUDA events (``torch.cuda.Event(enable_timing=
  True)``): record a start event, enqueue the calls, record an end event, wait for it, read
  ``start.elapsed_time(end)`` (milliseconds). The events time the stream itself, so the host's clock and
  a synchronisation before the block are not needed: work enqueued earlier (a cache flush) finishes on
  the stream before the start event fires, and is not counted (the method of
  ``triton.testing.do_bench`` and of the CUDA C++ Best Practices Guide, §8.1.2 "Using CUDA GPU Timers").
* `fp8_support` and `fp8_matmul`: whether this PyTorch and device multiply FP8 (E4M3) matrices, and a
  GEMM doing it: ``torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=bfloat16)`` with ``a`` row-major and
  ``b`` column-major, unit scales, every dimension a multiple of 16 (the constraints of PyTorch's
  cuBLASLt FP8 path, aten/src/ATen/native/cuda/Blas.cpp). FP8 tensor cores exist from compute
  capability 8.9 (Ada, Hopper; NVIDIA CUDA C++ Programming Guide, "Compute Capabilities").
* `sdpa_backend`: run ``F.scaled_dot_product_attention`` with one backend only
  (``torch.nn.attention.sdpa_kernel``): flash (Dao 2023), memory-efficient (Rabe & Staats 2021, the
  xFormers kernel), cuDNN or the unfused math path. A backend that cannot run the inputs raises at the
  call ("No available kernel"), which the caller records as unavailable.

torch is imported inside the functions only; every function takes the torch module as an optional
argument so that tests pass a fake one.
"""

from __future__ import annotations

from typing import Any, Callable

from dlsim.errors import DlsimError, one_line

FP8_MIN_CAPABILITY = (8, 9)
FP8_MULTIPLE = 16
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "math": "MATH"}
"""dlsim's names of PyTorch's SDPA backends (``torch.nn.attention.SDPBackend`` members)."""


def _torch(module: Any) -> Any:
    if module is not None:
        return module
    import torch
    return torch


class EventBlockTimer:
    """Seconds per call of `calls` back-to-back calls of a function, between two CUDA events."""

    def __init__(self, cuda: Any = None):
        self.cuda = cuda if cuda is not None else _torch(None).cuda

    def __call__(self, fn: Callable[[], Any], calls: int) -> float:
        start, end = self.cuda.Event(enable_timing=True), self.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3 / calls


def fp8_matmul(m: int, n: int, k: int, device: Any, torch_module: Any = None) -> Callable[[], Any]:
    """A function multiplying an (m×k) by a (k×n) FP8 E4M3 matrix into bf16 (see the module docstring)."""
    torch = _torch(torch_module)
    if any(d % FP8_MULTIPLE for d in (m, n, k)):
        raise DlsimError(f"an FP8 GEMM needs every dimension a multiple of {FP8_MULTIPLE}, got {m}x{n}x{k}")
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, generator=gen, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, generator=gen, device=device).to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=device, dtype=torch.float32)
    return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def fp8_support(device: str, torch_module: Any = None) -> tuple[bool, str]:
    """(whether FP8 GEMMs run on `device` here, why or why not): the types and ``_scaled_mm`` exist, a CUDA
    device has compute capability >= 8.9, and a 16x16x16 product runs."""
    torch = _torch(torch_module)
    version = str(getattr(torch, "__version__", "?"))
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return False, f"torch {version} has no float8_e4m3fn / _scaled_mm"
    if device == "cuda":
        capability = tuple(torch.cuda.get_device_capability(0))
        if capability < FP8_MIN_CAPABILITY:
            return False, (f"compute capability {capability[0]}.{capability[1]} has no FP8 tensor cores "
                           f"(needs {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]})")
    try:
        fp8_matmul(FP8_MULTIPLE, FP8_MULTIPLE, FP8_MULTIPLE, device, torch)()
    except Exception as exc:  # the library's own refusal, reported as the reason
        return False, f"torch._scaled_mm fails here: {one_line(exc)}"
    return True, f"torch._scaled_mm (E4M3 x E4M3 -> bf16) runs on {device}, torch {version}"


def sdpa_backend(name: str, torch_module: Any = None) -> Any:
    """The context in which ``F.scaled_dot_product_attention`` may use the backend `name` only."""
    if name not in SDPA_BACKENDS:
        raise DlsimError(f"unknown SDPA backend {name!r} (use {', '.join(SDPA_BACKENDS)})")
    if torch_module is None:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    else:
        SDPBackend, sdpa_kernel = torch_module.nn.attention.SDPBackend, torch_module.nn.attention.sdpa_kernel
    return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[name])])
