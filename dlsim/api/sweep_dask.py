"""The Dask backend of `dlsim.api.sweep`: the only module that imports dask, and only when called.

`run_dask` sends batches of points to an existing Dask distributed scheduler (``tcp://host:port``)
or to a `LocalCluster` of N worker processes it starts on the loopback (one thread each), keeps a
bounded number of batches in flight and hands each finished batch to `done` as it completes. The
workers need dlsim installed (the same version) to unpickle the points and run them.

Nothing is lost when the cluster misbehaves (issue 29). A worker that dies mid-batch: the scheduler
runs its batches again elsewhere. A scheduler that restarts: the client reconnects, every batch in
flight is cancelled (``scheduler-connection-lost``), and `run_dask` waits for the new scheduler to
have workers again and submits those batches anew. A batch whose worker died `allowed-failures`
times (``KilledWorker``): split into single points, and a point that still kills its worker is
recorded by `fail` (a record saying so) instead of being tried forever. A batch may thus run twice
(its first result lost with the scheduler); `done` keeps the first record of each point. When no
worker comes back within `wait_s`, one `DaskError` line: the points finished so far are already
saved, and running the sweep again resumes.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from dlsim.errors import DlsimError


class DaskError(DlsimError):
    """Dask is missing, or its scheduler cannot be reached."""


MAX_RESUBMITS = 5
"""Times one batch is submitted again after its scheduler was lost before the sweep gives up."""


def _wait_for_workers(client: Any, wait_s: float, why: str) -> None:
    """Return once the client is connected to a scheduler that has a worker; `DaskError` after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if client.status == "running" and client.scheduler_info(n_workers=-1).get("workers"):
                return
        except Exception:  # noqa: BLE001  (still reconnecting: any comm error means "not yet")
            pass
        time.sleep(0.2)
    raise DaskError(f"{why}, and no Dask worker was back within {wait_s:g} s; the points finished so far are "
                    "saved: run the same command again to resume")


def run_dask(chunks: Iterable[list[Any]], work: Callable[..., list[dict[str, Any]]], model_only: bool,
             done: Callable[[list[dict[str, Any]]], None], *, scheduler: str | None = None,
             local_workers: int | None = None, connect_timeout_s: float = 20.0,
             fail: Callable[[list[Any], str], list[dict[str, Any]]] | None = None,
             wait_s: float = 120.0) -> dict[str, int]:
    """Run `work(chunk, model_only)` for every chunk on Dask; `done(records)` as each finishes (see the
    module docstring for what happens when workers or the scheduler are lost). Returns how many
    batches were submitted again after a lost scheduler (``resubmitted``) and split after killing
    their workers (``split``)."""
    try:
        from dask.distributed import Client, LocalCluster, as_completed
        from distributed.client import FutureCancelledError
        from distributed.scheduler import KilledWorker
    except ImportError:
        raise DaskError("Dask is not installed: pip install 'dlsim[cluster]' (dask[distributed])") from None
    cluster = None
    counts = {"resubmitted": 0, "split": 0}
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
            batches: dict[Any, tuple[list[Any], int]] = {}

            def submit(chunk: list[Any], tries: int = 0) -> None:
                fut = client.submit(work, chunk, model_only, pure=False)
                batches[fut] = (chunk, tries)
                pending.add(fut)

            for _ in range(4 * slots):
                chunk = next(it, None)
                if chunk is None:
                    break
                submit(chunk)
            for fut in pending:
                chunk, tries = batches.pop(fut)
                try:
                    records = fut.result()
                except FutureCancelledError as exc:  # the scheduler was lost: submit again once it is back
                    if tries >= MAX_RESUBMITS:
                        raise DaskError(f"a batch of {len(chunk)} points was lost {tries + 1} times "
                                        f"({exc.reason}); the points finished so far are saved: run the same "
                                        "command again to resume") from None
                    _wait_for_workers(client, wait_s, f"the Dask scheduler was lost ({exc.reason})")
                    submit(chunk, tries + 1)
                    counts["resubmitted"] += 1
                    continue
                except KilledWorker as exc:
                    if len(chunk) > 1:
                        counts["split"] += 1
                        for point in chunk:
                            submit([point], tries)
                        continue
                    if fail is None:
                        raise DaskError(f"a point killed every Dask worker that ran it ({exc})"[:250]) from None
                    records = fail(chunk, "killed every Dask worker that ran it (allowed-failures times)")
                except Exception as exc:  # noqa: BLE001  (the worker could not run dlsim at all)
                    raise DaskError(f"a Dask worker failed ({type(exc).__name__}: {exc}); is the same dlsim "
                                    "installed on the workers?"[:250]) from None
                fut.release()
                done(records)
                chunk = next(it, None)
                if chunk is not None:
                    submit(chunk)
        finally:
            client.close()
    finally:
        if cluster is not None:
            cluster.close()
    return counts
