"""One rank of a 2-host measurement on the emulated cluster (run as ``python -m dlsim.validate.ddp_worker``).

Two jobs, chosen by ``--job``:

* ``link``: a gloo ping-pong between ranks 0 and 1 (rank 0 ``send``s n bytes, rank 1 ``recv``s and
  sends them back) for each size; the one-way time of a size is half the median round trip. The
  α-β (Hockney) fit of these times gives the link's latency and bandwidth (`dlsim.validate.ddp_run`).
  The same sizes are then all-reduced with ``dist.all_reduce`` (what DDP runs) for comparison.
* ``train``: data-parallel training with ``torch.nn.parallel.DistributedDataParallel`` over gloo:
  the dlsim model built in PyTorch (`dlsim.validate.torch_model`), each rank its own `batch`
  samples, one intra-op thread per rank (``torch.set_num_threads``), the same optimizer the
  calibration times (`dlsim.calibrate.compute_ops.make_optimizer`), the C allocator in the
  state calibration uses. An iteration is ``zero_grad``, forward, ``backward`` (DDP
  all-reduces gradient buckets during it) and ``step``; ranks meet at a barrier before each, and the
  iteration time is rank 0's wall time from the barrier to the end of the step. The model, the
  optimizer factory and the allocator set-up come pickled from the launcher (``--inputs``: a model factory, the optimizer factory, the set-up).

Rank 0 writes one JSON record to ``--out``. The rendezvous is ``env://`` (MASTER_ADDR, MASTER_PORT,
RANK, WORLD_SIZE set by the launcher). torch is imported inside `main` only.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import time
from typing import Any


def _link(dist: Any, torch: Any, sizes: list[int], repeats: int) -> dict[str, Any]:
    rank = dist.get_rank()
    rows = []
    for n in sizes:
        buf = torch.zeros(max(n // 4, 1), dtype=torch.float32)
        times = []
        for i in range(repeats + 2):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if i >= 2:
                times.append((time.perf_counter() - t0) / 2)
        ar = []
        for i in range(repeats + 2):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            if i >= 2:
                ar.append(time.perf_counter() - t0)
        rows.append({"bytes": buf.numel() * 4, "one_way_s": statistics.median(times), "one_way_min_s": min(times),
                     "allreduce_s": statistics.median(ar), "allreduce_min_s": min(ar)})
    return {"job": "link", "rows": rows}


def _train(dist: Any, torch: Any, args: argparse.Namespace) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    from dlsim.validate.torch_model import build_torch_model, example_batch

    with open(args.inputs, "rb") as handle:  # written by run_ranks: model, make_optimizer, prepare
        inputs = pickle.load(handle)
    model, make_optimizer = inputs["model"](), inputs["make_optimizer"]
    inputs["prepare"]()
    torch.manual_seed(0)
    net = build_torch_model(model).train()
    ddp = DistributedDataParallel(net, bucket_cap_mb=args.bucket_mib)
    x, target = example_batch(model, args.batch, seed=dist.get_rank())
    opt, impl = make_optimizer(args.optimizer, ddp.parameters())
    samples = []
    for i in range(args.warmup + args.repeats):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = ddp(x, target)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if i >= args.warmup:
            samples.append((t1 - t0, t2 - t1, t3 - t2))
    params = sum(p.numel() for p in net.parameters())
    return {"job": "train", "model": model.name, "batch_per_rank": args.batch, "optimizer": args.optimizer,
            "optimizer_impl": impl, "threads": torch.get_num_threads(), "parameters": params,
            "bucket_mib": args.bucket_mib, "samples_s": samples}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", choices=("link", "train"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default="")
    ap.add_argument("--inputs", default="", help="pickle of {model, make_optimizer, prepare} (train)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--bucket-mib", type=float, default=25.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method="env://")
    try:
        if args.job == "link":
            rec = _link(dist, torch, [int(s) for s in args.sizes.split(",")], args.repeats)
        else:
            rec = _train(dist, torch, args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if int(os.environ["RANK"]) == 0:
        with open(args.out, "w") as handle:
            json.dump(rec, handle)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
