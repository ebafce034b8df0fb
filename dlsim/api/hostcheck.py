"""Is a measured CPU profile being used on the host it was measured on? One warning line when not.

A profile calibrated by ``dlsim calibrate compute`` records its host in ``meta.yaml`` (``host:``,
`dlsim.calibrate.host_probe.host_record`). A prediction with such a profile compares that record
with this host's identity (CPU model, flags, logical CPUs); only when they differ does it need this
host's reference GEMM and stream speeds, which are timed once per host (about two seconds) and kept
in the user's cache with the date they were measured (`dlsim.api.host_probes.reference_speeds`,
`dlsim.io.host_cache`), and it warns with the speed ratios. A CPU profile with measured tables but no host record gets a note saying
its host cannot be checked.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Mapping

from dlsim.io.yamlfile import read_yaml
from dlsim.spec.cluster import Cluster


def profile_meta(cluster: Cluster) -> Mapping[str, Any]:
    """The profile's meta.yaml (empty when it has none)."""
    if not cluster.source:
        return {}
    meta = Path(cluster.source).parent / "meta.yaml"
    return (read_yaml(meta) or {}) if meta.exists() else {}


def _speeds(measured: list[str]) -> Callable[[int | None], Mapping[str, float]] | None:
    """This host's reference speeds, from the host cache or timed once and kept there (None without torch);
    appends to `measured` when they were measured."""
    from importlib.util import find_spec
    if find_spec("torch") is None:
        return None
    from dlsim.api.host_probes import reference_speeds

    def speeds(threads: int | None) -> Mapping[str, float]:
        value, entry = reference_speeds(threads)
        measured.append(entry.measured if entry is not None else "now")
        return value
    return speeds


@functools.lru_cache(maxsize=32)
def _checked(source: str, mtime: float) -> tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[str, Any], ...]]:
    from dlsim.calibrate.host_probe import compare_hosts
    cluster_meta = read_yaml(Path(source).parent / "meta.yaml") or {}
    host = cluster_meta.get("host")
    name = Path(source).parent.name
    if not host:
        if (cluster_meta.get("device") or {}).get("kind") == "cpu":
            return (), (f"profile {name} records no host (calibrated before dlsim recorded hosts): whether it "
                        f"describes this machine is not checked; `dlsim calibrate compute --quick --out DIR` checks it",
                        ), ()
        return (), (), ()
    when: list[str] = []
    result = compare_hosts(host, speeds=_speeds(when))
    summary = {"recorded": {k: host.get(k) for k in ("cpu", "logical_cpus", "flags_sha1", "threads", "reference")},
               "same_host": result.same, "differences": list(result.differences),
               "gemm_ratio": result.gemm_ratio, "stream_ratio": result.stream_ratio,
               **({"speeds_measured": when[0]} if when else {})}
    warnings = (result.line(name, host),) if not result.same else ()
    return warnings, (), tuple(summary.items())


def host_check(cluster: Cluster) -> tuple[list[str], list[str], dict[str, Any]]:
    """(warnings, notes, record) about the host `cluster`'s measured tables came from (see the module docstring)."""
    if not cluster.source or not cluster.tables:
        return [], [], {}
    meta = Path(cluster.source).parent / "meta.yaml"
    if not meta.exists():
        return [], [], {}
    warnings, notes, summary = _checked(str(cluster.source), meta.stat().st_mtime)
    return list(warnings), list(notes), dict(summary)
