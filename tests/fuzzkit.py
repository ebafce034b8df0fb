"""A seeded fuzzer over every reader and command (issues 16, 29); used by tests/test_fuzz.py and
benchmarks/fuzz.py.

`make_case(rng, folder)` writes the files of one case into `folder` and returns a `Case`: the argv
for `dlsim.cli.run`, whether the input is certainly invalid (it must then exit 1 or 2), the files the
run may change, a check of what it wrote, a rival command. Cases are mutated inputs and flags
(`_classic_case`) and the attacks of `fuzz_attacks` (indirect inputs, special files, concurrent
writers, damaged resumed results, every command's bounds). `run_case(case, folder)` runs it
in-process under a CPU limit and classifies the outcome: a traceback, an ``internal error`` line,
a run over 10 s of CPU, an invalid input accepted, a NaN or Infinity printed or written, an error
line over 300 characters, an input changed, a special file replaced, results lost or duplicated.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import re
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dlsim.io.paths import resolve_model, resolve_profile
from fuzz_attacks import ATTACKS, Case, python_env

TIME_LIMIT_S = 10    # seconds of CPU a case may take
WALL_LIMIT_S = 120   # seconds of wall clock (a case blocked without using the CPU: a hang)
MAX_ERROR_CHARS = 300

BAD_NUMBERS = ["-1", "0", "-0.5", "1e29", "1e308", "1e-308", "10000000000000000000000000000000000000000000000000",
               ".nan", ".inf", "-.inf", "nan", "'12'", "[1, 2]", "{a: 1}", "null", "true", "'${9**9**9}'",
               "'${10**10**8}'", "'${\"x\" * 10**9}'", "'${[0] * 10**9}'", "'${1/0}'", "1" * 5000]
ODD_NUMBERS = ["1", "2", "3", "7", "64", "1000", "4096", "0.5", "1.5"]
UNITS = ["B", "b", "kB", "KB", "MB", "Mb", "GB", "Gb", "MiB", "GiB", "mb", "gb", "mib", "", "XB", "MB/s", "us",
         "GB/s", "Gb/s", "Gbps", "GBps", "GiB/s", "gbps", "ms", "MS", "s"]
INVALID_STRATEGY_VALUES = (".nan", ".inf", "-.inf", "nan", "[1, 2]", "{a: 1}", "-1", "1e29",
                           "10000000000000000000000000000000000000000000000000", "1" * 5000)
AMOUNTS = ["1", "10", "0", "-1", "1e29", "1e400", "nan", "0.5", "1e-308", "100", "abc", ""]


def _numbers(text: str) -> list[re.Match]:
    """Numbers that are YAML values (not inside a comment)."""
    # the whole value: a number followed by the end of the line, a comment or a flow delimiter (a number
    # that only begins a text, "description: 2013 COTS cluster", is not a number value)
    found = re.finditer(r"(?<=: )-?\d+(\.\d+)?(e-?\d+)?(?=[ \t]*(#|$)|,|\]|\})", text, re.M)

    def value(m: re.Match) -> bool:
        before = text[text.rfind("\n", 0, m.start()) + 1: m.start()]
        return "#" not in before and before.count('"') % 2 == 0 and before.count("'") % 2 == 0  # not inside a string
    return [m for m in found if value(m)]


def _mutate_yaml(rng: random.Random, text: str) -> tuple[str | bytes, bool]:
    kind = rng.choice(["number", "number", "number", "odd", "bytes", "deep", "bomb", "truncate", "alias-cycle",
                       "dup", "tag", "long-string", "garbage"])
    if kind in ("number", "odd"):
        spots = _numbers(text)
        if not spots:
            return text, False
        spot = rng.choice(spots)
        value = rng.choice(BAD_NUMBERS if kind == "number" else ODD_NUMBERS)
        invalid = kind == "number" and value not in ("0", "null", "true", "'12'", "[1, 2]", "{a: 1}", "1e29", "1e308",
                                                     "1e-308", "-0.5", "-1", "10000000000000000000000000000000000000000000000000")
        return text[: spot.start()] + value + text[spot.end():], invalid
    if kind == "bytes":
        data = text.encode()
        at = rng.randrange(len(data))
        return data[:at] + bytes([rng.choice([0xff, 0xfe, 0xc3, 0x80])]) + data[at:], True
    if kind == "deep":
        return text + "\nzzdeep: " + "[" * rng.choice([100, 1000, 20000]) + "]" * 3, True
    if kind == "bomb":
        lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
        return "\n".join(lines) + "\n" + text, True
    if kind == "alias-cycle":
        return "zz: &z [*z]\n" + text, True
    if kind == "truncate":
        return text[: rng.randrange(len(text))], False
    if kind == "dup":
        return text + "\n" + text, False
    if kind == "tag":
        return "zz: !!python/name:os.system\n" + text, True
    if kind == "long-string":
        return text.replace("name: ", "name: " + "x" * 100_000, 1), False
    return "".join(rng.choice("{}[]:,-&*!|>'\"#%@` \n\tab1") for _ in range(rng.randrange(1, 400))), False


def _mutate_csv(rng: random.Random, text: str) -> tuple[str | bytes, bool]:
    lines = text.splitlines()
    kind = rng.choice(["cell", "cell", "cell", "bytes", "nul", "columns", "header", "long", "empty"])
    if kind == "cell" and len(lines) > 1:
        i = rng.randrange(1, len(lines))
        cells = lines[i].split(",")
        j = rng.randrange(len(cells))
        value = rng.choice(["-1", "nan", "inf", "1e400", "", "x", "0", "1e300", "9" * 400, "\"a,b\"", "1.5"])
        cells[j] = value
        lines[i] = ",".join(cells)
        numeric = j in (2, 4, 5)  # microbatch_size, time_s, workspace_bytes
        return "\n".join(lines) + "\n", numeric and value in ("nan", "inf", "1e400", "x", "9" * 400)
    if kind == "bytes":
        return text.encode() + b"\xff\xfe\n", True
    if kind == "nul":
        return text.replace(",", ",\x00", 1), True
    if kind == "columns":
        return text + "a,b,c,d,e,f,g,h,i,j,k,l,m,n\n", True
    if kind == "header":
        return "x,y\n" + text, True
    if kind == "long":
        return text + ("z" * 200_000) + "\n", True
    return "", True


BENCH = """layer,pass,microbatch_size,algorithm,time_s,workspace_bytes
conv1,forward,4,slow,4.0,0
conv1,forward,4,fast,1.0,400
conv1,forward,2,fast,0.5,200
conv1,forward,1,fast,0.25,100
conv1,forward,2,slow,2.0,0
conv1,forward,1,slow,1.0,0
"""


def _write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    return path


def _flag_value(rng: random.Random) -> str:
    return rng.choice(["-1", "0", "1", "2", "3", "8", "1000000", "1e9", "nan", "x", "99999999999999999999999", "1.5"])


def _classic_case(rng: random.Random, folder: Path) -> tuple[list[str], bool]:
    """Mutated inputs and flags (issue 16): write one case's files into `folder`; return (argv, invalid)."""
    which = rng.choice(["model", "model", "profile", "strategy", "bench", "flags-sim", "flags-comm", "flags-est",
                        "set", "units", "outputs"])
    if which == "model":
        base = resolve_model(rng.choice(["lenet5", "alexnet", "gpt2", "resnet50"])).read_text()
        data, invalid = _mutate_yaml(rng, base)
        f = _write(folder / "m.yaml", data)
        cmd = rng.choice([["model", "show", str(f), "--json"], ["estimate", str(f), "-c", "dgx-h100", "--json"],
                          ["simulate", str(f), "-c", "dgx-h100", "--dp", "2", "--json"]])
        return cmd, invalid
    if which == "profile":
        src = resolve_profile(rng.choice(["dgx-h100", "dgx1-p100", "gpu-2013"]))
        d = folder / "prof"
        d.mkdir(exist_ok=True)
        data, invalid = _mutate_yaml(rng, (src / "profile.yaml").read_text())
        _write(d / "profile.yaml", data)
        cmd = rng.choice([["estimate", "lenet5", "-c", str(d), "--json", "--model-only"],
                          ["comm", "allreduce", "--size", "1MB", "--ranks", "8", "-c", str(d), "--json"],
                          ["simulate", "lenet5", "-c", str(d), "--dp", "2", "--model-only", "--json"]])
        return cmd, invalid
    if which == "strategy":
        keys = {"dp": ["1", "2", "4"], "pp": ["1", "2"], "tp": ["1", "2"], "num_microbatches": ["1", "4"],
                "microbatch_size": ["1", "2"], "schedule": ["gpipe", "1f1b"], "sync": ["allreduce", "ps", "async"],
                "iterations": ["2"], "bucket_size_mib": ["25"], "zero": ["0", "1"], "recompute": ["none", "full"],
                "compression": ["{kind: topk, density: 0.01}", "{kind: qsgd, bits: 8}"]}
        lines, invalid = [], False
        for key in rng.sample(sorted(keys), rng.randrange(1, 5)):
            if rng.random() < 0.35:
                value = rng.choice(BAD_NUMBERS)
                invalid = invalid or value in INVALID_STRATEGY_VALUES
            else:
                value = rng.choice(keys[key])
            lines.append(f"{key}: {value}")
        text = "\n".join(lines) + "\n"
        if rng.random() < 0.2:
            mutated, bad = _mutate_yaml(rng, text)
            bad_lines = [line for line in lines if any(line.endswith(": " + v) for v in INVALID_STRATEGY_VALUES)]
            # a mutation may cut the bad line away (truncate, garbage): then only the mutation's own verdict holds
            invalid = bad or (invalid and isinstance(mutated, str) and all(line in mutated for line in bad_lines))
            text = mutated
        f = _write(folder / "s.yaml", text)
        return ["simulate", "lenet5", "-c", "dgx-h100", "--strategy", str(f), "--json"], invalid
    if which == "bench":
        data, invalid = _mutate_csv(rng, BENCH)
        f = _write(folder / "b.csv", data)
        return ["plan", "microbatch", "--bench-table", str(f), "--batch", rng.choice(["4", "8", "0", "100000"]),
                "--workspace-limit", rng.choice(["64MiB", "1KiB", "0", "-5MB", "64mib"]), "--json"], invalid
    if which == "flags-sim":
        flags = rng.sample(["--dp", "--tp", "--pp", "--num-microbatches", "--microbatch-size", "--iterations",
                            "--compression-density", "--jitter-cv", "--straggler-slowdown", "--nodes", "--staleness",
                            "--virtual-stages"], rng.randrange(1, 4))
        argv = ["simulate", rng.choice(["lenet5", "gpt2"]), "-c", "dgx-h100", "--json"]
        invalid = False
        for flag in flags:
            value = _flag_value(rng)
            argv += [flag, value]
            invalid = invalid or value in ("-1", "nan", "x", "99999999999999999999999") or (
                value == "0" and flag not in ("--staleness",))
        if "--iterations" in flags or "--staleness" in flags:
            argv += ["--sync", rng.choice(["ps", "async", "ssp", "allreduce"])]
        return argv, invalid
    if which == "flags-comm":
        size = rng.choice(AMOUNTS) + rng.choice(UNITS)
        bw = rng.choice(AMOUNTS) + rng.choice(UNITS)
        lat = rng.choice(AMOUNTS) + rng.choice(UNITS)
        ranks = _flag_value(rng)
        argv = ["comm", rng.choice(["allreduce", "allgather", "broadcast", "all-to-all", "gossip"]), "--size", size,
                "--ranks", ranks, "--latency", lat, "--bandwidth", bw, "--json"]
        return argv, ranks in ("-1", "0", "nan", "x", "99999999999999999999999")
    if which == "flags-est":
        batch = _flag_value(rng)
        dtype = rng.choice(["fp32", "bf16", "fp13", "int8", ""])
        argv = ["estimate", rng.choice(["lenet5", "resnet50", "gpt2"]), "-c", rng.choice(["dgx-h100", "nope"]),
                "--batch", batch, "--dtype", dtype, "--json"]
        return argv, dtype in ("fp13", "int8") or "nope" in argv or batch in ("-1", "0", "nan", "x", "1e9",
                                                                                  "99999999999999999999999")
    if which == "set":
        value = rng.choice(["[", "!!python/name:os.system", "{a: 1}", "9" * 5000, "'${9**9**9}'", "-1", "0",
                            "1e29", "[1, 2]", "12", "'${10**10**8}'", "&a [*a]", "x" * 100_000, ".nan"])
        model, key = rng.choice([("gpt2", "layers"), ("gpt2", "hidden"), ("resnet50", "width"), ("gpt2", "nokey")])
        return ["model", "show", model, "--set", f"{key}={value}", "--json"], value in (
            "[", "!!python/name:os.system", "{a: 1}", "9" * 5000, "'${9**9**9}'", "-1", "'${10**10**8}'",
            "&a [*a]", ".nan") or key == "nokey"
    if which == "units":
        value = rng.choice(AMOUNTS) + rng.choice(UNITS)
        argv = ["simulate", "lenet5", "-c", "dgx-h100", "--dp", "2", "--bucket-size", value, "--json"]
        return argv, not re.fullmatch(r"(1|10|100|0\.5)(B|b|kB|KB|MB|Mb|GB|Gb|MiB|GiB|)", value)
    out = folder / rng.choice(["o.json", "sub/o.json", "."])
    if rng.random() < 0.5 and out.name == "o.json":
        out.parent.mkdir(exist_ok=True)
        out.write_text("mine")
    argv = ["estimate", "lenet5", "-c", "dgx-h100", "--json", str(out)]
    return argv, out.name != "o.json" or out.exists()


