"""Nothing a user wrote is lost, and the exit codes mean the same for every command (issue 16)."""

import json
import os
import stat

import pytest

from dlsim.cli.output import json_safe, NonFiniteError

EST = ["estimate", "lenet5", "--cluster", "dgx-h100", "--batch", "2"]


def test_json_file_is_written_with_the_summary_and_readable_per_umask(cli, tmp_path):
    out = tmp_path / "r.json"
    old = os.umask(0o022)
    try:
        code, stdout, err = cli(*EST, "--json", out)
    finally:
        os.umask(old)
    assert code == 0 and "iteration" in stdout.lower() and f"wrote {out}" in err
    assert json.loads(out.read_text())["model"] == "lenet5"
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_existing_file_is_replaced_only_with_force(cli, tmp_path):
    out = tmp_path / "r.json"
    out.write_text("mine\n")
    code, _, err = cli(*EST, "--json", out)
    assert code == 1 and "--force" in err and err.count("\n") == 1 and out.read_text() == "mine\n"
    code, _, _ = cli(*EST, "--json", out, "--force")
    assert code == 0 and json.loads(out.read_text())["model"] == "lenet5"


def test_an_input_is_never_an_output(cli, tmp_path):
    from dlsim.io.paths import resolve_model
    mine = tmp_path / "mine.yaml"
    mine.write_text(resolve_model("lenet5").read_text())
    before = mine.read_text()
    code, _, err = cli("model", "show", mine, "--json", mine, "--force")
    assert code == 1 and "input of this run" in err and mine.read_text() == before


def test_two_outputs_of_one_run_cannot_collide(cli, tmp_path):
    out = tmp_path / "x.json"
    code, _, err = cli("simulate", "lenet5", "-c", "dgx-h100", "--dp", "2", "--json", out, "--trace", out)
    assert code == 1 and "already" in err and not out.exists()


def test_symlink_is_kept_and_its_target_replaced(cli, tmp_path):
    target = tmp_path / "target.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    code, _, _ = cli(*EST, "--json", link, "--force")
    assert code == 0 and link.is_symlink() and json.loads(target.read_text())["model"] == "lenet5"


def test_json_to_a_directory_is_one_line(cli, tmp_path):
    code, _, err = cli(*EST, "--json", tmp_path)
    assert code == 1 and err.count("\n") == 1 and "directory" in err


def test_unknown_plot_format_is_refused_before_work(cli, tmp_path):
    code, _, err = cli("comm", "allreduce", "--sweep", "1KB:1MB", "--ranks", "8", "--latency", "5us",
                       "--bandwidth", "10GB/s", "--plot", tmp_path / "p.xyz")
    assert code == 1 and "figure format" in err and not (tmp_path / "p.xyz").exists()


def test_usage_errors_and_bad_input_exit_1(cli):
    assert cli("simulate", "lenet5", "-c", "dgx-h100", "--dpp", "2")[0] == 1
    assert cli("estimate")[0] == 1
    assert cli("estimate", "lenet5", "-c", "dgx-h100", "--batch", "many")[0] == 1
    assert cli("estimate", "lenet5", "-c", "no-such-profile")[0] == 1
    assert cli("comm", "allreduce", "--size", "1mb", "--ranks", "8", "--latency", "5us", "--bandwidth", "10GB/s")[0] == 1


def test_estimate_that_does_not_fit_exits_1(cli):
    code, out, err = cli("estimate", "gpt3-175b", "-c", "dgx-h100", "--batch", "8")
    assert code == 1 and "does not fit" in err and err.count("\n") == 1 and out  # the table is printed first


def test_non_finite_numbers_are_never_reported():
    assert json_safe({"link": {"peak_bandwidth_bytes_per_s": float("inf")}}) == {"link": {"peak_bandwidth_bytes_per_s": None}}
    for bad in (float("inf"), float("nan"), -float("inf")):
        with pytest.raises(NonFiniteError, match="a.b"):
            json_safe({"a": {"b": bad}})


def test_comm_record_is_strict_json(cli):
    code, out, _ = cli("comm", "allreduce", "--size", "1MB", "--ranks", "8", "-c", "dgx-h100", "--json")
    assert code == 0
    json.loads(out, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
