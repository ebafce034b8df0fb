"""`calibrate_comm()`: measure point-to-point and collective times into a hardware profile directory.

Writes (in `out`): ``comm_p2p.csv`` (ping-pong, PRTT, reduction speed) and ``comm_collectives.csv``
(every collective over sizes, and allreduce with each Open MPI algorithm forced), rows appended as
they are measured so a rerun resumes; ``meta.yaml`` (machine, library versions, fits, every run);
and ``profile.yaml``: a new one whose link tier, γ and device line are measured here, or, when one
exists, only the table entries it lacks (nothing a user wrote is replaced).

`import_nccl_tests()` reads nccl-tests output (`all_reduce_perf` and friends) into the same
collective table, marked with its source.
"""

from __future__ import annotations

import datetime
import math
import os
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from dlsim.calibrate.comm_launch import Hosts
from dlsim.calibrate.comm_measure import COLLECTIVE_COLUMNS, COLLECTIVE_TABLE, P2P_TABLE, collective_key
from dlsim.calibrate.comm_nccl import collective_from_name, import_rows, parse_nccl_tests
from dlsim.calibrate.comm_plan import BACKENDS, COLLECTIVES, OPENMPI_ALLREDUCE, CommPlan, powers_of_two
from dlsim.calibrate.comm_run import fit_tables, launches, quick_gemm_flops, read_rows, run_launches, system_info
from dlsim.calibrate.compute_store import TableFile
from dlsim.errors import SpecError
from dlsim.hostmem import meminfo_bytes
from dlsim.io.files import write_atomic
from dlsim.io.profile_write import add_tables, write_new_profile
from dlsim.io.yamlfile import read_yaml
from dlsim.units import GBYTE_PER_S, GIB, TFLOPS, US, parse_size

TABLES = {"comm_p2p": P2P_TABLE, "comm_collectives": COLLECTIVE_TABLE}
MAX_RANKS = 1024


def parse_hosts(spec: str | None) -> Hosts:
    """``None``/``local``: this machine. ``ssh:a,b,c``: one rank per host, started over ssh."""
    if spec is None or spec == "local":
        return Hosts()
    kind, sep, names = spec.partition(":")
    if kind != "ssh" or not sep or not names.strip():
        raise SpecError(f"--hosts must be 'local' or 'ssh:HOST1,HOST2,...', got {spec!r}", field="hosts")
    hosts = tuple(h.strip() for h in names.split(",") if h.strip())
    return Hosts(label=",".join(hosts), prefixes=tuple(("ssh", h) for h in hosts), addresses=hosts)


def emulated_hosts(cluster: Any) -> Hosts:
    """`Hosts` for a `dlsim.validate.emulated_cluster.EmulatedCluster` that is up."""
    n = cluster.hosts
    return Hosts(label=f"emulated-{n}x{cluster.rate}", prefixes=tuple(tuple(cluster.exec_prefix(i)) for i in range(n)),
                 addresses=tuple(cluster.address(i) for i in range(n)), subnet=f"{cluster.subnet}.0/24",
                 interfaces=tuple(cluster.interface(i) for i in range(n)), description=cluster.describe())


def size_range(text: str) -> tuple[int, ...]:
    """``"1KiB:16MiB"`` → powers of two from 1 KiB to 16 MiB."""
    lo, sep, hi = text.partition(":")
    if not sep:
        raise SpecError(f"a size range is LO:HI, e.g. 1KiB:16MiB, got {text!r}", field="sizes")
    a, b = int(parse_size(lo)), int(parse_size(hi))
    if a < 1 or b < a:
        raise SpecError(f"size range needs 1 <= LO <= HI, got {text!r}", field="sizes")
    return powers_of_two(a, b)


