"""Each communication backend calibrates end to end, small (issue 32 item 4): Open MPI (mpi4py) and
torch.distributed gloo, on this machine and on the emulated cluster (network namespaces joined by a
bridge, each host's link shaped by tc). Every run writes a profile whose link tier is finite and
loads, and `dlsim comm` on that profile prices a measured collective exactly as the simulator's
pricer does: from the measured table. About 10-25 s each (process start-up, torch import), so
they are slow tests: ``pytest -m slow tests/test_comm_backends.py``."""

from __future__ import annotations

import csv
import math
import os
import shutil

import pytest

from dlsim.api.calibrate_comm import calibrate_comm
from dlsim.api.comm import comm
from dlsim.io.profile_yaml import load_profile

pytestmark = pytest.mark.slow


def _needs(backend: str, emulated: bool) -> None:
    if backend == "mpi":
        pytest.importorskip("mpi4py")
        if shutil.which("mpirun") is None:
            pytest.skip("Open MPI's mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)")
    else:
        pytest.importorskip("torch.distributed")
    if emulated and (os.geteuid() != 0 or shutil.which("tc") is None or shutil.which("ip") is None):
        pytest.skip("the emulated cluster needs root, ip and tc")


@pytest.mark.parametrize("emulated", [False, True], ids=["local", "emulated"])
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_backend_calibrates_a_loadable_profile(tmp_path, backend, emulated):
    _needs(backend, emulated)
    out = tmp_path / f"{backend}-profile"
    rec = calibrate_comm(out, backend=backend, ranks=2, quick=True, quiet=True, algorithms=(),
                         collectives=("allreduce",), emulated=2 if emulated else None)
    cluster = load_profile(out)
    tier = cluster.inter if emulated else cluster.intra
    assert tier is not None and 0 < tier.bandwidth < math.inf and math.isfinite(tier.latency)
    assert rec["fits"]["hockney"]["beta"] > 0
    with open(out / "comm_collectives.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["collective"] == "allreduce" and r["ranks"] == "2"]
    assert rows
    row = min(rows, key=lambda r: float(r["size_bytes"]))
    (priced,) = comm("allreduce", float(row["size_bytes"]), 2, cluster=out).results
    assert priced.source == "measured" and priced.time_s == pytest.approx(float(row["median_s"]), rel=1e-12)
