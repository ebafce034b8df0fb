"""Outputs are never an input of the run, however it reaches it, and are safe on any file type (issue 29).

Each test reproduces a defect found by fuzzing: a file reached through `extends:` or a profile's
`tables:` overwritten, a device node replaced by a regular file, a long name an internal error, an
output path found unwritable only after the work.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from dlsim.io.files import OutputError, check_output, write_atomic
from dlsim.io.runfiles import note_input, run_scope

ROOT = Path(__file__).resolve().parents[1]
LENET = ROOT / "models" / "lenet5.yaml"


def _child(tmp_path):
    base = tmp_path / "base.yaml"
    shutil.copy(LENET, base)
    child = tmp_path / "child.yaml"
    child.write_text("extends: base.yaml\nname: child\n")
    return base, child


@pytest.mark.parametrize("option", ["--json", "--trace"])
def test_a_file_reached_through_extends_is_never_an_output(cli, tmp_path, option):
    base, child = _child(tmp_path)
    before = base.read_bytes()
    command = ["model", "show", child, option, base, "--force"] if option == "--json" else \
        ["simulate", child, "-c", "dgx-h100", "--dp", "2", option, base, "--force"]
    code, _, err = cli(*command)
    assert code == 1 and f"{option} {base} is an input of this run" in err and len(err.splitlines()) == 1
    assert base.read_bytes() == before


def test_a_profile_table_outside_its_folder_is_never_an_output(cli, tmp_path):
    prof = tmp_path / "prof"
    shutil.copytree(ROOT / "hardware_profiles" / "cpu-epyc-2core", prof,
                    ignore=shutil.ignore_patterns("passes", "1thread", "median-run", "single-pass-run"))
    tables = tmp_path / "tables"
    tables.mkdir()
    (prof / "gemm.csv").rename(tables / "gemm.csv")
    text = (prof / "profile.yaml").read_text().replace("gemm: gemm.csv", "gemm: ../tables/gemm.csv")
    (prof / "profile.yaml").write_text(text)
    before = (tables / "gemm.csv").read_bytes()
    code, _, err = cli("estimate", "lenet5", "-c", prof, "--json", tables / "gemm.csv", "--force")
    assert code == 1 and "is an input of this run" in err and "gemm" in err
    assert (tables / "gemm.csv").read_bytes() == before


def test_an_output_read_later_in_the_run_is_refused_before_it_is_written(tmp_path):
    target = tmp_path / "t.yaml"
    target.write_text("mine")
    with run_scope():
        check_output(target, force=True, option="--json")
        with pytest.raises(OutputError, match="--json .* is an input of this run"):
            note_input(target, "YAML file")
    assert target.read_text() == "mine"


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_a_character_device_is_written_into_never_replaced(cli, tmp_path):
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    for extra in ([], ["--force"]):
        code, _, err = cli("model", "show", "lenet5", "--json", null, *extra)
        assert code == 0, err
        assert stat.S_ISCHR(os.stat(null).st_mode)
    code, _, err = cli("simulate", "lenet5", "-c", "dgx-h100", "--dp", "2", "--trace", null, "--force")
    assert code == 0 and stat.S_ISCHR(os.stat(null).st_mode), err


def test_a_fifo_is_written_into_or_refused_when_nobody_reads_it(cli, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code, _, err = cli("model", "show", "lenet5", "--json", fifo, "--force")
    assert code == 1 and "FIFO that no process reads" in err and stat.S_ISFIFO(os.stat(fifo).st_mode)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(_read_all(fifo)))
    reader.start()
    time.sleep(0.3)  # the reader is waiting in open(): the pipe has a reader
    code, _, err = cli("model", "show", "lenet5", "--json", fifo)
    reader.join(10)
    assert code == 0, err
    assert b'"model": "lenet5"' in got[0] and got[0].endswith(b"}\n") and stat.S_ISFIFO(os.stat(fifo).st_mode)


def _read_all(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def test_a_socket_is_refused(cli, tmp_path):
    path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    try:
        code, _, err = cli("model", "show", "lenet5", "--json", path, "--force")
        assert code == 1 and "is a socket" in err and stat.S_ISSOCK(os.stat(path).st_mode)
    finally:
        server.close()


def test_a_name_too_long_is_one_line_and_a_long_valid_one_works(cli, tmp_path):
    code, _, err = cli("model", "show", "lenet5", "--json", tmp_path / ("x" * 300 + ".json"))
    assert code == 1 and "file name too long" in err and "internal error" not in err and len(err.splitlines()) == 1
    long_ok = tmp_path / ("y" * 250)
    code, _, err = cli("model", "show", "lenet5", "--json", long_ok)
    assert code == 0 and long_ok.is_file(), err


@pytest.mark.parametrize("name, reason", [("", "empty"), ("a\x00b", "NUL"), ("d/", "directory")])
def test_invalid_names_are_refused(tmp_path, name, reason):
    with pytest.raises(OutputError) as e:
        check_output(f"{tmp_path}/{name}" if name else "", option="--json")
    assert reason.lower() in str(e.value).lower() or "names a directory" in str(e.value)


def test_output_paths_are_checked_before_the_work(cli, tmp_path, monkeypatch):
    import dlsim.api.compare
    import dlsim.cli.sweep

    def work(*_a, **_k):
        raise AssertionError("the work started before the output paths were checked")
    monkeypatch.setattr(dlsim.api.compare, "compare", work)
    monkeypatch.setattr(dlsim.cli.sweep, "run_sweep", work)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = cli("compare", "lenet5", "-c", "dgx-h100", "--grid", "dp=1,2", "--csv", blocker / "t.csv")
    assert code == 1 and "is not a directory" in err
    spec = tmp_path / "spec.yaml"
    spec.write_text("models: [lenet5]\nclusters: [dgx-h100]\ngpus: [8]\nglobal_batch: 32\ngrid: {tp: [1, 2]}\n")
    for option, value in (("--summary", blocker / "s.csv"), ("--summary", tmp_path), ("--plot", tmp_path / "s.txt"),
                          ("--summary", tmp_path / ("z" * 300))):
        code, _, err = cli("sweep", spec, "--out", tmp_path / "r.jsonl", option, value)
        assert code == 1 and option in err and "internal error" not in err, err
    assert not (tmp_path / "r.jsonl").exists()


def test_two_outputs_of_a_sweep_cannot_be_its_results_file(cli, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("models: [lenet5]\nclusters: [dgx-h100]\ngpus: [8]\nglobal_batch: 32\ngrid: {tp: [1, 2]}\n")
    results = tmp_path / "r.jsonl"
    code, _, err = cli("sweep", spec, "--out", results, "--jobs", "1")
    assert code == 0, err
    before = results.read_bytes()
    code, _, err = cli("sweep", spec, "--out", results, "--summary", results, "--force")
    assert code == 1 and "already the --out output" in err
    assert results.read_bytes() == before


def test_write_atomic_never_renames_over_a_device(tmp_path):
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="no process reads"):
        write_atomic(fifo, "x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
