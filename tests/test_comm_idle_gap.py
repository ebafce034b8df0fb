"""The idle gap before collective repetitions (`CommPlan.idle_gap_s`): order of the steps, tables, refusals.

A one-rank fake transport logs every call, so the tests see exactly what each repetition does
(sleep, barrier, operation, gathers) without MPI, and what lands in the tables.
"""

import csv
import json

import pytest

from dlsim.calibrate.comm_measure import (COLLECTIVE_COLUMNS, COLLECTIVE_COLUMNS_GAP, COLLECTIVE_TABLE, REPS_FILE,
                                          Measurer, check_idle_gap, collective_columns, row_idle_gap)
from dlsim.calibrate.comm_plan import CommPlan
from dlsim.calibrate.comm_run import launches, run_launches
from dlsim.calibrate.comm_launch import Hosts
from dlsim.errors import SpecError


class LogTransport:
    """Rank 0 of 1: every call appended to `log`; the collective is a no-op that logs "op"."""

    rank, size = 0, 1

    def __init__(self) -> None:
        self.log: list[str] = []

    def barrier(self) -> None:
        self.log.append("barrier")

    def quiet_barrier(self) -> None:
        self.log.append("quiet_barrier")

    def bcast(self, obj):
        return obj

    def gather(self, value):
        self.log.append("gather")
        return [value]

    def collective(self, name, nbytes):
        return lambda: self.log.append("op")


def measure(tmp_path, gap, reps=3, warmup=2, wait="sleep"):
    t = LogTransport()
    plan = CommPlan("mpi", str(tmp_path), hosts="fake", point_to_point=False, collectives=("allreduce",),
                    collective_sizes=(1024,), min_reps=reps, max_reps=reps, warmup=warmup, idle_gap_s=gap,
                    idle_wait=wait)
    sleeps: list[float] = []

    def sleep(seconds):
        sleeps.append(seconds)
        t.log.append("sleep")
    m = Measurer(t, plan, "mpi", quiet=True, sleep=sleep)
    t.log.clear()                               # the constructor's host-name gather
    m.run()
    return t.log, sleeps


def test_every_repetition_warmup_included_sleeps_then_barrier_then_op(tmp_path):
    log, sleeps = measure(tmp_path, 1e-3, reps=3, warmup=2)
    one = ["sleep", "barrier", "op", "gather", "gather"]
    assert log == one * 5                      # 2 warm-up + 3 timed repetitions
    assert sleeps == [1e-3] * 5
    with open(tmp_path / COLLECTIVE_TABLE) as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == COLLECTIVE_COLUMNS_GAP and rows[0]["reps"] == "3"
    assert row_idle_gap(rows[0]) == 1e-3
    line = json.loads((tmp_path / REPS_FILE).read_text())
    assert line["idle_gap_s"] == 1e-3 and len(line["values_s"]) == 3


def test_no_gap_is_todays_protocol_and_table(tmp_path):
    log, sleeps = measure(tmp_path, 0.0, reps=2, warmup=1)
    assert sleeps == [] and log == ["barrier", "op", "gather", "gather"] * 3
    header = (tmp_path / COLLECTIVE_TABLE).read_text().splitlines()[0]
    assert header == ",".join(COLLECTIVE_COLUMNS)       # the original columns: old readers and tables unchanged
    with open(tmp_path / COLLECTIVE_TABLE) as handle:
        assert row_idle_gap(next(csv.DictReader(handle))) == 0.0


def test_a_table_keeps_one_gap(tmp_path):
    measure(tmp_path, 0.0)
    check_idle_gap(tmp_path, "mpi", "fake", 0.0)
    with pytest.raises(SpecError, match="measured back to back"):
        check_idle_gap(tmp_path, "mpi", "fake", 1e-3)
    gap = tmp_path / "gap"
    measure(gap, 2e-3)
    check_idle_gap(gap, "mpi", "fake", 2e-3)
    check_idle_gap(gap, "mpi", "other-hosts", 0.0)      # rows of another host set do not count
    with pytest.raises(SpecError, match="idle gap of 0.002 s, not 0.001 s"):
        check_idle_gap(gap, "mpi", "fake", 1e-3)
    assert collective_columns(tmp_path / "none.csv", 0.0) == COLLECTIVE_COLUMNS
    assert collective_columns(tmp_path / "none.csv", 1e-3) == COLLECTIVE_COLUMNS_GAP


