"""A sweep's results file (issue 29): one writer at a time, resumed only after every line is checked,
and a Dask sweep that loses a worker and its scheduler mid-run still records every point once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from dlsim.api.sweep import run_sweep
from dlsim.errors import SpecError
from dlsim.io.files import OutputError
from dlsim.io.results_log import ResultsLog
from dlsim.io.sweep_spec import parse_sweep

SMALL = {"models": ["lenet5", "gpt2"], "clusters": ["dgx-a100"], "gpus": [8, 16], "global_batch": 32,
         "grid": {"tp": [1, 2, 3], "pp": [1, 2], "microbatch_size": [1, 2]}}
TINY = {"models": ["lenet5"], "clusters": ["dgx-a100"], "gpus": [8], "global_batch": 32,
        "grid": {"tp": [1, 2], "pp": [1, 2], "microbatch_size": [1, 2]}}


def _ids(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def _spec_file(tmp_path, spec):
    import yaml
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _holder(out):
    """Another process that holds the results file's lock until killed."""
    code = ("import sys, time\nfrom dlsim.io.results_log import ResultsLog\nlog = ResultsLog(sys.argv[1]).open()\n"
            "print('held', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_first_and_a_dead_ones_lock_is_taken_over(tmp_path, cli):
    spec, out = _spec_file(tmp_path, TINY), tmp_path / "r.jsonl"
    holder = _holder(out)
    try:
        code, _, err = cli("sweep", spec, "--out", out, "--jobs", "1")
        assert code == 1 and f"process {holder.pid} on host" in err and len(err.splitlines()) == 1
        assert not out.read_text()  # nothing simulated, nothing written
    finally:
        holder.kill()
        holder.wait()
    assert ResultsLog.lock_path(out).exists()  # the killed holder's lock is left behind ...
    code, _, err = cli("sweep", spec, "--out", out, "--jobs", "1")
    assert code == 0, err  # ... and taken over: its process is gone from this host
    ids = _ids(out)
    assert len(ids) == len(set(ids)) == 8
    assert not ResultsLog.lock_path(out).exists()


@pytest.mark.slow  # two sweep processes (seconds); benchmarks/fuzz.py races writers too
def test_two_sweeps_started_together_record_every_point_once(tmp_path):
    spec, out = _spec_file(tmp_path, TINY), tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "dlsim", "sweep", str(spec), "--out", str(out), "--jobs", "1"]
    env = {**os.environ, "DLSIM_PROGRESS": "0"}
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outcomes = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    assert any(code == 0 for code, _ in outcomes), outcomes
    for code, err in outcomes:  # the other one either waited its turn (all resumed) or was refused
        assert code == 0 or "is being written by" in err, outcomes
    ids = _ids(out)
    assert len(ids) == len(set(ids)) == 8


@pytest.mark.parametrize("damage, where", [
    (lambda rec: {**rec, "status": "ok", "iteration_time_s": float("nan")}, "line 3"),
    (lambda rec: {**rec, "status": "ok", "iteration_time_s": -1.0}, "line 3"),
    (lambda rec: {**rec, "status": "done"}, "line 3"),
    (lambda rec: {**rec, "point": {**rec["point"], "tp": 8}}, "line 3"),
])
def test_a_damaged_resumed_line_is_refused_with_its_number(tmp_path, cli, damage, where):
    spec, out = _spec_file(tmp_path, TINY), tmp_path / "r.jsonl"
    run_sweep(parse_sweep(TINY), out, jobs=1)
    lines = out.read_text().splitlines()
    lines[2] = json.dumps(damage(json.loads(lines[2])))  # json.dumps writes NaN as the bare word NaN
    out.write_text("\n".join(lines[:5]) + "\n")
    before = out.read_bytes()
    code, stdout, err = cli("sweep", spec, "--out", out, "--json")
    assert code == 1 and f"{out}: {where}:" in err and "internal error" not in err, err
    assert out.read_bytes() == before and not stdout


def test_a_file_that_is_not_a_results_file_is_refused_untouched(tmp_path, cli):
    spec, out = _spec_file(tmp_path, TINY), tmp_path / "notes.txt"
    out.write_text("my notes\nno newline at the end")
    code, _, err = cli("sweep", spec, "--out", out)
    assert code == 1 and "line 1" in err
    assert out.read_text() == "my notes\nno newline at the end"


def test_results_file_must_be_a_regular_file(tmp_path):
    fifo = tmp_path / "r.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="must be a regular file"):
        run_sweep(parse_sweep(TINY), fifo, jobs=1)


def test_resumed_errors_are_spec_errors_naming_the_file(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"id": "x", "kind": "sweep_point", "status": "ok", "point": {}, "iteration_time_s": 1,'
                   ' "throughput_samples_per_s": Infinity}\n')
    with pytest.raises(SpecError, match="line 1"):
        run_sweep(parse_sweep(TINY), out, jobs=1)


# ------------------------------------------------------------------------------------ Dask, lossy
def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(kind: str, address: str, port: int) -> None:
    """A Dask scheduler or worker process (forked from this one: dask and dlsim already imported)."""
    import asyncio
    import logging

    from distributed import Scheduler, Worker
    logging.getLogger("distributed").setLevel(logging.CRITICAL)

    async def main() -> None:
        if kind == "scheduler":
            async with Scheduler(host="127.0.0.1", port=port, dashboard=False) as server:
                await server.finished()
        else:
            async with Worker(address, nthreads=1, death_timeout=20, dashboard=False) as server:
                await server.finished()
    asyncio.run(main())


def _dask(kind: str, address: str, port: int):
    """A process forked from a single-threaded fork server that has imported dask and dlsim's simulator
    (a fork of this process could inherit a lock held by one of its threads)."""
    import multiprocessing
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["distributed", "dlsim.api.simulate", __name__])
    proc = ctx.Process(target=_serve, args=(kind, address, port), daemon=True)
    proc.start()
    return proc


def test_dask_sweep_survives_a_killed_worker_and_a_restarted_scheduler(tmp_path):
    """A worker SIGKILLed mid-run and the scheduler replaced by a new one on the same address (its new
    worker started as a cluster manager would): every point is recorded exactly once, each the same
    record an in-process run gives. Real processes, forked from a warm server so that they start fast."""
    pytest.importorskip("dask.distributed")
    port = _port()
    address = f"tcp://127.0.0.1:{port}"
    procs = {"scheduler": _dask("scheduler", address, port)}
    procs["a"], procs["b"] = _dask("worker", address, port), _dask("worker", address, port)
    spec, out = parse_sweep(SMALL), tmp_path / "dask.jsonl"
    chaos: list[int] = []

    def progress(done: int, total: int) -> None:
        if done and not chaos:  # the first points are in: lose a worker, then the scheduler
            chaos.append(done)
            os.kill(procs["a"].pid, signal.SIGKILL)
            os.kill(procs["scheduler"].pid, signal.SIGKILL)
            procs["scheduler"].join()
            procs["scheduler"] = _dask("scheduler", address, port)
            procs["c"] = _dask("worker", address, port)
    try:
        result = run_sweep(spec, out, scheduler=address, chunk=1, progress=progress)
    finally:
        for p in procs.values():
            p.kill()
            p.join()
    assert chaos and chaos[0] < spec.size and result.computed == spec.size
    assert "submitted again after the scheduler was lost" in result.backend
    ids = _ids(out)
    assert len(ids) == len(set(ids)) == spec.size
    inline = run_sweep(spec, tmp_path / "inline.jsonl", jobs=1)
    assert sorted(map(json.dumps, result.records)) == sorted(map(json.dumps, inline.records))