def make_plan(backend: str, out: Path, hosts: Hosts, *, sizes: Sequence[int] | None = None,
              collectives: Sequence[str] | None = None, quick: bool = False, budget_s: float = 0.5,
              max_reps: int = 40, idle_gap_s: float = 0.0, idle_wait: str = "sleep") -> CommPlan:
    """The measurement plan; `quick` measures few sizes with few repetitions (a smoke test);
    `idle_gap_s`: links idle that long before every collective repetition (`CommPlan`)."""
    if backend not in BACKENDS:
        raise SpecError(f"unknown backend {backend!r} (use {', '.join(BACKENDS)})", field="backend")
    bad = [c for c in collectives or () if c not in COLLECTIVES]
    if bad:
        raise SpecError(f"cannot measure collective {bad[0]!r} (use {', '.join(COLLECTIVES)})", field="collective")
    kw: dict[str, Any] = {}
    if quick:
        kw = dict(pingpong_sizes=powers_of_two(1, 1 << 20, 16), prtt_sizes=powers_of_two(1, 1 << 16, 16),
                  reduce_sizes=(1 << 16, 1 << 20), collective_sizes=(1 << 12, 1 << 20), min_reps=2, max_reps=5,
                  budget_s=0.05)
    else:
        kw = dict(budget_s=budget_s, max_reps=max_reps)
    if sizes:
        kw["collective_sizes"] = tuple(sizes)
    if collectives:
        kw["collectives"] = tuple(collectives)
    return CommPlan(backend, str(out), hosts=hosts.label, idle_gap_s=idle_gap_s, idle_wait=idle_wait, **kw)


def _check_backend_available(backend: str, ranks: int, hosts: Hosts) -> None:
    if backend == "nccl":
        try:
            import torch
        except ImportError:
            raise SpecError("--backend nccl needs PyTorch with CUDA (pip install torch)", field="backend") from None
        if not torch.cuda.is_available():
            raise SpecError("--backend nccl needs CUDA GPUs; none is visible here (use mpi or gloo)", field="backend")
        if not hosts.remote and torch.cuda.device_count() < ranks:
            raise SpecError(f"--backend nccl with {ranks} ranks on this machine needs {ranks} GPUs, "
                            f"found {torch.cuda.device_count()}", field="ranks")
    elif backend == "gloo":
        try:
            import torch.distributed  # noqa: F401
        except ImportError:
            raise SpecError("--backend gloo needs PyTorch (pip install torch)", field="backend") from None
    elif backend == "mpi":
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            raise SpecError("--backend mpi needs mpi4py and Open MPI (pip install mpi4py)", field="backend") from None


def _num(x: float) -> str:
    text = f"{x:.4g}"
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text


def _meminfo_bytes() -> float:
    return meminfo_bytes() or float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def burst_lines(burst: dict[str, Any] | None) -> str:
    """The optional token-bucket keys of a link tier (`comm_fit.fit_burst`), or nothing."""
    if not burst:
        return ""
    text = ("\n  # token bucket fitted to the ping-pong knee (comm_fit.fit_burst, meta.yaml fits.burst): "
            "messages up to the\n  # burst pass at the peak rate once the bucket has refilled at the line rate"
            f"\n  burst_bytes: {_num(burst['burst_bytes'])}")
    if burst["peak_bytes_per_s"] != float("inf"):
        text += f"\n  burst_peak_bandwidth_gbytes_per_s: {_num(burst['peak_bytes_per_s'] / GBYTE_PER_S)}"
    return text


