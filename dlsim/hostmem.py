"""The host's memory as Linux reports it (/proc/meminfo, getrusage). A module of its own, outside the layers:
the calibration records the total, the training-loop helpers check an example batch against what is available,
and the loop probe and validation count the pages a step faults in."""

from __future__ import annotations

import re
import resource
from pathlib import Path

from dlsim.units import KIB


def meminfo_bytes(field: str = "MemTotal") -> float | None:
    """A field of /proc/meminfo in bytes (MemTotal; MemAvailable: free plus reclaimable cache), None where it
    cannot be read."""
    try:
        m = re.search(rf"^{field}:\s*(\d+)\s*kB", Path("/proc/meminfo").read_text(), re.M)
    except OSError:
        return None
    return float(m.group(1)) * KIB if m else None


def faulted_bytes() -> float:
    """Bytes this process has taken minor page faults on so far: minor faults (getrusage) x page size. The
    difference over n steps, divided by n, is the fresh memory a step touches."""
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_minflt * resource.getpagesize())
