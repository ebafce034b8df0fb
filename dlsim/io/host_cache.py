"""This host's probe results, measured once and reused: a cache under the user's cache home.

What a calibration's host probes measure (the cost of a fresh page, the heap's re-fault share, the
optimizer step's in-loop extra, the host time per ATen operator) and the reference speeds a
prediction's host check compares are properties of the machine and its software, not of a profile:
measured once per host, they are kept here and reused by every later calibration and prediction on
the same host, with the date they were measured. A profile's own files never serve as this cache.

Layout: ``ROOT/<cpu>-<hash of the host key>/<probe>-<hash of its parameters>.json``, where the host key
is the host's identity (CPU model, instruction-set flags, logical CPUs, last-level cache) and its
software (Python, C library, kernel release, torch, dlsim), and a probe's parameters say how it was
measured (thread count, method version). A change of either is a new key: nothing stale is ever read.
Each entry is written atomically (`dlsim.io.files.write_atomic`); two processes that measure the same
probe at once both write a valid entry and the last one stays. ROOT is ``$DLSIM_CACHE_DIR`` when set,
else dlsim's directory under the user's cache home (`platformdirs.user_cache_dir`: ``$XDG_CACHE_HOME``
or ``~/.cache`` on Linux). ``DLSIM_CACHE_DIR=off`` (or ``none``, ``0``) turns the cache off.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from dlsim.io.files import OutputError, write_atomic

ENV = "DLSIM_CACHE_DIR"
OFF = ("off", "none", "0", "no", "false")
FORMAT = 1


def cache_root() -> Path | None:
    """Where the cache lives (None: turned off, see the module docstring)."""
    given = os.environ.get(ENV, "").strip()
    if given.lower() in OFF:
        return None
    if given:
        return Path(given).expanduser()
    import platformdirs
    return Path(platformdirs.user_cache_dir("dlsim", appauthor=False)) / "hosts"


def digest(value: Any, length: int = 12) -> str:
    """A short stable hash of a JSON-serialisable value (keys sorted)."""
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:length]


@dataclass(frozen=True)
class Entry:
    """One cached probe result: its value, when it was measured, how long it took, and the file."""

    value: Any
    measured: str
    seconds: float
    path: Path

    def provenance(self) -> str:
        """``measured on this host <date>, reused from <path>``."""
        return f"measured on this host {self.measured}, reused from {self.path}"


class HostCache:
    """The probe results of one host (`host_key`: identity and software) under `root` (see the module
    docstring); `root` None: a cache that holds nothing and keeps nothing."""

    def __init__(self, host_key: Mapping[str, Any], root: Path | None | str = "default"):
        self.key = dict(host_key)
        self.root = cache_root() if root == "default" else (Path(root) if root is not None else None)
        slug = re.sub(r"[^a-z0-9]+", "-", str(self.key.get("cpu", "host")).lower()).strip("-")[:40] or "host"
        self.dir = self.root / f"{slug}-{digest(self.key)}" if self.root is not None else None

    @property
    def enabled(self) -> bool:
        return self.dir is not None

    def _path(self, probe: str, params: Mapping[str, Any]) -> Path | None:
        return self.dir / f"{probe}-{digest(dict(params), 10)}.json" if self.dir is not None else None

    def get(self, probe: str, params: Mapping[str, Any]) -> Entry | None:
        """The cached result of `probe` measured with `params` on this host, or None (also when the file is
        unreadable or describes another key: it is then measured again and replaced)."""
        path = self._path(probe, params)
        if path is None or not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("host") != self.key \
                or data.get("probe") != probe or data.get("params") != json.loads(json.dumps(dict(params))):
            return None
        return Entry(data.get("value"), str(data.get("measured", "")), float(data.get("seconds", 0.0)), path)

    def put(self, probe: str, params: Mapping[str, Any], value: Any, seconds: float) -> Entry | None:
        """Keep `value` (JSON-serialisable) as `probe`'s result with `params`; the entry, or None when the
        cache is off or cannot be written (a cache is never worth failing a measurement for)."""
        path = self._path(probe, params)
        if path is None:
            return None
        measured = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        record = {"format": FORMAT, "probe": probe, "params": dict(params), "host": self.key, "measured": measured,
                  "seconds": round(seconds, 3), "value": value}
        try:
            write_atomic(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
        except OutputError:
            return None
        return Entry(json.loads(json.dumps(value)), measured, round(seconds, 3), path)