def profile_text(name: str, fits: dict[str, Any], info: dict[str, Any], ranks: int, hosts: Hosts, flops: float,
                 date: str, backend: str) -> str:
    """A new profile.yaml whose link tier, γ and device line are measured (see meta.yaml)."""
    link = fits["link"]
    hk = fits["hockney"]
    stream = fits.get("stream_add_bytes_per_s", 10 * GBYTE_PER_S)
    gamma = fits.get("gamma_s_per_byte")
    tier = f"""  name: {backend}-{'network' if hosts.remote else 'shared-memory'}
  # fitted by dlsim calibrate comm: Hockney alpha = {hk['alpha'] / US:.4g} us (small-message ping-pong),
  # beta from the ping-pong slope over messages >= 1 MiB; o and g from Netgauge PRTT (meta.yaml)
  latency_us: {_num(link['latency'] / US)}
  overhead_us: {_num(link['overhead'] / US)}
  gap_us: {_num(link['gap'] / US)}
  bandwidth_gbytes_per_s: {_num(link['bandwidth'] / GBYTE_PER_S)}"""
    tier += burst_lines(fits.get("burst"))
    own = f"""  name: none
  latency_us: 0
  bandwidth_gbytes_per_s: {_num(stream / GBYTE_PER_S)}"""
    nodes, per_node = (ranks, 1) if hosts.remote else (1, ranks)
    text = f"""# Measured by `dlsim calibrate comm --backend {backend}` on {date}: {info.get('cpu', 'cpu')},
# {ranks} ranks on {hosts.label}. Every number is measured here or fitted to the measured tables
# (comm_p2p.csv, comm_collectives.csv, meta.yaml); none is a datasheet value.
name: {name}
description: {ranks} ranks on {hosts.label} ({backend}), measured communication tables
nodes: {nodes}
devices_per_node: {per_node}
device:
  name: {info.get('cpu', 'cpu')}
  # measured: NumPy float32 1024x1024 matmul, best of 5
  peak_tflops: {{fp32: {_num(flops / TFLOPS)}}}
  memory_gib: {_num(_meminfo_bytes() / GIB)}   # read from the OS
  # measured: numpy.add on float32 vectors (comm_p2p.csv kind=reduce), 3 bytes moved per output byte
  memory_bandwidth_gbytes_per_s: {_num(stream / GBYTE_PER_S)}
"""
    if gamma:
        text += "# measured: the reduction speed (1/gamma) of numpy.add on float32 vectors, comm_p2p.csv kind=reduce\n"
        text += f"reduce_bandwidth_gbytes_per_s: {_num(1.0 / gamma / GBYTE_PER_S)}\n"
    text += "intra_node:\n" + (own if hosts.remote else tier) + "\n"
    if hosts.remote:
        text += "inter_node:\n" + tier + "\n"
    text += f"tables: {{{', '.join(f'{k}: {v}' for k, v in TABLES.items())}}}\n"
    return text


