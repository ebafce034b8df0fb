"""An emulated cluster on one machine: network namespaces joined by a bridge, rate-limited with tc.

Each emulated host is a network namespace with one veth pair into a Linux bridge (the switch). Its
link is limited to `rate` in both directions by a token-bucket filter (`tc qdisc ... tbf`) on both
ends of the veth pair, so a host sends and receives at most `rate` at once (full duplex, one port),
the network the collective models assume; the bridge itself does not limit. netem is not used
(it is not available on these machines), so latency is whatever the kernel and the stack add.

Traffic stays between the namespaces made here: the bridge has no address in the root namespace
and nothing routes out. Tear-down is guaranteed: the context manager removes every namespace and
the bridge on exit, exceptions and Ctrl-C/SIGTERM included; a crashed run's leftovers (found by
name prefix, with a pid file saying whose they are) are removed by the next run or by `teardown()`.

Needs root and iproute2 (`ip`, `tc`). Usage::

    with EmulatedCluster(hosts=4, rate="200Mbit") as cluster:
        subprocess.run(cluster.exec_prefix(0) + ["hostname", "-I"])
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from dlsim.errors import DlsimError

RUN_DIR = Path("/run") if Path("/run").is_dir() else Path("/tmp")


class EmulationError(DlsimError):
    """The emulated cluster cannot be built (no root, no iproute2, a name clash)."""


def _run(args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise EmulationError(f"{' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class EmulatedCluster:
    """`hosts` namespaces named `{prefix}{i}` with addresses `{subnet}.{10+i}`, each limited to `rate`.

    `rate` is a tc rate ("200mbit", "1gbit"); `burst` the token bucket depth; `queue` the most
    queueing delay tbf allows before dropping; `mtu` the veth/bridge MTU; `tcp_congestion` the TCP
    congestion control of every emulated host (a per-namespace sysctl; None keeps the kernel's).
    """

    hosts: int = 4
    rate: str = "200mbit"
    prefix: str = "dlsimc"
    subnet: str = "10.231.77"
    burst: str = "64kb"
    queue: str = "100ms"
    mtu: int = 1500
    tcp_congestion: str | None = None
    _up: bool = field(default=False, init=False)
    _old_handlers: dict = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.hosts <= 64:
            raise EmulationError(f"hosts must be between 1 and 64, got {self.hosts}")
        if len(self.prefix) > 8 or not self.prefix.isalnum():
            raise EmulationError(f"prefix must be at most 8 letters or digits, got {self.prefix!r}")

    # names -----------------------------------------------------------------------------------
    def namespace(self, i: int) -> str:
        return f"{self.prefix}{i}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"

    def interface(self, i: int) -> str:
        """The interface name inside host i's namespace."""
        return f"{self.prefix}p{i}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def pid_file(self) -> Path:
        return RUN_DIR / f"dlsim-emulated-{self.prefix}.pid"

    def exec_prefix(self, i: int) -> list[str]:
        """Command prefix that runs a program inside host i."""
        return ["ip", "netns", "exec", self.namespace(i)]

    def describe(self) -> dict[str, object]:
        return {"hosts": self.hosts, "rate": self.rate, "burst": self.burst, "queue": self.queue, "mtu": self.mtu,
                "tcp_congestion": self.tcp_congestion or "kernel default",
                "namespaces": [self.namespace(i) for i in range(self.hosts)],
                "addresses": [self.address(i) for i in range(self.hosts)], "bridge": self.bridge,
                "qdisc": "tbf on both ends of every veth pair", "kernel": os.uname().release}

    # life cycle ------------------------------------------------------------------------------
    def __enter__(self) -> "EmulatedCluster":
        self.setup()
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def setup(self) -> None:
        """Build the namespaces, the bridge, the veth pairs and the rate limits."""
        if os.geteuid() != 0:
            raise EmulationError("an emulated cluster needs root (network namespaces, tc)")
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise EmulationError(f"{tool!r} (iproute2) is not installed")
        self._claim()
        self._trap_signals()
        self._up = True
        try:
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "link", "set", self.bridge, "mtu", str(self.mtu), "up"])
            for i in range(self.hosts):
                self._add_host(i)
        except BaseException:
            self.teardown()
            raise

    def _add_host(self, i: int) -> None:
        ns, outside, inside = self.namespace(i), f"{self.prefix}v{i}", self.interface(i)
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", outside, "mtu", str(self.mtu), "type", "veth", "peer", "name", inside,
              "mtu", str(self.mtu)])
        _run(["ip", "link", "set", inside, "netns", ns])
        _run(["ip", "link", "set", outside, "master", self.bridge, "up"])
        _run(["ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.address(i)}/24", "dev", inside])
        _run(["ip", "netns", "exec", ns, "ip", "link", "set", inside, "up"])
        _run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"])
        if self.tcp_congestion:
            _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"net.ipv4.tcp_congestion_control={self.tcp_congestion}"])
        limit = ["tbf", "rate", self.rate, "burst", self.burst, "latency", self.queue]
        _run(["tc", "qdisc", "add", "dev", outside, "root", *limit])                       # into host i
        _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", inside, "root", *limit])  # out of host i

    def teardown(self) -> None:
        """Remove everything with this prefix (idempotent, also after a crash)."""
        for name in _run(["ip", "netns", "list"], check=False).stdout.split("\n"):
            ns = name.split(" ")[0].strip()
            if ns.startswith(self.prefix) and ns[len(self.prefix):].isdigit():
                _run(["ip", "netns", "delete", ns], check=False)
        links = _run(["ip", "-o", "link", "show"], check=False).stdout
        for line in links.splitlines():
            parts = line.split(":")
            if len(parts) > 1:
                name = parts[1].strip().split("@")[0]
                if name.startswith(self.prefix) and (name == self.bridge or name[len(self.prefix):][:1] in "vp"):
                    _run(["ip", "link", "delete", name], check=False)
        if self._up:
            self.pid_file.unlink(missing_ok=True)
            self._restore_signals()
            self._up = False

    def leftovers(self) -> list[str]:
        """Namespaces and links with this prefix that still exist (empty after a clean tear-down)."""
        names = [n.split(" ")[0] for n in _run(["ip", "netns", "list"], check=False).stdout.split("\n") if n]
        links = [line.split(":")[1].strip().split("@")[0]
                 for line in _run(["ip", "-o", "link", "show"], check=False).stdout.splitlines() if ":" in line]
        return [n for n in names + links if n.startswith(self.prefix)]

    # ownership and signals -------------------------------------------------------------------
    def _claim(self) -> None:
        if self.pid_file.exists():
            try:
                owner = int(self.pid_file.read_text().strip() or 0)
            except ValueError:
                owner = 0
            if owner and owner != os.getpid() and _pid_alive(owner):
                raise EmulationError(f"an emulated cluster with prefix {self.prefix!r} is in use by pid {owner}")
        self.teardown()                          # a crashed run's leftovers
        self.pid_file.write_text(str(os.getpid()))

    def _trap_signals(self) -> None:
        def handler(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._old_handlers[sig] = signal.signal(sig, handler)
            except ValueError:                   # not the main thread: rely on the context manager
                pass

    def _restore_signals(self) -> None:
        for sig, old in self._old_handlers.items():
            try:
                signal.signal(sig, old)
            except ValueError:
                pass
        self._old_handlers.clear()
