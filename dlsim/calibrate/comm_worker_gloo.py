"""The torch.distributed side of `dlsim calibrate comm --backend gloo` (or nccl on GPUs): one process
per rank, started by `comm_launch.run_gloo` with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE.

    python -m dlsim.calibrate.comm_worker_gloo PLAN.json [--quiet]

torch is imported here only. Tensors are float32 on the CPU (gloo) or on the local GPU (nccl).
A collective the backend does not implement is skipped with a note on stderr.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from dlsim.calibrate.comm_measure import Measurer
from dlsim.calibrate.comm_plan import worker_arguments


class TorchTransport:
    def __init__(self, backend: str) -> None:
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        torch.set_num_threads(1)
        dist.init_process_group(backend)
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", self.rank)) % max(1, torch.cuda.device_count())) \
            if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(self.device)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        self.dist.barrier()

    def quiet_barrier(self) -> None:
        self.dist.barrier()

    def bcast(self, obj: object) -> object:
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: float) -> list[float] | None:
        out = [None] * self.size if self.rank == 0 else None
        self.dist.gather_object(value, out, dst=0)
        return out

    def buffer(self, nbytes: int):
        return self.torch.zeros(max(int(nbytes), 1), dtype=self.torch.uint8, device=self.device)

    def send(self, buf, dst: int) -> None:
        self.dist.send(buf, dst)
        self._sync()

    def recv(self, buf, src: int) -> None:
        self.dist.recv(buf, src)
        self._sync()

    def send_int(self, value: int, dst: int) -> None:
        self.dist.send(self.torch.tensor([int(value)], dtype=self.torch.int64, device=self.device), dst)

    def recv_int(self, src: int) -> int:
        box = self.torch.zeros(1, dtype=self.torch.int64, device=self.device)
        self.dist.recv(box, src)
        return int(box.item())

    def isend(self, buf, dst: int):
        return self.dist.isend(buf, dst)

    def irecv(self, buf, src: int):
        return self.dist.irecv(buf, src)

    def waitall(self, requests: list) -> None:
        for r in requests:
            r.wait()
        self._sync()

    def collective(self, name: str, nbytes: int) -> Callable[[], None]:
        torch, dist, p = self.torch, self.dist, self.size
        count = nbytes // 4
        a = torch.ones(count, dtype=torch.float32, device=self.device)

        def synced(fn: Callable[[], object]) -> Callable[[], None]:
            def run() -> None:
                fn()
                self._sync()
            return run
        if name == "allreduce":
            return synced(lambda: dist.all_reduce(a))
        if name == "reduce-scatter":
            b = torch.empty(count // p, dtype=torch.float32, device=self.device)
            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            return synced(lambda: scatter(b, a))
        if name == "allgather":
            part = torch.ones(count // p, dtype=torch.float32, device=self.device)
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            return synced(lambda: gather(a, part))
        if name == "broadcast":
            return synced(lambda: dist.broadcast(a, 0))
        if name == "reduce":
            return synced(lambda: dist.reduce(a, 0))
        if name == "all-to-all":
            b = torch.empty_like(a)
            return synced(lambda: dist.all_to_all_single(b, a))
        raise ValueError(name)


def supported(t: TorchTransport, name: str) -> bool:
    """Whether the backend implements `name` (tried once on a tiny buffer)."""
    try:
        t.collective(name, 16 * t.size)()
        return True
    except (RuntimeError, NotImplementedError, ValueError) as exc:
        if t.rank == 0:
            print(f"skipping {name}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return False


def main(argv: list[str] | None = None) -> None:
    plan, quiet = worker_arguments(argv, __doc__)
    backend = "nccl" if plan.backend == "nccl" else "gloo"
    t = TorchTransport(backend)
    keep = tuple(c for c in plan.collectives if supported(t, c))
    from dataclasses import replace
    Measurer(t, replace(plan, collectives=keep), backend, quiet=quiet).run()
    t.barrier()
    t.dist.destroy_process_group()


if __name__ == "__main__":
    main()
