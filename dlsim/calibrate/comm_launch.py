"""Starting the measuring processes: mpirun (local or over hosts) and torch.distributed gloo ranks.

`Hosts` describes where ranks run: nothing (this machine, shared memory allowed) or one entry per
host with the command prefix that executes a program there (``ip netns exec dlsimc1`` for an
emulated host, ``ssh node1`` for a real one) and its address. For MPI over such hosts, mpirun runs
on host 0 and starts its daemons on the others through a small agent script that Open MPI calls
instead of ssh (`--mca plm_rsh_agent`); MPI traffic is restricted to TCP on the hosts' subnet
(`btl tcp,self`), so every byte between ranks crosses the (emulated) network. Open MPI's hwloc
run-time-control component is disabled on such launches (`rtc ^hwloc`): with several daemons
started at once inside namespaces its shared-memory topology export crashed orted (seen here).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from dlsim.errors import DlsimError


class LaunchError(DlsimError):
    """The measuring processes could not be started or failed."""


@dataclass(frozen=True)
class Hosts:
    """One rank per host: `prefixes[i]` runs a command on host i, reachable at `addresses[i]`."""

    label: str = "local"
    prefixes: tuple[tuple[str, ...], ...] = ()
    addresses: tuple[str, ...] = ()
    subnet: str = ""
    interfaces: tuple[str, ...] = ()
    description: dict = field(default_factory=dict)

    @property
    def remote(self) -> bool:
        return bool(self.prefixes)


def _python() -> list[str]:
    return [sys.executable]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2])] +
                                        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[key] = "1"
    return env


def mpirun_command(ranks: int, hosts: Hosts, workdir: Path, mca: Mapping[str, str]) -> list[str]:
    """The mpirun command line (without the program) for `ranks` ranks on `hosts`."""
    exe = shutil.which("mpirun")
    if exe is None:
        raise LaunchError("mpirun not found: install Open MPI (apt-get install -y openmpi-bin libopenmpi-dev) "
                          "and mpi4py (pip install mpi4py)")
    cmd = [exe, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), "--bind-to", "none"]
    if hosts.remote:
        if ranks > len(hosts.addresses):
            raise LaunchError(f"{ranks} ranks but only {len(hosts.addresses)} hosts")
        hostfile = workdir / "hostfile"
        hostfile.write_text("".join(f"{a} slots=1\n" for a in hosts.addresses[:ranks]))
        agent = workdir / "agent.sh"
        cases = "".join(f"  {shlex.quote(a)}) exec {' '.join(shlex.quote(x) for x in p)} /bin/sh -c \"$*\" ;;\n"
                        for a, p in zip(hosts.addresses, hosts.prefixes))
        agent.write_text("#!/bin/sh\n# Open MPI calls: agent [options] HOST COMMAND...\n"
                         "while [ $# -gt 0 ]; do case \"$1\" in -*) shift;; *) break;; esac; done\n"
                         "host=\"$1\"; shift\ncase \"$host\" in\n" + cases +
                         "  *) echo \"unknown host $host\" >&2; exit 1 ;;\nesac\n")
        agent.chmod(0o755)
        cmd = list(hosts.prefixes[0]) + cmd + ["--hostfile", str(hostfile), "--mca", "plm_rsh_agent", str(agent),
                                               "--mca", "btl", "tcp,self", "--mca", "rtc", "^hwloc"]
        if hosts.subnet:
            cmd += ["--mca", "btl_tcp_if_include", hosts.subnet, "--mca", "oob_tcp_if_include", hosts.subnet]
        env = _env()
        for var in ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            if var in env:  # mpirun warns about each variable it is told to export and cannot find
                cmd += ["-x", var]
    for key, value in mca.items():
        cmd += ["--mca", key, str(value)]
    return cmd


def run_mpi(plan_path: Path, ranks: int, hosts: Hosts, mca: Mapping[str, str], *, quiet: bool = False,
            timeout: float | None = None) -> None:
    """Run the MPI worker on `ranks` ranks; its progress lines go to stderr."""
    with tempfile.TemporaryDirectory(prefix="dlsim-mpi-") as tmp:
        cmd = mpirun_command(ranks, hosts, Path(tmp), mca) + _python() + \
            ["-m", "dlsim.calibrate.comm_worker_mpi", str(plan_path)] + (["--quiet"] if quiet else [])
        _wait([subprocess.Popen(cmd, env=_env())], timeout, "mpirun")


def run_gloo(plan_path: Path, ranks: int, hosts: Hosts, *, port: int = 29533, quiet: bool = False,
             timeout: float | None = None) -> None:
    """Start `ranks` torch.distributed (gloo) processes, on `hosts` when given."""
    if hosts.remote and ranks > len(hosts.addresses):
        raise LaunchError(f"{ranks} ranks but only {len(hosts.addresses)} hosts")
    master = hosts.addresses[0] if hosts.remote else "127.0.0.1"
    procs = []
    for r in range(ranks):
        env = _env()
        env.update({"MASTER_ADDR": master, "MASTER_PORT": str(port), "RANK": str(r), "WORLD_SIZE": str(ranks)})
        if hosts.remote and hosts.interfaces:
            env["GLOO_SOCKET_IFNAME"] = hosts.interfaces[r]
        prefix = list(hosts.prefixes[r]) if hosts.remote else []
        cmd = prefix + ["env", *[f"{k}={env[k]}" for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                                                          "PYTHONPATH", "OMP_NUM_THREADS")
                                  + (("GLOO_SOCKET_IFNAME",) if "GLOO_SOCKET_IFNAME" in env else ())]]
        cmd += _python() + ["-m", "dlsim.calibrate.comm_worker_gloo", str(plan_path)]
        cmd += ["--quiet"] if quiet or r else []
        procs.append(subprocess.Popen(cmd, env=env))
    _wait(procs, timeout, "gloo ranks")


def _wait(procs: Sequence[subprocess.Popen], timeout: float | None, what: str) -> None:
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    except BaseException:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        raise
    if any(codes):
        raise LaunchError(f"{what} failed (exit codes {codes}); rerun the same command to resume")
