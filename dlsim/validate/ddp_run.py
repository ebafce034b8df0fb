"""Running a 2-host measurement on the emulated cluster: one `dlsim.validate.ddp_worker` per host.

`run_ranks` starts one worker per emulated host (``ip netns exec``), rank 0 on host 0, whose
address is MASTER_ADDR; the job's inputs (the model, the optimizer factory, the allocator set-up)
travel as one pickle file, so the worker imports nothing above its layer; it returns rank 0's
JSON record.

"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from dlsim.errors import DlsimError
from dlsim.validate.emulated_cluster import EmulatedCluster

PORT = 29611


def run_ranks(cluster: EmulatedCluster, worker_args: Sequence[str], inputs: dict[str, Any] | None = None, *,
              timeout_s: float = 300.0, port: int = PORT) -> dict[str, Any]:
    """Run the worker on hosts 0 and 1 of `cluster` (with `inputs` pickled for it) and return rank 0's record."""
    with tempfile.TemporaryDirectory(prefix="dlsimd-") as tmp:
        out = Path(tmp) / "rank0.json"
        if inputs is not None:
            (Path(tmp) / "inputs.pkl").write_bytes(pickle.dumps(inputs))
            worker_args = [*worker_args, "--inputs", str(Path(tmp) / "inputs.pkl")]
        procs = []
        for rank in range(2):
            env = {**os.environ, "MASTER_ADDR": cluster.address(0), "MASTER_PORT": str(port), "RANK": str(rank),
                   "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
                   "GLOO_SOCKET_IFNAME": cluster.interface(rank)}  # else gloo binds to the hostname's address
            cmd = [*cluster.exec_prefix(rank), sys.executable, "-m", "dlsim.validate.ddp_worker", *worker_args,
                   "--out", str(out)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        errors = []
        for rank, p in enumerate(procs):
            try:
                _, err = p.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise DlsimError(f"rank {rank} did not finish in {timeout_s:.0f} s") from None
            if p.returncode != 0:
                errors.append(f"rank {rank} exited {p.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}")
        if errors:
            raise DlsimError("; ".join(errors))
        return json.loads(out.read_text())
