"""What a calibration ran on: device name, cores, memory, clocks, driver and library versions (for meta.yaml)."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from dlsim.hostmem import meminfo_bytes


def _cpuinfo() -> tuple[str, int]:
    """(model name, logical CPUs) from /proc/cpuinfo, as lscpu reports them."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "cpu", os.cpu_count() or 1
    names = re.findall(r"^model name\s*:\s*(.+)$", text, re.M)
    return (names[0].strip() if names else platform.processor() or "cpu"), len(names) or (os.cpu_count() or 1)


NVIDIA_SMI_FIELDS = {"driver": "driver_version", "sm_clock_max_mhz": "clocks.max.sm",
                     "memory_clock_max_mhz": "clocks.max.memory", "power_limit_w": "power.limit",
                     "pcie_link_gen_max": "pcie.link.gen.max", "pcie_link_width_max": "pcie.link.width.max"}
"""What `cuda_facts` reads from ``nvidia-smi --query-gpu`` (its field names), unit in dlsim's key."""


def nvidia_smi(fields: dict[str, str] = NVIDIA_SMI_FIELDS, index: int = 0) -> dict[str, str]:
    """``nvidia-smi --query-gpu=...`` of GPU `index` as {dlsim key: value}, leaving out what it reports as
    unavailable; empty without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        out = subprocess.run([exe, f"--id={index}", f"--query-gpu={','.join(fields.values())}",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    lines = out.stdout.strip().splitlines() if out.returncode == 0 else []
    if not lines:
        return {}
    values = [v.strip() for v in lines[0].split(",")]
    return {key: v for key, v in zip(fields, values) if v and not v.startswith("[") and v != "N/A"}


CUBLAS_DISTRIBUTIONS = ("nvidia-cublas-cu13", "nvidia-cublas-cu12", "nvidia-cublas-cu11", "nvidia-cublas")


def cublas_version() -> str | None:
    """The cuBLAS of this PyTorch: the version of the pip wheel that ships it (PyTorch's CUDA wheels depend
    on nvidia-cublas-cuXX), or None (a build linking a system cuBLAS does not say)."""
    from importlib import metadata
    for dist in CUBLAS_DISTRIBUTIONS:
        try:
            return f"{metadata.version(dist)} ({dist})"
        except metadata.PackageNotFoundError:
            continue
    return None


def cuda_facts(torch_module: Any = None, index: int = 0) -> dict[str, Any]:
    """The CUDA device `index` as PyTorch and nvidia-smi see it: name, memory, multiprocessors, compute
    capability, L2 cache, clocks, power limit, driver, CUDA, cuBLAS and cuDNN versions."""
    torch = torch_module
    if torch is None:
        import torch
    props = torch.cuda.get_device_properties(index)
    major, minor = torch.cuda.get_device_capability(index)
    smi = nvidia_smi(index=index)
    return {"device": torch.cuda.get_device_name(index), "memory_bytes": float(props.total_memory),
            "multiprocessors": props.multi_processor_count, "compute_capability": f"{major}.{minor}",
            "l2_cache_bytes": float(getattr(props, "L2_cache_size", 0) or 0), "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "cublas": cublas_version(), "driver": smi.get("driver"),
            **{k: float(v) for k, v in smi.items() if k != "driver" and _number(v)},
            "devices_visible": torch.cuda.device_count()}


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _library_versions(config: str) -> dict[str, str]:
    found = {}
    for key, pattern in (("mkl", r"Math Kernel Library Version ([\w.\-]+)"), ("onednn", r"MKL-DNN v([\w.]+)"),
                         ("openmp", r"OpenMP (\d+)"), ("cpu_capability", r"CPU capability usage: (\w+)")):
        m = re.search(pattern, config)
        if m:
            found[key] = m.group(1)
    return found


def host_description(device: str, threads: int) -> dict[str, Any]:
    """A mapping for meta.yaml's ``device`` (and the profile's device name)."""
    import torch
    cpu, logical = _cpuinfo()
    info: dict[str, Any] = {"kind": device, "cpu": cpu, "logical_cpus": logical, "threads": threads,
                            "host_memory_bytes": meminfo_bytes() or 0.0, "torch": str(torch.__version__),
                            "python": platform.python_version(), "os": platform.platform(),
                            **_library_versions(torch.__config__.show())}
    if device == "cuda":
        info.update(cuda_facts(torch))
    else:
        info.update({"device": f"{cpu} ({logical} cores)", "memory_bytes": info["host_memory_bytes"]})
    from dlsim.calibrate.compute_timer import last_level_cache_bytes
    info["last_level_cache_bytes"] = float(last_level_cache_bytes(device))
    return info
