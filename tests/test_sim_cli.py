"""`dlsim simulate` end to end: the record, strategy files, traces, determinism, bad input."""

import json

import pytest

STRATEGY = """\
dp: 2
tp: 2
pp: 2
microbatch_size: 1
num_microbatches: 4
schedule: interleaved
virtual_stages: 2
bucket_size_mib: 4
recompute: selective
variability: {jitter: lognormal, jitter_cv: 0.1, seed: 3}
"""
GPT = ["--set", "layers=4", "--set", "hidden=256", "--set", "heads=4", "--set", "seq_len=128", "--set", "vocab=1024"]


def test_record_adds_up(cli):
    code, out, err = cli("simulate", "gpt2", "--cluster", "dgx-h100", "--dp", "4", "--pp", "2",
                         "--microbatch-size", "2", "--num-microbatches", "4", "--json", *GPT)
    assert code == 0, err
    rec = json.loads(out)
    t = rec["iteration_time_s"]
    assert rec["kind"] == "simulation" and rec["feasible"] is True and rec["global_batch"] == 32
    assert rec["throughput_samples_per_s"] == pytest.approx(32 / t)
    assert rec["breakdown_s"]["total"] == pytest.approx(t, rel=1e-9)
    for d in rec["devices"]:
        parts = d["breakdown_s"]
        assert sum(parts[k] for k in ("compute", "recompute", "exposed_comm", "bubble", "idle")) == pytest.approx(t)
    assert rec["breakdown_s"]["bubble"] > 0 and 0 <= rec["measured_share"] <= 1
    assert rec["critical_path"]["tasks_on_path"] > 0 and rec["critical_path"]["length_s"] == t
    assert rec["simulation"]["simulated_devices"] == 2 and rec["simulation"]["total_devices"] == 8


def test_readable_summary(cli):
    code, out, _ = cli("simulate", "gpt2", "--cluster", "dgx-h100", "--dp", "2", "--microbatch-size", "2", *GPT)
    assert code == 0
    for text in ("iteration time", "samples/s", "pipeline bubble", "exposed communication", "peak memory",
                 "critical path"):
        assert text in out


def test_strategy_file_and_overrides(cli, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(STRATEGY)
    code, out, err = cli("simulate", "gpt2", "--cluster", "dgx-h100", "--strategy", str(path), "--json", *GPT)
    assert code == 0, err
    rec = json.loads(out)
    s = rec["strategy"]
    assert (s["schedule"], s["virtual_stages"], s["recompute"], s["bucket_size_bytes"]) == ("interleaved", 2,
                                                                                           "selective", 4 * 2**20)
    assert s["variability"]["jitter"] == "lognormal"
    code, out, _ = cli("simulate", "gpt2", "--cluster", "dgx-h100", "--strategy", str(path), "--schedule", "1f1b",
                       "--virtual-stages", "1", "--json", *GPT)
    assert code == 0 and json.loads(out)["strategy"]["schedule"] == "1f1b"


def test_same_seed_same_bytes_and_trace(cli, tmp_path):
    args = ["simulate", "gpt2", "--cluster", "dgx-h100", "--dp", "2", "--pp", "2", "--microbatch-size", "1",
            "--num-microbatches", "4", "--jitter", "lognormal", "--jitter-cv", "0.2", *GPT]
    outs = []
    for n in range(2):
        j, t = tmp_path / f"r{n}.json", tmp_path / f"t{n}.json"
        code, _, err = cli(*args, "--seed", "5", "--json", str(j), "--trace", str(t))
        assert code == 0, err
        outs.append((j.read_bytes(), t.read_bytes()))
    assert outs[0] == outs[1]
    code, _, _ = cli(*args, "--seed", "6", "--json", str(tmp_path / "other.json"))
    assert (tmp_path / "other.json").read_bytes() != outs[0][0]


def test_chrome_trace(cli, tmp_path):
    path = tmp_path / "trace.json"
    code, out, err = cli("simulate", "gpt2", "--cluster", "dgx-h100", "--dp", "2", "--tp", "2", "--pp", "2",
                         "--microbatch-size", "1", "--num-microbatches", "2", "--full", "--trace", str(path), *GPT)
    assert code == 0, err
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    threads = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
    assert any(t.endswith("compute") for t in threads) and any(t.endswith("comm") for t in threads)
    assert any(" in" in t or " out" in t for t in threads)  # link ports
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(trace["otherData"]["makespan_s"] * 1e6)
    assert {e["pid"] for e in spans} >= set(range(1, 9))  # process ids from 1


@pytest.mark.parametrize("args,message", [
    (["--schedule", "zigzag"], "zigzag"),
    (["--pp", "2", "--num-microbatches", "3", "--schedule", "interleaved", "--virtual-stages", "2"], "divisible by pp"),
    (["--dp", "1024", "--nodes", "2"], "devices"),  # without --nodes the cluster is sized to the strategy
    (["--global-batch", "10", "--dp", "4"], "not divisible by dp"),
    (["--bucket-size", "lots"], "lots"),
    (["--zero", "2", "--sync", "async"], "zero 2 needs sync allreduce"),
])
def test_bad_input_is_one_line(cli, args, message):
    code, out, err = cli("simulate", "gpt2", "--cluster", "dgx-h100", *args, *GPT)
    assert code == 1 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line]
    assert len(lines) == 1 and message in lines[0]


def test_bad_strategy_file_names_file_and_field(cli, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("dp: 2\nbucket_size_mb: 25\n")
    code, _, err = cli("simulate", "gpt2", "--cluster", "dgx-h100", "--strategy", str(path), *GPT)
    assert code == 1 and str(path) in err and "bucket_size_mb" in err and err.count("\n") == 1