KINDS = ("classic",) * 11 + tuple(ATTACKS)
"""How often each kind of case is drawn: the eleven kinds of mutated inputs and flags of issue 16 (one
`_classic_case`), and each attack of issue 29 (`fuzz_attacks`) as often as one of them."""


def make_case(rng: random.Random, folder: Path) -> Case:
    """Write one case's files into `folder` and return it (`fuzz_attacks.Case`)."""
    kind = rng.choice(KINDS)
    if kind == "classic":
        argv, invalid = _classic_case(rng, folder)
        return Case(argv, invalid, "classic")
    return ATTACKS[kind](rng, folder)


class _Timeout(BaseException):
    pass


def _alarm(_signum, _frame):
    raise _Timeout()


def _non_finite(text: str) -> bool:
    found = []
    try:
        json.loads(text, parse_constant=lambda c: found.append(c))
    except ValueError:
        pass
    return bool(found)


class _Captured:
    def __init__(self) -> None:
        self.text = ""

    def read(self) -> str:
        return self.text


@contextlib.contextmanager
def _fd2():
    """File descriptor 2 sent to a temporary file for the block: what the processes a command starts (a
    timing worker, MPI ranks) write to stderr, which `redirect_stderr` does not see, is read too."""
    captured = _Captured()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.text = sink.read().decode("utf-8", "replace")[-4000:]


