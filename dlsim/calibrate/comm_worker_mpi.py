"""The MPI side of `dlsim calibrate comm`: run under mpirun, one process per rank.

    mpirun -np N python -m dlsim.calibrate.comm_worker_mpi PLAN.json [--quiet]

mpi4py is imported here only (never when dlsim is imported). Buffers are NumPy float32 arrays;
collectives are the plain MPI calls (out of place), so whichever algorithm the MPI library picks,
or the one forced through its parameters, is what gets timed.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from dlsim.calibrate.comm_measure import Measurer
from dlsim.calibrate.comm_plan import worker_arguments


class MpiTransport:
    def __init__(self) -> None:
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def barrier(self) -> None:
        self.comm.Barrier()

    def quiet_barrier(self) -> None:
        """A barrier that sleeps while it waits instead of spinning (ranks share few cores)."""
        request = self.comm.Ibarrier()
        while not request.Test():
            time.sleep(2e-4)

    def bcast(self, obj: object) -> object:
        return self.comm.bcast(obj, root=0)

    def gather(self, value: float) -> list[float] | None:
        return self.comm.gather(value, root=0)

    def buffer(self, nbytes: int) -> np.ndarray:
        return np.zeros(max(int(nbytes), 1), dtype=np.uint8)

    def send(self, buf, dst: int) -> None:
        self.comm.Send(buf, dest=dst, tag=7)

    def recv(self, buf, src: int) -> None:
        self.comm.Recv(buf, source=src, tag=7)

    def send_int(self, value: int, dst: int) -> None:
        self.comm.send(int(value), dest=dst, tag=9)

    def recv_int(self, src: int) -> int:
        return int(self.comm.recv(source=src, tag=9))

    def isend(self, buf, dst: int):
        return self.comm.Isend(buf, dest=dst, tag=8)

    def irecv(self, buf, src: int):
        return self.comm.Irecv(buf, source=src, tag=8)

    def waitall(self, requests: list) -> None:
        self.MPI.Request.Waitall(requests)

    def collective(self, name: str, nbytes: int) -> Callable[[], None]:
        MPI, comm, p = self.MPI, self.comm, self.size
        count = nbytes // 4
        a = np.ones(count, dtype=np.float32)
        if name == "allreduce":
            b = np.empty_like(a)
            return lambda: comm.Allreduce(a, b, op=MPI.SUM)
        if name == "reduce-scatter":
            b = np.empty(count // p, dtype=np.float32)
            return lambda: comm.Reduce_scatter_block(a, b, op=MPI.SUM)
        if name == "allgather":
            part = np.ones(count // p, dtype=np.float32)
            return lambda: comm.Allgather(part, a)
        if name == "broadcast":
            return lambda: comm.Bcast(a, root=0)
        if name == "reduce":
            b = np.empty_like(a)
            return lambda: comm.Reduce(a, b, op=MPI.SUM, root=0)
        if name == "all-to-all":
            b = np.empty_like(a)
            return lambda: comm.Alltoall(a, b)
        raise ValueError(name)


def main(argv: list[str] | None = None) -> None:
    plan, quiet = worker_arguments(argv, __doc__)
    t = MpiTransport()
    Measurer(t, plan, "mpi", quiet=quiet).run()
    t.barrier()


if __name__ == "__main__":
    main()
