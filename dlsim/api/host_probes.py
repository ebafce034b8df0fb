"""The host probes of a CPU calibration: which ones it needs, and each measured once per host.

A CPU profile's ``device.csv`` holds, beside its kernel tables, what a plain training loop in a default
process pays beyond them, measured by probes of the calibration's own (sessions 9-13 of issue 15 built
them for the ten-network validation, reports/validation-torch-nets-notes.md):

* ``fresh_memory_s_per_byte_t<N>``: a fresh page's cost with N threads (`dlsim.calibrate.alloc_probe`,
  one fresh process);
* ``heap_refault_fraction`` α and ``optimizer_in_loop_extra_s`` h: the four heap probe networks, four
  fresh processes each (`dlsim.calibrate.loop_probe.HEAP_PROBES`);
* ``optimizer_in_loop_extra_fit_s`` h_fit: the three small probe networks, four fresh processes each
  (`loop_probe.FIT_PROBES`);
* ``host_op_forward_s``, ``host_op_backward_s``: the host time per ATen operator (`dlsim.calibrate.host_ops`).

**Sized to what the predictions need** (`needs`). The estimate charges fresh pages (rate at the
tables' thread count, α) to every model on a CPU profile, but the host time per operator and the
optimizer step's in-loop extras only to layers captured from PyTorch (they carry ``host_ops``,
`dlsim.cost.hostops`). So a calibration of zoo or YAML models measures the fresh-page rate at its
thread count and the heap probes (α; h comes with them); one with a captured model, or a generic one
(no model: it serves any later prediction), measures all of them.

**Once per host** (`dlsim.io.host_cache`). Each probe's result is a property of the host and its software:
it is kept in the user's cache, keyed by both, and a later calibration on the same host copies it into
its ``device.csv`` (the row's ``how`` says when it was measured and where it was kept) instead of
measuring it again; the loop probe is kept per network and per process, so an interrupted probe resumes
at the process it stopped in. `reuse=False` measures everything again (and refreshes the cache).

**Resume**: a probe is done for a profile when its rows are in ``device.csv``: the fresh-page rate's row,
α for the heap probes (always written by them; h is not, on a host whose cache holds every heap probe's
step), h_fit for the small probes, the two host rates.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from dlsim.calibrate import alloc_probe, host_ops, loop_probe
from dlsim.calibrate.compute_store import TableFile
from dlsim.calibrate.host_probe import host_key
from dlsim.cost.allocation import REFAULT_QUANTITY
from dlsim.cost.hostops import OPTIMIZER_FIT_QUANTITY, QUANTITIES as HOST_QUANTITIES
from dlsim.io.host_cache import Entry, HostCache
from dlsim.progress import PHASE_RUNNING, PHASE_WAITING

Progress = Callable[[int, int, str, str], None]
FRESH_REPEATS = 5
NETWORKS = {REFAULT_QUANTITY: loop_probe.HEAP_PROBES, OPTIMIZER_FIT_QUANTITY: loop_probe.FIT_PROBES}
"""The loop probe's networks behind α (and h) and behind h_fit."""
ROUNDS = loop_probe.ROUNDS
"""Fresh processes per network."""


@dataclass(frozen=True)
class ProbeNeeds:
    """The probes a calibration runs: the fresh-page rate at `threads`, the heap probes (α, h), the small
    probes (h_fit) and the host time per operator; `why` says why the last two are or are not needed."""

    threads: int
    heap: bool = True
    fit: bool = True
    host_ops: bool = True
    why: str = ""


def needs(models: Sequence[Any], threads: int) -> ProbeNeeds:
    """What the predictions of `models` (dlsim `Model`s; none: a generic calibration) charge on a CPU
    profile (see the module docstring)."""
    captured = [m.name for m in models if any(layer.attrs.get("host_ops") for layer in m.layers)]
    if not models:
        return ProbeNeeds(threads, why="a calibration without --model serves any prediction: every probe")
    if captured:
        return ProbeNeeds(threads, why=f"captured from PyTorch ({', '.join(captured)}): host time per operator "
                                       "and the optimizer step's in-loop extras are charged")
    return ProbeNeeds(threads, fit=False, host_ops=False,
                      why="no model captured from PyTorch: host time per operator and the in-loop optimizer "
                          "extra for steps that fit the cache are not charged (calibrate a FILE.py:FACTORY "
                          "model or without --model to measure them)")