def snapshot(folder: Path) -> dict[Path, tuple[str, str]]:
    """Every entry under `folder` (links not followed): its type and, for a regular file, its bytes' hash."""
    out: dict[Path, tuple[str, str]] = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(root) / name
            st = os.lstat(p)
            kind = stat.S_IFMT(st.st_mode)
            digest = ""
            if stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                digest = os.readlink(p)
            out[p] = (oct(kind), digest)
    return out


def _changed(before: dict, after: dict, writable: set[Path]) -> tuple[list[str], list[str]]:
    """(inputs changed or gone, special files replaced) between two snapshots."""
    changed, replaced = [], []
    for p, (kind, digest) in before.items():
        if p in writable:
            continue
        now = after.get(p)
        if kind not in (oct(stat.S_IFREG), oct(stat.S_IFDIR), oct(stat.S_IFLNK)):
            if now is None or now[0] != kind:
                replaced.append(p.name)
        elif now != (kind, digest) and kind != oct(stat.S_IFDIR):
            changed.append(p.name)
    return changed, replaced


def _written_non_finite(before: dict, folder: Path) -> bool:
    """A JSON output the run wrote that holds NaN or Infinity."""
    for p in folder.rglob("*"):
        if p.suffix in (".json", ".jsonl") and p.is_file() and not p.is_symlink():
            if before.get(p, ("", ""))[1] == hashlib.sha256(p.read_bytes()).hexdigest():
                continue
            text = p.read_text(errors="replace")
            lines = text.splitlines() if p.suffix == ".jsonl" else [text]
            if any(_non_finite(line) for line in lines):
                return True
    return False


