"""Where a benchmark table's times come from: the CSV's ``source`` column (measured, interpolated,
model), carried into every plan row, the printed table and the figure; titles name the table by its
file name."""

from __future__ import annotations

import json

import pytest

from dlsim.io.bench_table import append_rows, load_bench_table, resume_rows, write_bench_table
from dlsim.plan.microbatch.configs import Kernel
from dlsim.plan.microbatch.table import BenchTable

ROWS = """conv1,forward,4,slow,4.0,0{s}
conv1,forward,4,fast,1.0,400{s}
conv1,forward,2,fast,0.5,200{s}
conv1,forward,1,fast,0.25,100{s}
conv2,backward_data,4,gemm,3.0,10{t}
"""
HEAD = "layer,pass,microbatch_size,algorithm,time_s,workspace_bytes"


def _table(tmp_path, text, name="deepbench-p100.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_modelled_rows_are_labelled_model_everywhere(tmp_path, cli):
    path = _table(tmp_path, HEAD + ",source\n" + ROWS.format(s=",roofline", t=",model"))
    png = tmp_path / "fig.png"
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4, "--workspace-limit", "250B",
                         "--plot", png, "--json")
    assert code == 0, err
    rec = json.loads(out)
    assert rec["source"] == "model"
    assert {p["source"] for layer in rec["layers"] for p in layer["passes"].values()} == {"model"}
    assert rec["sweep"]["source"] == "model"
    assert rec["sweep"]["label"] == "deepbench-p100.csv"  # the file name, not the temporary directory
    assert str(tmp_path) not in json.dumps(rec["sweep"]) and str(tmp_path) not in " ".join(rec["notes"])
    assert "measured" not in rec["dtype"]
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4, "--workspace-limit", "250B")
    header, *rows = [line for line in out.splitlines() if line.startswith(("layer ", "conv1 ", "conv2 "))]
    assert header.split()[-1] == "source" and all(r.split()[-1] == "model" for r in rows)
    assert "(model times)" in out and "measured" not in out


def test_rows_of_several_sources_make_a_mixed_plan(tmp_path, cli):
    path = _table(tmp_path, HEAD + ",source\n" + ROWS.format(s=",measured", t=",interpolated"))
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4, "--workspace-limit", "250B",
                         "--json")
    rec = json.loads(out)
    by = {layer["name"]: layer["passes"] for layer in rec["layers"]}
    assert by["conv1"]["forward"]["source"] == "measured"
    assert by["conv2"]["backward_data"]["source"] == "interpolated"
    assert rec["source"] == "mixed"
    assert any("1 measured, 1 interpolated" in n for n in rec["notes"])


def test_a_table_without_the_column_says_it_is_taken_as_measured(tmp_path, cli):
    path = _table(tmp_path, HEAD + "\n" + ROWS.format(s="", t=""))
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4, "--json")
    rec = json.loads(out)
    assert rec["source"] == "measured"
    assert any("no source column: its times are taken as measured" in n for n in rec["notes"])


def test_an_unknown_source_is_one_line(tmp_path, cli):
    path = _table(tmp_path, HEAD + ",source\n" + ROWS.format(s=",guessed", t=",model"))
    code, out, err = cli("plan", "microbatch", "--bench-table", path, "--batch", 4)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "line 2: unknown source 'guessed' (use measured, interpolated, model)" in err


def test_written_tables_keep_their_source_and_old_tables_resume(tmp_path):
    model = BenchTable.from_rows([("c", "forward", Kernel("gemm", 2, 1e-3, 0.0))], source="model")
    out = tmp_path / "m.csv"
    write_bench_table(out, model)
    assert load_bench_table(out).kernels[0].source == "model"
    # a calibration resuming a table written before the column: rows appended in its own columns
    old = _table(tmp_path, HEAD + "\n" + "c,forward,1,gemm,1e-3,0\n", "old.csv")
    assert len(resume_rows(old)) == 1
    append_rows(old, [("c", "forward", Kernel("gemm", 2, 2e-3, 0.0))])
    table = load_bench_table(old)
    assert [r.size for r in table.kernels[0].rows] == [1, 2] and table.kernels[0].source == "measured"
    fresh = tmp_path / "fresh.csv"
    assert resume_rows(fresh) == {}
    append_rows(fresh, [("c", "forward", Kernel("gemm", 2, 2e-3, 0.0))])
    assert fresh.read_text().splitlines()[1].endswith(",measured")


def test_a_mixed_kernel_is_not_written_as_one_source(tmp_path):
    mixed = BenchTable.from_rows([("c", "forward", Kernel("gemm", 2, 1e-3, 0.0), "model"),
                                  ("c", "forward", Kernel("gemm", 1, 1e-3, 0.0), "measured")])
    assert mixed.kernels[0].source == "mixed"
    with pytest.raises(Exception, match="several sources"):
        write_bench_table(tmp_path / "x.csv", mixed)