def present(has: Callable[[str], bool], wanted: ProbeNeeds) -> bool:
    """Whether a device.csv (`has(quantity)`) holds every probe row `wanted` asks for (the resume rule of the
    module docstring)."""
    return has(alloc_probe.QUANTITY.format(threads=wanted.threads)) and (not wanted.heap or has(REFAULT_QUANTITY)) \
        and (not wanted.fit or has(OPTIMIZER_FIT_QUANTITY)) and (not wanted.host_ops or all(map(has, HOST_QUANTITIES)))


def method_version(*modules: Any) -> str:
    """A version of a probe's method: the hash of its modules' source (a changed probe is a new cache key)."""
    h = hashlib.sha1()
    for module in modules:
        h.update(Path(module.__file__).read_bytes())
    return h.hexdigest()[:12]


@dataclass
class ProbeReport:
    """Per probe: "present" (already in device.csv), "cache" (copied from the host cache), "measured"
    (measured now) or "not needed"; the seconds spent measuring; the cache directory."""

    sources: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    cache: str | None = None
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"sources": dict(self.sources), "measured_s": round(self.seconds, 1), "host_cache": self.cache,
                "sizing": self.why}


class _Runner:
    def __init__(self, table: TableFile, cache: HostCache, reuse: bool, progress: Progress | None):
        self.table, self.cache, self.reuse, self.progress = table, cache, reuse, progress
        self.report = ProbeReport(cache=str(cache.dir) if cache.enabled else None)

    def has(self, quantity: str) -> bool:
        return self.table.has({"quantity": quantity})

    def append(self, rows: list[dict[str, str]]) -> None:
        for row in rows:
            if not self.has(row["quantity"]):
                self.table.append(row)

    def say(self, done: int, total: int, label: str, elsewhere: bool = True) -> None:
        """Progress of a probe: `done` of `total` steps; `elsewhere`: it runs in another process."""
        if self.progress:
            self.progress(done, total, label, PHASE_WAITING if elsewhere else PHASE_RUNNING)

    def cached(self, probe: str, params: dict[str, Any]) -> Entry | None:
        return self.cache.get(probe, params) if self.reuse else None

    def single(self, name: str, label: str, params: dict[str, Any], measure: Callable[[], Any],
               rows: Callable[[Any, str], list[dict[str, str]]], elsewhere: bool = True) -> None:
        """A probe with one result: from the cache, else measured (and kept)."""
        entry = self.cached(name, params)
        if entry is not None:
            self.append(rows(entry.value, entry.provenance()))
            self.report.sources[name] = "cache"
            return
        self.say(0, 1, label, elsewhere)
        start = time.perf_counter()
        value = measure()
        seconds = time.perf_counter() - start
        self.report.seconds += seconds
        kept = self.cache.put(name, params, value, seconds)
        self.append(rows(value, f"measured {kept.measured}" if kept else ""))
        self.report.sources[name] = "measured"

    def loop(self, networks: Sequence[str], quantity: str, label: str) -> None:
        """Rounds of fresh processes of `networks` (`loop_probe.ROUNDS` each), the ones the cache holds
        reused, then the rows of every quantity this device.csv lacks."""
        from dlsim.calibrate.compute_timer import last_level_cache_bytes
        params = {"method": method_version(loop_probe), "rounds": ROUNDS,
                  "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "")}
        runs: dict[str, list[dict[str, float]]] = {}
        dates: set[str] = set()
        for name in networks:
            entry = self.cached(f"loop-{name}", params)
            runs[name] = list(entry.value)[:ROUNDS] if entry is not None and isinstance(entry.value, list) \
                else []
            if entry is not None and runs[name]:
                dates.add(entry.measured)
        reused = sum(len(r) for r in runs.values())
        total = ROUNDS * len(networks)
        done = reused
        for round_ in range(ROUNDS):  # round robin: each round runs every network once
            for name in networks:
                if len(runs[name]) > round_:
                    continue
                self.say(done, total, f"{label} {done + 1}/{total}: {name} in a fresh process")
                start = time.perf_counter()
                runs[name].append(loop_probe.probe_run(name))
                seconds = time.perf_counter() - start
                self.report.seconds += seconds
                self.cache.put(f"loop-{name}", params, runs[name], seconds)
                done += 1
        origin = (f"{reused} of the {total} processes reused from the host cache {self.cache.dir} (measured "
                  f"{', '.join(sorted(dates))})" if reused else "")
        cache_bytes = last_level_cache_bytes("cpu")
        self.append(loop_probe.rows_from_values(loop_probe.values_from_runs(runs, cache_bytes), origin))
        self.report.sources[quantity] = "cache" if reused == total else "measured" if not reused else "cache+measured"


def run_probes(device_csv: TableFile, wanted: ProbeNeeds, *, reuse: bool = True, cache: HostCache | None = None,
               progress: Progress | None = None) -> ProbeReport:
    """Append to a CPU profile's `device_csv` the probe rows `wanted` that it lacks (module docstring)."""
    cache = cache if cache is not None else HostCache(host_key())
    run = _Runner(device_csv, cache, reuse, progress)
    run.report.why = wanted.why
    t = wanted.threads
    fresh = alloc_probe.QUANTITY.format(threads=t)
    if run.has(fresh):
        run.report.sources[fresh] = "present"
    else:
        run.single(fresh, f"fresh-page probe ({t} threads, a fresh process)",
                   {"threads": t, "repeats": FRESH_REPEATS, "method": method_version(alloc_probe)},
                   lambda: alloc_probe.fresh_memory_in_fresh_process(t, FRESH_REPEATS),
                   lambda v, origin: [alloc_probe.fresh_memory_row(t, float(v), FRESH_REPEATS, origin)])
    for quantity, wanted_here, label in ((REFAULT_QUANTITY, wanted.heap, "loop probe (heap)"),
                                         (OPTIMIZER_FIT_QUANTITY, wanted.fit, "loop probe (small steps)")):
        networks = NETWORKS[quantity]
        if run.has(quantity):
            run.report.sources[quantity] = "present"
        elif not wanted_here:
            run.report.sources[quantity] = "not needed"
        else:
            run.loop(networks, quantity, label)
    if run.has(HOST_QUANTITIES[0]) and run.has(HOST_QUANTITIES[1]):
        run.report.sources["host_op"] = "present"
    elif not wanted.host_ops:
        run.report.sources["host_op"] = "not needed"
    else:
        run.single("host_op", "host probe (an eager step against its operators replayed)",
                   {"threads": t, "method": method_version(host_ops)}, host_ops.host_op_seconds,
                   lambda v, origin: host_ops.host_op_rows(tuple(v), origin), elsewhere=False)
    return run.report


def reference_speeds(threads: int | None, *, reuse: bool = True, cache: HostCache | None = None,
                     measure: Callable[[int | None], Any] | None = None) -> tuple[dict[str, float], Entry | None]:
    """This host's reference GEMM and stream speeds with `threads` threads (`dlsim.calibrate.host_probe`),
    measured once per host and kept in the host cache; the speeds and the cache entry they came from (None:
    measured now)."""
    from dlsim.calibrate import host_probe
    cache = cache if cache is not None else HostCache(host_key())
    params = {"threads": threads, "method": host_probe.REFERENCE_METHOD}
    entry = cache.get("reference", params) if reuse else None
    if entry is not None and isinstance(entry.value, dict):
        return {k: float(v) for k, v in entry.value.items()}, entry
    start = time.perf_counter()
    speeds = dict((measure or host_probe.reference_speeds)(threads))
    cache.put("reference", params, speeds, time.perf_counter() - start)
    return {k: float(v) for k, v in speeds.items()}, None