def run_case(case: Case, folder: Path) -> dict:
    """Run one case in-process (its rival, if any, in another process at the same time) under a limit of
    `TIME_LIMIT_S` seconds of CPU (and `WALL_LIMIT_S` of wall clock) and classify the outcome."""
    from dlsim.cli import run
    before = snapshot(folder)
    out, err = io.StringIO(), io.StringIO()
    rival = subprocess.Popen([sys.executable, "-m", "dlsim", *case.rival], env=python_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True) if case.rival else None
    old = signal.signal(signal.SIGALRM, _alarm), signal.signal(signal.SIGPROF, _alarm)
    signal.setitimer(signal.ITIMER_PROF, TIME_LIMIT_S)
    signal.alarm(WALL_LIMIT_S)
    start = time.perf_counter()
    cpu0 = time.process_time()
    outcome = {"traceback": False, "internal_error": False, "slow": False, "invalid_accepted": False,
               "non_finite": False, "long_error": False, "input_changed": False, "special_replaced": False,
               "results_bad": False, "code": None, "kind": case.kind}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _fd2() as children:
            outcome["code"] = run(case.argv)
    except _Timeout:
        outcome["slow"] = True
    except SystemExit as exc:
        outcome["code"] = exc.code
    except BaseException as exc:  # noqa: BLE001  (an exception escaping the CLI is what we count)
        outcome["traceback"] = True
        outcome["exception"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old[0])
        signal.signal(signal.SIGPROF, old[1])
    outcome["seconds"] = time.perf_counter() - start
    outcome["cpu_seconds"] = time.process_time() - cpu0
    if outcome["cpu_seconds"] > TIME_LIMIT_S:
        outcome["slow"] = True
    stderr = err.getvalue() + children.read()
    if rival is not None:
        try:
            _, rival_err = rival.communicate(timeout=WALL_LIMIT_S)
        except subprocess.TimeoutExpired:
            rival.kill()
            rival_err = rival.communicate()[1]
            outcome["slow"] = True
        stderr += rival_err
    if "internal error" in stderr:
        outcome["internal_error"] = True
        outcome["exception"] = stderr[:300]
    if "Traceback" in stderr or "input too large to process" in stderr:
        outcome["traceback"] = True
        outcome["exception"] = stderr[:300]
    outcome["long_error"] = any(len(line) > MAX_ERROR_CHARS for line in stderr.splitlines())
    outcome["invalid_accepted"] = bool(case.invalid and outcome["code"] == 0)
    outcome["non_finite"] = outcome["code"] == 0 and (_non_finite(out.getvalue()) or _written_non_finite(before, folder))
    changed, replaced = _changed(before, snapshot(folder), case.writable)
    outcome["input_changed"], outcome["special_replaced"] = bool(changed), bool(replaced)
    problems = case.check() if case.check is not None else []
    outcome["results_bad"] = bool(problems)
    if changed or replaced or problems:
        outcome["detail"] = f"changed {changed[:3]} replaced {replaced[:3]} {problems[:2]}"
    outcome["stderr"] = stderr[-400:]
    return outcome


