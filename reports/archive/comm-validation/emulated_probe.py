"""Plumbing shared by the probes that run a script of their own under mpirun on the emulated cluster.

`add_cluster_options` adds the cluster's shape (rate, tbf burst and queue, TCP congestion control),
`emulated_cluster` builds the 4-host cluster the validation uses (prefix dlsimc) from them, and
`mpirun_script` runs `script` with `argv` on `ranks` of its hosts with the given Open MPI parameters, and
`one_line_errors` runs a probe's main so that a dlsim error ends with one line and exit code 1.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Sequence


def one_line_errors(main: Callable[[], None]) -> None:
    """Run `main`; a `DlsimError` (bad profile, no root, a failed launch) ends with one line and exit code 1,
    and so does a bad option (argparse's usage error, which would exit with 2)."""
    from dlsim.errors import DlsimError
    try:
        main()
    except DlsimError as e:
        sys.exit(f"error: {e}")
    except SystemExit as e:
        raise SystemExit(1 if e.code == 2 else e.code) from None


def add_cluster_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rate", default="200mbit")
    ap.add_argument("--burst", default="3kb")
    ap.add_argument("--queue", default="400ms")
    ap.add_argument("--tcp", default="reno")


def emulated_cluster(args: argparse.Namespace):
    from dlsim.validate.emulated_cluster import EmulatedCluster
    return EmulatedCluster(hosts=4, rate=args.rate, prefix="dlsimc", burst=args.burst, queue=args.queue,
                           tcp_congestion=args.tcp)


def mpirun_script(cluster, ranks: int, mca: Mapping[str, str], script: str, argv: Sequence[str],
                  timeout: float = 600) -> None:
    from dlsim.api.calibrate_comm import emulated_hosts
    from dlsim.calibrate.comm_launch import _env, _wait, mpirun_command
    with tempfile.TemporaryDirectory(prefix="dlsim-probe-") as tmp:
        cmd = mpirun_command(ranks, emulated_hosts(cluster), Path(tmp), mca) + \
            [sys.executable, str(Path(script).resolve()), *argv]
        _wait([subprocess.Popen(cmd, env=_env())], timeout, "mpirun")
