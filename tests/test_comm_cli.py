"""`dlsim comm`: records, sweeps with crossovers, plots, and one-line errors with exit code 1."""

import json

import pytest

NET = ["--latency", "5us", "--bandwidth", "10GB/s"]


def test_single_size_json(cli):
    code, out, err = cli("comm", "allreduce", "--size", "100MB", "--ranks", "8", *NET, "--algorithm", "all", "--json")
    assert code == 0, err
    rec = json.loads(out)
    times = {r["algorithm"]: r["time_s"] for r in rec["results"]}
    assert times["ring"] == pytest.approx(14 * 5e-6 + 2 * 0.875e-2)
    assert rec["best"] == "rabenseifner" and rec["lower_bound_s"] == pytest.approx(3 * 5e-6 + 2 * 0.875e-2)
    ring = next(r for r in rec["results"] if r["algorithm"] == "ring")
    assert ring["busbw_bytes_per_s"] == pytest.approx(ring["algbw_bytes_per_s"] * 1.75)
    assert {s["algorithm"] for s in rec["skipped"]} == {"hierarchical"}


def test_auto_text_and_profile(cli):
    code, out, err = cli("comm", "allreduce", "--size", "1KB", "--ranks", "8", *NET)
    assert code == 0 and "recursive-doubling *" in out and "lower bound" in out
    code, out, err = cli("comm", "allreduce", "--size", "64MiB", "--ranks", "32", "-c", "dgx-h100", "--json")
    rec = json.loads(out)
    assert code == 0 and rec["results"][0]["algorithm"] == "hierarchical"
    assert rec["network"]["ranks_per_node"] == 8 and rec["network"]["model"] == "loggp"


def test_sweep_crossover_and_plot(cli, tmp_path):
    plot = tmp_path / "sweep.png"
    code, out, err = cli("comm", "allreduce", "--sweep", "1KB:1GB", "--ranks", "8", *NET,
                         "--algorithm", "recursive-doubling", "--plot", str(plot), "--json")
    assert code == 0, err
    assert plot.read_bytes()[:4] == b"\x89PNG"
    code, out, err = cli("comm", "allreduce", "--sweep", "1KB:1GB", "--ranks", "8", *NET, "--json")
    rec = json.loads(out)
    # 3(α + nβ) = 6α + 1.75 nβ  at  n = 3α / (1.25 β) = 120 kB
    assert rec["crossovers"][0]["from"] == "recursive-doubling" and rec["crossovers"][0]["to"] == "rabenseifner"
    assert rec["crossovers"][0]["size_bytes"] == pytest.approx(120_000, rel=1e-6)
    assert len(rec["sizes_bytes"]) == 21 and rec["sizes_bytes"][-1] == 1e9
    code, out, err = cli("comm", "allreduce", "--sweep", "1KB:1GB:4", "--ranks", "8", *NET)
    assert code == 0 and "recursive-doubling -> rabenseifner at" in out


BAD = [
    (["allreduce", "--size", "1MB", "--ranks", "0", *NET], "ranks must be a positive integer"),
    (["allreduce", "--size", "-5MB", "--ranks", "8", *NET], "must be a finite non-negative number"),
    (["allreduce", "--size", "1MB", "--ranks", "8", *NET, "--algorithm", "spiral"], "unknown algorithm 'spiral'"),
    (["allreduce", "--size", "10XB", "--ranks", "8", *NET], "unknown size unit"),
    (["allreduce", "--size", "1MB", "--ranks", "8", "--latency", "5parsec", "--bandwidth", "1GB/s"], "unknown time unit"),
    (["allreduce", "--size", "1MB", "--ranks", "8", "--latency", "5us", "--bandwidth", "fast"], "cannot read 'fast'"),
    (["allreduce", "--size", "1MB", "--ranks", "eight", *NET], "'eight' is not a valid integer"),
    (["allsum", "--size", "1MB", "--ranks", "8", *NET], "unknown collective 'allsum'"),
    (["allreduce", "--size", "1MB", "--ranks", "8"], "give --cluster PROFILE, or --latency and --bandwidth"),
    (["allreduce", "--size", "1MB", "--ranks", "8", "-c", "dgx-h100", *NET], "not both"),
    (["allreduce", "--ranks", "8", *NET], "give either --size or --sweep"),
    (["allreduce", "--size", "1MB", "--ranks", "8", *NET, "--plot", "x.png"], "--plot needs --sweep"),
    (["allreduce", "--sweep", "1GB:1KB", "--ranks", "8", *NET], "0 < START <= STOP"),
    (["allreduce", "--sweep", "1KB:1GB:1", "--ranks", "8", *NET], "factor must be > 1"),
    (["allgather", "--size", "1MB", "--ranks", "6", *NET, "-a", "recursive-doubling"], "power-of-two"),
    (["allreduce", "--size", "1MB", "--ranks", "8", *NET, "--segments", "0"], "segments must be a positive"),
    (["allreduce", "--size", "1MB", "--ranks", "8", *NET, "--gap", "9us", "--model", "loggp"], "exceeds L + 2o"),
    (["allreduce", "--size", "1MB", "--ranks", "8", "-c", "no-such-profile"], "no such profile"),
    (["allreduce", "--size", "1MB", "--ranks", "8", *NET, "--model", "logp"], "LogP needs a gap"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_one_line_exit_1(cli, args, message):
    code, out, err = cli("comm", *args)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert "Traceback" not in err
