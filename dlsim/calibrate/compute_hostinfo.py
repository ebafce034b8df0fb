"""What a calibration ran on: device name, cores, memory, driver and library versions (for meta.yaml)."""

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


def _nvidia_driver() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


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
        props = torch.cuda.get_device_properties(0)
        info.update({"device": torch.cuda.get_device_name(0), "memory_bytes": float(props.total_memory),
                     "multiprocessors": props.multi_processor_count, "cuda": torch.version.cuda,
                     "cudnn": torch.backends.cudnn.version(), "driver": _nvidia_driver()})
    else:
        info.update({"device": f"{cpu} ({logical} cores)", "memory_bytes": info["host_memory_bytes"]})
    from dlsim.calibrate.compute_timer import last_level_cache_bytes
    info["last_level_cache_bytes"] = float(last_level_cache_bytes(device))
    return info
