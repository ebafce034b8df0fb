"""The fuzzer's attacks on what a run reads and writes (issue 29); used by tests/fuzzkit.py.

Each function writes one case's files into `folder` and returns a `Case`:
- `indirect`: an output aimed at a file the run reaches only indirectly (a model's ``extends:``, a
  profile's table outside its folder, a strategy or sweep spec, an imported ONNX file, a sweep's
  results file);
- `special`: an output aimed at a FIFO, a socket, a character device, a directory, a name too long
  or under a regular file;
- `concurrent`: two sweeps writing one results file at once (the second in another process);
- `resumed`: a sweep resuming a results file damaged by hand (NaN, a torn or foreign line, a status
  or point that is not its id's, a file that is not a results file at all);
- `bounds`: one command of every command with one option out of its bounds (`BOUNDS`: each value
  must be refused in one line, before any expensive step; a command that times, calibrates or
  builds a cluster is only ever given invalid values).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "hardware_profiles" / "cpu-epyc-2core"
TINY_SPEC = ("name: tiny\nmodels: [lenet5]\nclusters: [dgx-h100]\ngpus: [8]\nglobal_batch: 32\n"
             "grid: {tp: [1, 2], pp: [1, 2], microbatch_size: [1, 2]}\n")
TINY_POINTS = 8


@dataclass
class Case:
    """One fuzz case: the command line, whether its input is certainly invalid (it must then exit 1 or
    2), the files the run may change (every other file of the case folder must keep its type and
    bytes), a check of what it wrote, and a rival command run at the same time in another process."""

    argv: list[str]
    invalid: bool
    kind: str
    writable: set[Path] = field(default_factory=set)
    check: Callable[[], list[str]] | None = None
    rival: list[str] | None = None


# ------------------------------------------------------------------------------------ helpers
def _model_pair(folder: Path) -> tuple[Path, Path]:
    base = folder / "base.yaml"
    shutil.copy(ROOT / "models" / "lenet5.yaml", base)
    child = folder / "child.yaml"
    child.write_text("extends: base.yaml\nname: child\n")
    return base, child


def _cpu_profile(folder: Path, table_outside: bool = False) -> Path:
    prof = folder / "prof"
    shutil.copytree(CPU, prof, ignore=shutil.ignore_patterns("passes", "1thread", "median-run", "single-pass-run"))
    meta = prof / "meta.yaml"
    text = meta.read_text()
    if "\nhost:" in text:  # no timing of this host against the calibration's (seconds a case)
        import yaml
        data = yaml.safe_load(text)
        data.pop("host", None)
        meta.write_text(yaml.safe_dump(data))
    if table_outside:
        (folder / "tables").mkdir()
        (prof / "gemm.csv").rename(folder / "tables" / "gemm.csv")
        yaml_text = (prof / "profile.yaml").read_text().replace("gemm: gemm.csv", "gemm: ../tables/gemm.csv")
        (prof / "profile.yaml").write_text(yaml_text)
    return prof


def onnx_file(folder: Path, kind: str = "mlp", trips: int = 3) -> Path:
    """A small ONNX file in `folder`: one MatMul (``mlp``), or one Loop of `trips` iterations (``loop``)."""
    import onnx
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    if kind == "loop":
        body = helper.make_graph(
            [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Relu", ["x_in"], ["x_out"])], "b",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []),
             helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
             helper.make_tensor_value_info("x_in", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("x_out", TensorProto.FLOAT, None)])
        graph = helper.make_graph([helper.make_node("Loop", ["M", "cond", "x"], ["y"], body=body)], "g", [x], [y],
                                  initializer=[helper.make_tensor("M", TensorProto.INT64, [], [trips]),
                                               helper.make_tensor("cond", TensorProto.BOOL, [], [True])])
    else:
        w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], initializer=[w])
    path = folder / f"{kind}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _results_ids(path: Path) -> list[str]:
    ids = []
    for line in path.read_bytes().splitlines() if path.exists() else []:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("id"), str):
            ids.append(rec["id"])
    return ids


def _exactly_once(path: Path, total: int, before: bytes = b"") -> Callable[[], list[str]]:
    """A check: the results file holds every point of the spec once, and starts with what it held."""
    def check() -> list[str]:
        problems = []
        data = path.read_bytes() if path.exists() else b""
        ids = _results_ids(path)
        if not data.startswith(before):
            problems.append("results written before the run were changed")
        if len(ids) != len(set(ids)):
            problems.append(f"duplicated results: {len(ids) - len(set(ids))}")
        if len(set(ids)) not in (0, total) and data != before:
            problems.append(f"lost results: {total - len(set(ids))} of {total} points missing")
        return problems
    return check


def _sweep_spec(folder: Path) -> Path:
    spec = folder / "spec.yaml"
    spec.write_text(TINY_SPEC)
    return spec


# ------------------------------------------------------------------------------------ attacks
def indirect(rng: random.Random, folder: Path) -> Case:
    """An output aimed at an input the command line does not name (it must be refused, the input kept)."""
    what = rng.choice(["extends", "extends", "table", "strategy", "spec", "spec-model", "onnx", "results"])
    force = ["--force"] if rng.random() < 0.8 else []
    if what == "extends":
        base, child = _model_pair(folder)
        cmd = rng.choice([["model", "show", str(child), "--json"], ["estimate", str(child), "-c", "dgx-h100", "--json"],
                          ["simulate", str(child), "-c", "dgx-h100", "--dp", "2", "--trace"],
                          ["simulate", str(child), "-c", "dgx-h100", "--dp", "2", "--json"]])
        return Case(cmd + [str(base), *force], True, "indirect")
    if what == "table":
        prof = _cpu_profile(folder, table_outside=True)
        return Case(["estimate", "lenet5", "-c", str(prof), "--json", str(folder / "tables" / "gemm.csv"), *force],
                    True, "indirect")
    if what == "strategy":
        s = folder / "s.yaml"
        s.write_text("dp: 2\n")
        return Case(["simulate", "lenet5", "-c", "dgx-h100", "--strategy", str(s), rng.choice(["--json", "--trace"]),
                     str(s), *force], True, "indirect")
    spec = _sweep_spec(folder)
    if what == "spec":
        option = rng.choice(["--summary", "--out"])
        return Case(["sweep", str(spec), "--jobs", "1", option, str(spec), *force], True, "indirect")
    if what == "spec-model":
        model = folder / "m.yaml"
        shutil.copy(ROOT / "models" / "lenet5.yaml", model)
        spec.write_text(TINY_SPEC.replace("models: [lenet5]", f"models: [{model}]"))
        return Case(["sweep", str(spec), "--jobs", "1", "--out", str(model)], True, "indirect")
    if what == "onnx":
        path = onnx_file(folder)
        return Case(["import", "onnx", str(path), "--cluster", "dgx-h100", "--out", str(path), *force], True,
                    "indirect")
    results = folder / "r.jsonl"
    return Case(["sweep", str(spec), "--jobs", "1", "--out", str(results), "--summary", str(results), *force], True,
                "indirect")


def special(rng: random.Random, folder: Path) -> Case:
    """An output aimed at a special file or an impossible name: written into (a device) or refused."""
    kind = rng.choice(["fifo", "socket", "chardev", "directory", "long", "under-file", "trailing-slash", "dangling"])
    target: str
    invalid = True
    if kind == "fifo":
        target = str(folder / "pipe")
        os.mkfifo(target)
    elif kind == "socket":
        target = str(folder / "s.sock")
        server = socket.socket(socket.AF_UNIX)
        server.bind(target)
        server.close()  # the socket file stays
    elif kind == "chardev" and os.geteuid() == 0:
        target = str(folder / "null")
        os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        invalid = False
    elif kind == "directory":
        target = str(folder / "d")
        os.mkdir(target)
    elif kind == "under-file":
        (folder / "f").write_text("mine")
        target = str(folder / "f" / "o.json")
    elif kind == "trailing-slash":
        target = str(folder / "newdir") + "/"
    elif kind == "dangling":
        os.symlink(folder / "missing" / "o.json", folder / "link")
        target, invalid = str(folder / "link"), False  # written through the link, at its target
    else:
        target = str(folder / ("x" * rng.choice([256, 300, 5000])))
    spec = _sweep_spec(folder)
    cmd = rng.choice([["model", "show", "lenet5", "--json"], ["estimate", "lenet5", "-c", "dgx-h100", "--json"],
                      ["simulate", "lenet5", "-c", "dgx-h100", "--dp", "2", "--trace"],
                      ["comm", "allreduce", "--size", "1MB", "--ranks", "8", "-c", "dgx-h100", "--json"],
                      ["sweep", str(spec), "--jobs", "1", "--summary"],
                      ["compare", "lenet5", "-c", "dgx-h100", "--grid", "dp=1,2", "--csv"]])
    writable = {folder / "missing" / "o.json", folder / "missing", folder / "spec.results.jsonl",
                folder / "spec.results.jsonl.lock"}
    return Case(cmd + [target] + (["--force"] if rng.random() < 0.7 else []), invalid, "special", writable)


def concurrent(rng: random.Random, folder: Path) -> Case:
    """Two sweeps on one results file at once: every point recorded exactly once, never twice."""
    spec = _sweep_spec(folder)
    results = folder / "r.jsonl"
    argv = ["sweep", str(spec), "--out", str(results), "--jobs", "1"]
    return Case(argv, False, "concurrent", {results, Path(str(results) + ".lock")},
                _exactly_once(results, TINY_POINTS), rival=list(argv))


DAMAGE = ("nan", "infinity", "torn-middle", "status", "point", "garbage", "other-kind", "negative", "not-results",
          "torn-tail", "deleted", "empty")


def resumed(rng: random.Random, folder: Path) -> Case:
    """A sweep resuming a results file damaged by hand: a damaged line refused (file untouched), a torn
    tail or a missing line resumed with every point once."""
    from dlsim.api.sweep import run_sweep
    from dlsim.io.sweep_spec import load_sweep
    spec = _sweep_spec(folder)
    results = folder / "r.jsonl"
    run_sweep(load_sweep(spec), results, jobs=1)
    lines = results.read_bytes().splitlines(keepends=True)
    damage = rng.choice(DAMAGE)
    i = rng.randrange(len(lines) - 1)
    rec = json.loads(lines[i])
    if damage in ("nan", "infinity", "negative"):
        rec.update(status="ok", iteration_time_s={"nan": float("nan"), "infinity": float("inf")}.get(damage, -1.0),
                   throughput_samples_per_s=1.0)
        lines[i] = (json.dumps(rec) + "\n").encode()
    elif damage == "torn-middle":
        lines[i] = lines[i][: len(lines[i]) // 2] + b"\n"
    elif damage == "status":
        lines[i] = (json.dumps({**rec, "status": "done"}) + "\n").encode()
    elif damage == "point":
        lines[i] = (json.dumps({**rec, "point": {**rec["point"], "tp": 64}}) + "\n").encode()
    elif damage == "garbage":
        lines[i] = bytes(rng.randrange(256) for _ in range(40)).replace(b"\n", b" ") + b"\n"
    elif damage == "other-kind":
        lines[i] = (json.dumps({**rec, "kind": "simulation"}) + "\n").encode()
    elif damage == "not-results":
        lines = [b"# my notes\n", b"no newline at the end"]
    elif damage == "torn-tail":
        lines = lines[:-1] + [lines[-1][: len(lines[-1]) // 2]]
    elif damage == "deleted":
        del lines[i]
    else:
        lines = []
    data = b"".join(lines)
    results.write_bytes(data)
    refused = damage not in ("torn-tail", "deleted", "empty")
    kept = data if refused else data[: data.rfind(b"\n") + 1]
    check = _exactly_once(results, TINY_POINTS, kept) if not refused else None
    argv = ["sweep", str(spec), "--out", str(results), "--jobs", "1", *(["--json"] if rng.random() < 0.5 else [])]
    return Case(argv, refused, "resumed", set() if refused else {results, Path(str(results) + ".lock")}, check)


# ------------------------------------------------------------------------------------ bounds
HUGE = "1000000000000"
BIG = str(10**30)


def _factory(folder: Path) -> str:
    source = folder / "fac.py"
    source.write_text("import sys\nimport torch\n\ndef net():\n    return torch.nn.Linear(4, 4)\n\n"
                      "def exits():\n    sys.exit(3)\n\ndef zero():\n    sys.exit(0)\n\ndef boom():\n"
                      "    raise RuntimeError('no GPU')\n\ndef nothing():\n    return 3\n")
    return str(source)


def _bounds(folder: Path) -> list[tuple[list[str], str, list[str]]]:
    """(command line, option, values each of which the command must refuse before any work)."""
    spec = str(_sweep_spec(folder))
    cpu = str(CPU)
    fac = _factory(folder)
    opt = ["optimize", "gpt2", "-c", "dgx-h100", "--gpus", "8", "--global-batch", "64"]
    cmp = ["compare", "lenet5", "-c", "dgx-h100", "--grid", "dp=1,2"]
    comm = ["comm", "allreduce", "--size", "1MB", "--ranks", "8", "-c", "dgx-h100"]
    plan = ["plan", "microbatch", "alexnet", "-c", "dgx-h100", "--batch", "4"]
    vmodel = ["validate", "model", "lenet5", "-c", cpu]
    vkern = ["validate", "kernels", "-c", cpu]
    vddp = ["validate", "ddp", "lenet5", "-p", cpu]
    vgpu = ["validate", "gpu", "--device", "cpu", "--out", str(folder / "vg")]
    vtorch = ["validate", "torch", f"{fac}:net", "--input-shape", "4", "-c", cpu, "--batch", "2"]
    ccomp = ["calibrate", "compute", "--out", str(folder / "cc")]
    ccomm = ["calibrate", "comm", "--out", str(folder / "cm")]
    cmb = ["calibrate", "microbatch", "lenet5", "--out", str(folder / "t.csv"), "--batch", "2"]
    torch_imp = ["import", "torch", f"{fac}:net", "--input-shape", "4"]
    return [
        (["estimate", "lenet5", "-c", "dgx-h100"], "--batch", ["-1", "0", "nan", BIG, HUGE]),
        (["model", "show", "gpt2"], "--batch", ["-1", "0", BIG, HUGE]),
        (opt, "--gpus", ["0", "-1", HUGE]), (opt, "--global-batch", ["0", "-1", HUGE, BIG]),
        (opt, "--top", ["0", "1001"]), (opt, "--max-simulations", ["0", "100000"]),
        (opt, "--max-microbatch-size", ["0", str(2**21)]), (opt, "--nodes", ["0", "-1", HUGE]),
        (opt, "--cp", ["0", "x", "1,-2"]), (opt, "--fix", ["tp=0", "tp=x", "bogus=1", "tp", "tp=3"]),
        (opt, "--schedules", ["nope", ","]), (opt, "--offload", ["nope", ","]),
        (opt, "--max-memory-fraction", ["0", "2", "nan"]), (opt, "--jobs", ["0", "65"]),
        (cmp, "--global-batch", ["0", "-1", HUGE]), (cmp, "--nodes", ["0", "-1", HUGE]),
        (cmp, "--gpus", ["0", "-8", "x", HUGE]), (cmp, "--jobs", ["0", "300"]),
        (["compare", "lenet5", "-c", "dgx-h100"], "--grid", ["dp=0", "dp=x", "bogus=1", "dp="]),
        (comm, "--ranks", ["0", "-1", HUGE]), (comm, "--size", ["-1MB", "nan", "1e400GB", "x"]),
        (["comm", "allreduce", "--ranks", "8", "-c", "dgx-h100"], "--sweep", ["1MB:1KB", "x:1MB", "1KB:1MB:1"]),
        (comm, "--bandwidth", ["10", "0GB/s", "-1GB/s", "10GB"]), (comm, "--latency", ["-1us", "nanus", "5parsec"]),
        (comm, "--segments", ["0", "-1"]), (comm, "--fanout", ["0", "-1"]), (comm, "--rounds", ["0", "-1"]),
        (plan, "--batch", ["0", "-1", "100000"]), (plan, "--workspace-limit", ["-5MB", "x", "nan"]),
        (plan + ["--mode", "wd"], "--gap", ["-0.1", "1", "2"]), (plan + ["--mode", "wd"], "--time-limit", ["-1s", "x"]),
        (["sweep", spec, "--out", str(folder / "r.jsonl")], "--jobs", ["0", "2000"]),
        (["sweep", spec, "--out", str(folder / "r.jsonl")], "--dask-local", ["0", "300"]),
        (["import", "onnx", "LOOP"], "--batch", ["0", "-1"]),
        (["import", "onnx", "HUGE_LOOP", "--cluster", "dgx-h100"], "--name", ["", "x\ny"]),
        (torch_imp, "--batch", ["1", "0", "-1"]), (torch_imp, "--input-shape", ["0", "x", "-4", ""]),
        (["import", "torch", "--input-shape", "4"], "FACTORY", [f"{fac}:exits", f"{fac}:zero", f"{fac}:boom",
                                                              f"{fac}:nothing", f"{fac}:missing", "nofile.py:f"]),
        (torch_imp + ["--tokens"], "--vocab", ["0", "-1"]),
        (vmodel, "--batch", ["0", "-1", HUGE]), (vmodel, "--repeats", ["0", "-1"]), (vmodel, "--warmup", ["-1"]),
        (vmodel, "--threads", ["0", "-1"]), (vmodel, "--dtype", ["", "bogus"]),
        (vkern, "--gemms", ["-1"]), (vkern, "--convs", ["-1"]), (vkern, "--dtype", ["bogus", ""]),
        (vkern, "--repeats", ["0"]), (vkern, "--passes", ["0"]), (vkern, "--anchors", ["-1"]),
        (vddp, "--bucket-mib", ["nan", "-1", "0", "1e30", "inf"]), (vddp, "--rate", ["10", "x", "", "-5mbit"]),
        (vddp, "--repeats", ["0", "-1"]), (vddp, "--warmup", ["-1"]), (vddp, "--batch", ["0", "-1"]),
        (vtorch, "--repeats", ["0"]), (vtorch, "--warmup", ["-1"]), (vtorch, "--threads", ["0", "-1"]),
        (vtorch, "--input-shape", ["0", "x"]),
        (vgpu, "--budget", ["0", "-1", "x", "nan", "1e30", "2d"]), (vgpu, "--threads", ["0", "-1"]),
        (ccomp, "--repeats", ["0", "-1"]), (ccomp, "--passes", ["0"]), (ccomp, "--threads", ["0", "-1"]),
        (ccomp, "--dtype", ["bogus", ""]), (ccomp + ["--model", "lenet5"], "--batch", ["0", "-1"]),
        (ccomm, "--ranks", ["0", "-1"]), (ccomm, "--budget", ["0", "-1", "nan"]), (ccomm, "--max-reps", ["0", "-1"]),
        (ccomm, "--sizes", ["x", "1KB:1B"]), (ccomm, "--idle-gap", ["-1s", "x"]),
        (cmb, "--repeats", ["0", "-1"]), (cmb, "--threads", ["0"]), (cmb, "--max-workspace", ["-1MB", "x"]),
        (cmb, "--passes", ["bogus"]), (cmb, "--algorithms", ["bogus"]),
        (["calibrate", "microbatch", "lenet5", "--out", str(folder / "t.csv")], "--batch", ["0", "-1", "100000"]),
        (["plot", "TRACE", "-o", str(folder / "p.png")], "--devices", ["0", "-1", "5000"]),
        (["simulate", "gpt2", "-c", "dgx-h100"], "--global-batch", ["0", "-1", HUGE]),
        (["simulate", "gpt2", "-c", "dgx-h100"], "--nodes", ["0", "-1", HUGE]),
        (["run", "gpt2", "-c", "dgx-h100"], "--tokens", ["-1", "x", "0", "1e30"]),
        (["run", "gpt2", "-c", "dgx-h100", "--tokens", "1T"], "--trials", ["-1", "1000000"]),
        (["run", "gpt2", "-c", "dgx-h100", "--tokens", "1T"], "--pue", ["0", "nan", "-1"]),
        (["run", "gpt2", "-c", "dgx-h100", "--tokens", "1T"], "--scale", ["0", "x", HUGE]),
        (["run", "gpt2", "-c", "dgx-h100", "--tokens", "1T"], "--checkpoint-interval", ["-1s", "x"]),
        (["run", "gpt2", "-c", "dgx-h100", "--tokens", "1T"], "--storage-write-per-node", ["0", "-1"]),
        (["run", "gpt2", "-c", "dgx-h100", "--tokens", "1T"], "--batch-schedule", ["x", "0:1T", "1024:-1"]),
        (["stacks", "show"], "NAME", ["bogus", "", str(folder / "missing.yaml")]),
        (["stacks", "diff", "pytorch"], "NAME", ["bogus", "", str(folder / "missing.yaml")]),
    ]


COMMANDS_WITHOUT_BOUNDS = {"models": "lists the zoo: no option to bound", "profiles": "lists profiles: none",
                           "stacks": "lists stacks: none"}
"""Commands the `bounds` attack does not cover, and why; every other command must be in `_bounds`."""


def bounded_commands(folder: Path) -> set[str]:
    """The commands (``validate ddp``, ``estimate``) that `_bounds` gives out-of-bounds options."""
    out = set()
    for argv, _, _ in _bounds(folder):
        out.add(" ".join(argv[:2]) if argv[0] in ("plan", "import", "validate", "calibrate", "model", "stacks")
                else argv[0])
    return out


def bounds(rng: random.Random, folder: Path) -> Case:
    """One command with one option out of its bounds: refused in one line, quickly."""
    argv, option, values = rng.choice(_bounds(folder))
    value = rng.choice(values)
    argv = list(argv)
    if "LOOP" in argv or "HUGE_LOOP" in argv:
        path = str(onnx_file(folder, "loop", 10**18 if "HUGE_LOOP" in argv else 3))
        argv = [path if a in ("LOOP", "HUGE_LOOP") else a for a in argv]
    if "TRACE" in argv:
        trace = folder / "t.json"
        trace.write_text(json.dumps({"traceEvents": [], "otherData": {"makespan_s": 0.0}}))
        argv = [str(trace) if a == "TRACE" else a for a in argv]
    if option in ("FACTORY", "NAME"):
        argv.insert(2, value)
    else:
        argv += [option, value]
    return Case(argv, True, "bounds", {folder / "cc", folder / "cm"})


ATTACKS: dict[str, Callable[[random.Random, Path], Case]] = {
    "indirect": indirect, "special": special, "concurrent": concurrent, "resumed": resumed, "bounds": bounds}


def python_env() -> dict[str, str]:
    """The environment of a rival process: this interpreter's import path, no progress bar."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "DLSIM_PROGRESS": "0"}