def test_resume_skips_points_already_measured_with_the_gap(tmp_path):
    measure(tmp_path, 1e-3)
    log, sleeps = measure(tmp_path, 1e-3)
    assert log == [] and sleeps == []
    assert len((tmp_path / COLLECTIVE_TABLE).read_text().splitlines()) == 2


def test_run_launches_refuses_a_mixed_table_before_launching(tmp_path):
    measure(tmp_path, 0.0)
    plan = CommPlan("mpi", str(tmp_path), hosts="fake", idle_gap_s=1e-3)
    with pytest.raises(SpecError, match="measured back to back"):
        run_launches(launches(plan, ["ring"]), 2, Hosts(), tmp_path)   # raises before mpirun is looked up
    assert all(item.plan.idle_gap_s == 1e-3 for item in launches(plan, ["ring", "rabenseifner"]))


def test_spin_wait_busy_loops_instead_of_sleeping(tmp_path, monkeypatch):
    import dlsim.calibrate.comm_measure as cm
    spins: list[float] = []
    monkeypatch.setattr(cm, "_busy_wait", spins.append)
    log, sleeps = measure(tmp_path, 2e-3, reps=2, warmup=1, wait="spin")
    assert sleeps == [] and spins == [2e-3] * 3 and log == ["barrier", "op", "gather", "gather"] * 3
    assert json.loads((tmp_path / REPS_FILE).read_text())["idle_wait"] == "spin"
    monkeypatch.undo()
    start = cm.now()
    cm._busy_wait(2e-3)
    assert cm.now() - start >= 2e-3              # the real loop waits at least that long (a bound, not a timing)


def test_sleep_barrier_wakes_the_ranks_with_one_more_barrier(tmp_path):
    log, sleeps = measure(tmp_path, 1e-3, reps=2, warmup=1, wait="sleep-barrier")
    assert sleeps == [1e-3] * 3 and log == ["sleep", "barrier", "barrier", "op", "gather", "gather"] * 3


@pytest.mark.parametrize("gap", [-1e-3, float("inf"), float("nan")])
def test_plan_rejects_bad_gaps(gap):
    with pytest.raises(SpecError, match="idle gap"):
        CommPlan("mpi", "/tmp/x", idle_gap_s=gap)


def test_plan_rejects_unknown_wait():
    with pytest.raises(SpecError, match="unknown idle wait 'nap'"):
        CommPlan("mpi", "/tmp/x", idle_gap_s=1e-3, idle_wait="nap")


def test_plan_round_trips_the_gap(tmp_path):
    plan = CommPlan("mpi", str(tmp_path), idle_gap_s=1e-3)
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    assert CommPlan.from_file(path).idle_gap_s == 1e-3


@pytest.mark.parametrize("args,message", [
    (["--idle-gap", "-1ms"], "must be a finite non-negative number"),
    (["--idle-gap", "1parsec"], "unknown time unit"),
])
def test_cli_idle_gap_bad_input_one_line_exit_1(cli, tmp_path, args, message):
    code, out, err = cli("calibrate", "comm", "--out", str(tmp_path / "p"), *args)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err


def test_cli_passes_the_parsed_gap(cli, tmp_path, monkeypatch):
    import dlsim.cli.calibrate_comm as command
    seen = {}

    def fake(out, **kw):
        seen.update(kw)
        return {"out": str(out), "ranks": 2, "hosts": "local", "launches": [], "fits": {}, "profile": []}
    monkeypatch.setattr(command, "calibrate_comm", fake)
    code, out, err = cli("calibrate", "comm", "--out", str(tmp_path / "p"), "--idle-gap", "1.5ms", "--idle-wait", "spin")
    assert code == 0, err
    assert seen["idle_gap_s"] == pytest.approx(1.5e-3) and seen["idle_wait"] == "spin"
    cli("calibrate", "comm", "--out", str(tmp_path / "p"))
    assert seen["idle_gap_s"] == 0.0