def _update_meta(out: Path, run: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    path = out / "meta.yaml"
    meta = (read_yaml(path) or {}) if path.exists() else {}
    comm = dict(meta.get("comm", {}))
    comm.update(extra)
    comm["runs"] = list(comm.get("runs", [])) + [run]
    meta["comm"] = comm
    write_atomic(path, yaml.safe_dump(meta, sort_keys=False, width=120))
    return meta


def _write_profile(out: Path, text: Callable[[], str], burst: dict[str, Any] | None = None) -> list[str]:
    profile = out / "profile.yaml"
    if profile.exists():
        return add_tables(profile, TABLES) + add_burst(profile, burst)
    write_new_profile(profile, text())
    return ["profile.yaml: written"]


def add_burst(profile: Path, burst: dict[str, Any] | None) -> list[str]:
    """Add the fitted token bucket to an existing profile's network tier (inter_node, else intra_node)
    when that tier has no burst_bytes yet; nothing else in the file changes."""
    if not burst:
        return []
    lines = profile.read_text().splitlines()
    tier = "inter_node:" if "inter_node:" in lines else "intra_node:"
    if tier not in lines:
        return []
    start = lines.index(tier) + 1
    end = next((i for i in range(start, len(lines)) if lines[i] and not lines[i].startswith(" ")), len(lines))
    block = lines[start:end]
    if any(x.strip().startswith("burst_bytes:") for x in block):
        return []
    at = next((i for i in range(start, end) if lines[i].strip().startswith("bandwidth_")), end - 1)
    lines[at + 1:at + 1] = burst_lines(burst).lstrip("\n").splitlines()
    write_atomic(profile, "\n".join(lines) + "\n")
    return [f"profile.yaml: {tier[:-1]}.burst_bytes = {_num(burst['burst_bytes'])} added (fitted token bucket)"]


def calibrate_comm(out: str | Path, *, backend: str = "mpi", ranks: int = 2, hosts: Hosts | str | None = None,
                   algorithms: Sequence[str] | None = None, sizes: Sequence[int] | None = None,
                   collectives: Sequence[str] | None = None, quick: bool = False, budget_s: float = 0.5,
                   max_reps: int = 40, emulated: int | None = None, rate: str = "200mbit", burst: str = "64kb",
                   queue: str = "100ms", tcp_congestion: str | None = None, quiet: bool = False, timeout: float | None = None,
                   command: str = "", idle_gap_s: float = 0.0, idle_wait: str = "sleep") -> dict[str, Any]:
    """Measure, fit and write the profile directory `out` (see the module docstring); returns a record.

    `algorithms`: forced Open MPI allreduce algorithms to measure (default: all four of
    `comm_plan.OPENMPI_ALLREDUCE` for mpi, none otherwise). `emulated`: build an emulated cluster of
    that many hosts at `rate` (root; `dlsim.validate.emulated_cluster`) and run one rank per host.
    `idle_gap_s`: every rank sleeps (`idle_wait` "sleep") or spins ("spin") that long before each
    collective repetition (0: back to back).
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= MAX_RANKS:
        raise SpecError(f"ranks must be an integer from 1 to {MAX_RANKS}, got {ranks!r}", field="ranks")
    if not (isinstance(budget_s, (int, float)) and math.isfinite(budget_s) and budget_s > 0) or max_reps < 1:
        raise SpecError("the time budget must be positive and max repetitions at least 1", field="budget")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SpecError("exists and is not a directory", path=out)
    if algorithms is None:
        algorithms = tuple(OPENMPI_ALLREDUCE) if backend == "mpi" else ()
    with ExitStack() as stack:
        if emulated is not None:
            if hosts not in (None, "local"):
                raise SpecError("give --hosts or --emulated, not both", field="hosts")
            from dlsim.validate.emulated_cluster import EmulatedCluster
            cluster = stack.enter_context(EmulatedCluster(hosts=emulated, rate=rate, burst=burst, queue=queue,
                                                          prefix="dlsimc", tcp_congestion=tcp_congestion))
            host_set = emulated_hosts(cluster)
        else:
            host_set = hosts if isinstance(hosts, Hosts) else parse_hosts(hosts)
        if host_set.remote and ranks > len(host_set.addresses):
            raise SpecError(f"{ranks} ranks but only {len(host_set.addresses)} hosts (one rank per host)", field="ranks")
        plan = make_plan(backend, out, host_set, sizes=sizes, collectives=collectives, quick=quick,
                         budget_s=budget_s, max_reps=max_reps, idle_gap_s=idle_gap_s, idle_wait=idle_wait)
        items = launches(plan, algorithms)
        _check_backend_available(backend, ranks, host_set)
        out.mkdir(parents=True, exist_ok=True)
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        done = run_launches(items, ranks, host_set, out, quiet=quiet, timeout=timeout)
    label = "nccl" if backend == "nccl" else backend
    fits = fit_tables(out, label, host_set.label) if ranks >= 2 else {}
    info = system_info(backend)
    run = {"date": started, "command": command or " ".join(sys.argv), "backend": backend, "ranks": ranks,
           "hosts": host_set.label, "launches": done, "quick": quick,
           "plan": {"collective_sizes": list(plan.collective_sizes), "collectives": list(plan.collectives),
                    "forced_allreduce": list(algorithms), "budget_s": plan.budget_s, "max_reps": plan.max_reps,
                    "idle_gap_s": plan.idle_gap_s, "idle_wait": plan.idle_wait}}
    extra = {"machine": info, "fits": {f"{label}@{host_set.label}": fits},
             "method": "one-way time = median RTT/2 of ping-pong; PRTT(1,0,s), PRTT(n,0,s), PRTT(n,d,s) as Netgauge; "
                       "a collective repetition = max(end) - max(start) over ranks after a barrier; median kept"
                       + (f"; every rank idle ({plan.idle_wait}) {plan.idle_gap_s!r} s before each collective repetition's barrier "
                          "(idle_gap_s)" if plan.idle_gap_s else ""),
             "openmpi_allreduce_settings": OPENMPI_ALLREDUCE}
    if host_set.description:
        extra["hosts"] = {host_set.label: host_set.description}
    _update_meta(out, run, extra)
    changes = _write_profile(out, lambda: profile_text(out.name, fits, info, ranks, host_set, quick_gemm_flops(),
                                                       started, backend), fits.get("burst")) if fits else \
        ["profile.yaml: not written (one rank: no link to fit)"]
    return {"kind": "calibrate-comm", "out": str(out), "backend": backend, "ranks": ranks, "hosts": host_set.label,
            "launches": done, "fits": fits, "profile": changes}


def refit_burst(out: str | Path, backend: str = "mpi", hosts: str | None = None) -> dict[str, Any]:
    """Fit the token bucket (`comm_fit.fit_burst`) to the ping-pong rows already in `out` and add it
    to its profile's network tier if absent (`add_burst`); records the fit in meta.yaml."""
    out = Path(out)
    rows = [r for r in read_rows(out / P2P_TABLE) if r["backend"] == backend and r["kind"] == "pingpong"]
    labels = sorted({r["hosts"] for r in rows})
    if hosts is None and len(labels) != 1:
        raise SpecError(f"ping-pong rows for {len(labels)} host sets; give hosts", path=out / P2P_TABLE)
    hosts = hosts or labels[0]
    fits = fit_tables(out, backend, hosts)
    burst = fits.get("burst")
    changes = add_burst(out / "profile.yaml", burst) if (out / "profile.yaml").exists() else []
    meta = read_yaml(out / "meta.yaml") if (out / "meta.yaml").exists() else {}
    known = dict(((meta or {}).get("comm", {}).get("fits", {}) or {}).get(f"{backend}@{hosts}", {}))
    known["burst"] = burst
    run = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "refit": "burst", "burst": burst}
    _update_meta(out, run, {"fits": {**((meta or {}).get("comm", {}).get("fits", {}) or {}),
                                     f"{backend}@{hosts}": known}})
    return {"burst": burst, "profile": changes}


