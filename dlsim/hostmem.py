"""The host's memory as Linux reports it (/proc/meminfo). A module of its own, outside the layers: the
calibration records the total, the training-loop helpers check an example batch against what is available."""

from __future__ import annotations

import re
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