COUNTERS = ("traceback", "internal_error", "slow", "invalid_accepted", "non_finite", "long_error", "input_changed",
            "special_replaced", "results_bad")
NAMES = {"traceback": "tracebacks", "internal_error": "internal_errors", "slow": "runs_over_10s_cpu",
         "invalid_accepted": "invalid_accepted", "non_finite": "non_finite_outputs",
         "long_error": "error_lines_over_300_chars", "input_changed": "inputs_changed",
         "special_replaced": "special_files_replaced", "results_bad": "results_lost_or_duplicated"}


def failed(outcome: dict) -> bool:
    """Whether a case found a defect (any counter)."""
    return any(outcome[k] for k in COUNTERS)


def summarize(outcomes: list[dict]) -> dict:
    counts: dict = {"cases": len(outcomes)}
    for key in COUNTERS:
        counts[NAMES[key]] = sum(bool(o[key]) for o in outcomes)
    counts["exit_0"] = sum(o["code"] == 0 for o in outcomes)
    counts["exit_1"] = sum(o["code"] == 1 for o in outcomes)
    counts["exit_other"] = sum(o["code"] not in (0, 1) for o in outcomes)
    counts["by_kind"] = {k: sum(o["kind"] == k for o in outcomes) for k in sorted({o["kind"] for o in outcomes})}
    return counts