def import_nccl_tests(out: str | Path, files: Sequence[str | Path], *, collective: str | None = None,
                      hosts: str = "nccl-tests") -> dict[str, Any]:
    """Add nccl-tests result tables to `out`/comm_collectives.csv (rows already there are kept)."""
    out = Path(out)
    if collective is not None and collective not in COLLECTIVES:
        raise SpecError(f"unknown collective {collective!r} (use {', '.join(COLLECTIVES)})", field="collective")
    parsed = []
    for f in files:
        path = Path(f)
        if not path.is_file():
            raise SpecError("no such file", path=path)
        table = parse_nccl_tests(path.read_text(errors="replace"), str(path))
        name = collective or table.collective or collective_from_name(path.name)
        parsed.append((path, import_rows(table, path.name, hosts, name)))
    out.mkdir(parents=True, exist_ok=True)
    store = TableFile(out / COLLECTIVE_TABLE, COLLECTIVE_COLUMNS, collective_key)
    added = kept = 0
    for _, rows in parsed:
        for row in rows:
            if store.has(row):
                kept += 1
                continue
            store.append(row)
            added += 1
    run = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "imported": [str(p) for p, _ in parsed], "rows_added": added, "rows_already_there": kept}
    _update_meta(out, run, {})
    changes = add_tables(out / "profile.yaml", {"comm_collectives": COLLECTIVE_TABLE}) \
        if (out / "profile.yaml").exists() else ["profile.yaml: none here (tables only)"]
    return {"kind": "import-nccl-tests", "out": str(out), "files": [str(p) for p, _ in parsed], "rows_added": added,
            "rows_already_there": kept, "profile": changes}


__all__ = ["calibrate_comm", "refit_burst", "import_nccl_tests", "parse_hosts", "emulated_hosts", "size_range", "make_plan"]
