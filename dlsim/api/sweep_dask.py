"""The Dask backend of `dlsim.api.sweep`: the only module that imports dask, and only when called.

`run_dask` sends batches of points to an existing Dask distributed scheduler (``tcp://host:port``)
or to a `LocalCluster` of N worker processes it starts on the loopback (one thread each), keeps a
bounded number of batches in flight and hands each finished batch to `done` as it completes. The
workers need dlsim installed (the same version) to unpickle the points and run them.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from dlsim.errors import DlsimError


class DaskError(DlsimError):
    """Dask is missing, or its scheduler cannot be reached."""


def run_dask(chunks: Iterable[list[Any]], work: Callable[..., list[dict[str, Any]]], model_only: bool,
             done: Callable[[list[dict[str, Any]]], None], *, scheduler: str | None = None,
             local_workers: int | None = None, connect_timeout_s: float = 20.0) -> None:
    """Run `work(chunk, model_only)` for every chunk on Dask; `done(records)` as each finishes."""
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise DaskError("Dask is not installed: pip install 'dlsim[cluster]' (dask[distributed])") from None
    cluster = None
    try:
        if scheduler:
            try:
                client = Client(scheduler, timeout=f"{connect_timeout_s}s")
            except (OSError, TimeoutError) as exc:
                raise DaskError(f"cannot reach the Dask scheduler {scheduler} ({exc})"[:250]) from None
            slots = max(1, sum(client.nthreads().values()))
        else:
            cluster = LocalCluster(n_workers=local_workers, threads_per_worker=1, processes=True,
                                   host="127.0.0.1", dashboard_address=None)
            client = Client(cluster)
            slots = int(local_workers or 1)
        try:
            it = iter(chunks)
            pending = as_completed()
            inflight = 0
            for _ in range(4 * slots):
                chunk = next(it, None)
                if chunk is None:
                    break
                pending.add(client.submit(work, chunk, model_only, pure=False))
                inflight += 1
            for fut in pending:
                records = fut.result()
                fut.release()
                done(records)
                chunk = next(it, None)
                if chunk is not None:
                    pending.add(client.submit(work, chunk, model_only, pure=False))
        finally:
            client.close()
    finally:
        if cluster is not None:
            cluster.close()
