"""`dlsim validate gpu` (issue 33): the budget, the CUDA-specific calls with fakes, a run cut short, the report.

The whole command at its CPU sizes takes one to two minutes: `test_cpu_run_end_to_end` is marked slow and
`benchmarks/validate_gpu_cpu.py` runs it; the tests here run one small network with a clock that ends the
budget early, so every phase runs its cut path in seconds.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from dlsim.errors import DlsimError
from dlsim.validate.gpu_suite import (COMPILE_ORDER, CPU_CASES, CUDA_CASES, PHASES, Budget, StepCase, scale_for,
                                      step_cases)


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_budget_phases_end_at_their_cumulative_share_and_leftover_time_carries():
    clock = FakeClock()
    b = Budget(100.0, clock)
    usable = 100.0 - b.reserve_s
    assert b.reserve_s == pytest.approx(3.0)
    assert b.phase_left("device") == pytest.approx(usable * PHASES[0][1])
    clock.now += 1.0  # the device phase took 1 s: the GEMM phase may run until both shares are spent
    assert b.phase_left("gemm") == pytest.approx(usable * (PHASES[0][1] + PHASES[1][1]) - 1.0)
    assert b.phase_left("compiled") == pytest.approx(usable - 1.0) == pytest.approx(b.left())
    stop = b.stop("steps")
    assert not stop()
    clock.now += 1000.0
    assert stop() and b.left() == 0.0 and b.phase_left("compiled") == 0.0
    with pytest.raises(ValueError):
        Budget(0.0)


def test_cases_scales_and_their_records():
    assert [c.key for c in CPU_CASES] == [c.key for c in CUDA_CASES]
    assert set(COMPILE_ORDER) == {c.key for c in CPU_CASES}
    assert step_cases("cuda") == CUDA_CASES and step_cases("cpu") == CPU_CASES
    for case in CUDA_CASES + CPU_CASES:
        assert StepCase.from_dict(json.loads(json.dumps(case.to_dict()))) == case
    full, short = scale_for("cuda", 480.0), scale_for("cuda", 120.0)
    assert full.repeats == 5 and short.repeats == 3 and short.min_step_s < full.min_step_s
    assert max(scale_for("cpu", 480.0).gemm_sizes) < max(full.gemm_sizes)
    assert all(n % 16 == 0 for n in full.gemm_sizes)  # every square GEMM also runs in FP8


def test_small_resnet_is_channels_last_at_the_cpu_image_size():
    from dlsim.api.validate_gpu_compare import case_model
    resnet = next(c for c in CPU_CASES if c.channels_last)
    model = case_model(resnet, "cpu")
    assert model.input_shape == (3, 32, 32)
    assert {layer.attrs["memory_format"] for layer in model.layers if layer.type == "conv2d"} == {"channels_last"}
    gpu = case_model(next(c for c in CUDA_CASES if c.channels_last), "cuda")
    assert gpu.input_shape == (3, 224, 224) and gpu.params == 25_557_032
    llama = case_model(CUDA_CASES[0], "cuda")
    assert llama.params == 1_100_048_384 and llama.input_shape == (2048,)


def test_builtin_profile_is_the_one_naming_the_gpu_model():
    from dlsim.api.validate_gpu import builtin_profile, device_slug
    assert builtin_profile("cuda", "NVIDIA H200")[0] == "dgx-h200"
    assert builtin_profile("cuda", "NVIDIA H100 80GB HBM3")[0] == "dgx-h100"
    assert builtin_profile("cuda", "NVIDIA A100-SXM4-80GB")[0] == "dgx-a100"
    name, why = builtin_profile("cuda", "Tesla V100-SXM2-16GB")
    assert name == "aws-p3" and "dgx1-v100" in why
    assert builtin_profile("cuda", "NVIDIA GeForce RTX 4090")[0] is None
    assert builtin_profile("cuda", "NVIDIA H200", "dgx-h100") == ("dgx-h100", "given with --builtin")
    assert builtin_profile("cpu", "AMD EPYC")[0] == "cpu-epyc-2core"
    assert device_slug("cuda", "NVIDIA H200") == "nvidia-h200" and device_slug("cpu", "AMD EPYC (2 cores)") == "cpu"


def test_budget_text():
    from dlsim.cli.validate import parse_budget
    assert parse_budget("8m") == 480.0 and parse_budget("90s") == 90.0 and parse_budget("2min") == 120.0
    assert parse_budget("0.5h") == 1800.0 and parse_budget("45") == 45.0
    for bad in ("0", "5 m", "eight", "1e30", "25h"):  # 1e30 s overflowed the clock: an internal error
        with pytest.raises(DlsimError):
            parse_budget(bad)


# ------------------------------------------------------------------------------ the CUDA calls, with fakes
class FakeEvent:
    log: list[str] = []

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.at = None

    def record(self) -> None:
        FakeEvent.log.append("record")
        self.at = len(FakeEvent.log)

    def synchronize(self) -> None:
        FakeEvent.log.append("sync")

    def elapsed_time(self, end: "FakeEvent") -> float:
        return 2.0 * (end.at - self.at)  # milliseconds


def test_event_block_timer_times_the_calls_between_two_events():
    from dlsim.calibrate.compute_timer import KernelTimer
    from dlsim.calibrate.cuda_calls import EventBlockTimer
    FakeEvent.log = []
    timer = EventBlockTimer(SimpleNamespace(Event=FakeEvent))
    seconds = timer(lambda: FakeEvent.log.append("call"), 3)
    assert FakeEvent.log == ["record", "call", "call", "call", "record", "sync"]
    assert seconds == pytest.approx(2.0 * 4 * 1e-3 / 3)
    blocks = []
    kt = KernelTimer("cpu", repeats=3, min_block_s=0.0, block_timer=lambda fn, calls: blocks.append(calls) or 1e-3)
    assert kt.time(lambda: None).seconds == 1e-3 and len(blocks) == 2 + 3 and "CUDA events" in kt.method
    assert KernelTimer("cpu", events=True).block_timer is None  # events exist on CUDA only


class FakeTensor:
    def __init__(self, shape: tuple, dtype: str = "float32"):
        self.shape, self.dtype = shape, dtype

    def to(self, dtype: str) -> "FakeTensor":
        return FakeTensor(self.shape, dtype)

    def t(self) -> "FakeTensor":
        return FakeTensor(self.shape[::-1], self.dtype)


def fake_torch(capability: tuple[int, int] = (9, 0), scaled_mm: object = None, fp8: bool = True) -> SimpleNamespace:
    calls: list[tuple] = []
    def mm(a, b, scale_a, scale_b, out_dtype):
        calls.append((a.shape, b.shape, a.dtype, b.dtype, out_dtype))
        return FakeTensor((a.shape[0], b.shape[1]), out_dtype)
    ns = SimpleNamespace(__version__="9.9", float32="float32", bfloat16="bfloat16", calls=calls,
                         Generator=lambda device=None: SimpleNamespace(manual_seed=lambda s: None),
                         randn=lambda *shape, generator=None, device=None: FakeTensor(shape),
                         ones=lambda shape, device=None, dtype=None: FakeTensor(shape, dtype),
                         cuda=SimpleNamespace(get_device_capability=lambda i: capability))
    if fp8:
        ns.float8_e4m3fn = "float8_e4m3fn"
        ns._scaled_mm = scaled_mm or mm
    return ns


def test_fp8_support_needs_the_types_capability_8_9_and_a_working_product():
    from dlsim.calibrate.cuda_calls import fp8_matmul, fp8_support
    ok, why = fp8_support("cuda", fake_torch(fp8=False))
    assert not ok and "no float8_e4m3fn" in why
    ok, why = fp8_support("cuda", fake_torch((8, 0)))
    assert not ok and "8.0" in why
    t = fake_torch((9, 0))
    ok, why = fp8_support("cuda", t)
    assert ok and t.calls == [((16, 16), (16, 16), "float8_e4m3fn", "float8_e4m3fn", "bfloat16")]
    def broken(*args, **kwargs):
        raise RuntimeError("Multiplication of two Float8_e5m2 matrices is not supported\nmore")
    ok, why = fp8_support("cuda", fake_torch((9, 0), broken))
    assert not ok and why.endswith("RuntimeError: Multiplication of two Float8_e5m2 matrices is not supported")
    fp8_matmul(32, 48, 64, "cuda", t)()
    assert t.calls[-1][:2] == ((32, 64), (64, 48))  # B stored (n, k) and transposed: column-major
    with pytest.raises(DlsimError, match="multiple of 16"):
        fp8_matmul(30, 32, 32, "cuda", t)


def test_sdpa_backend_selection_with_a_fake_module():
    from dlsim.calibrate.cuda_calls import SDPA_BACKENDS, sdpa_backend
    chosen = []
    backends = SimpleNamespace(**{v: v for v in SDPA_BACKENDS.values()})
    fake = SimpleNamespace(nn=SimpleNamespace(attention=SimpleNamespace(
        SDPBackend=backends, sdpa_kernel=lambda ks: chosen.append(ks) or "context")))
    assert sdpa_backend("efficient", fake) == "context" and chosen == [["EFFICIENT_ATTENTION"]]
    with pytest.raises(DlsimError, match="unknown SDPA backend"):
        sdpa_backend("xformers", fake)


def test_nvidia_smi_facts(monkeypatch):
    from dlsim.calibrate import compute_hostinfo as hi
    monkeypatch.setattr(hi.shutil, "which", lambda exe: "/usr/bin/nvidia-smi")
    seen = []
    def run(cmd, **kwargs):
        seen.append(cmd)
        return SimpleNamespace(returncode=0, stdout="550.54.15, 1980, 3201, 700.00, [N/A], 16\n")
    monkeypatch.setattr(hi.subprocess, "run", run)
    got = hi.nvidia_smi()
    assert got == {"driver": "550.54.15", "sm_clock_max_mhz": "1980", "memory_clock_max_mhz": "3201",
                   "power_limit_w": "700.00", "pcie_link_width_max": "16"}
    assert "--query-gpu=driver_version,clocks.max.sm" in seen[0][2]
    props = SimpleNamespace(total_memory=150_000_000_000, multi_processor_count=132, L2_cache_size=52_428_800)
    fake = SimpleNamespace(cuda=SimpleNamespace(get_device_properties=lambda i: props,
                                                get_device_capability=lambda i: (9, 0),
                                                get_device_name=lambda i: "NVIDIA H200", device_count=lambda: 1),
                           version=SimpleNamespace(cuda="12.8"), backends=SimpleNamespace(
                               cudnn=SimpleNamespace(version=lambda: 91002)))
    facts = hi.cuda_facts(fake)
    assert facts["device"] == "NVIDIA H200" and facts["compute_capability"] == "9.0"
    assert facts["multiprocessors"] == 132 and facts["sm_clock_max_mhz"] == 1980.0 and facts["driver"] == "550.54.15"
    monkeypatch.setattr(hi.shutil, "which", lambda exe: None)
    assert hi.nvidia_smi() == {}
    monkeypatch.setattr(hi.shutil, "which", lambda exe: "/x")
    monkeypatch.setattr(hi.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(subprocess.TimeoutExpired("x", 1)))
    assert hi.nvidia_smi() == {}


@pytest.mark.torch
def test_fp8_copy_and_swiglu_kernels_run_here():
    torch = pytest.importorskip("torch")
    from dlsim.calibrate.compute_ops import copy_fn, gemm_fn, memory_op
    from dlsim.calibrate.cuda_calls import fp8_support
    from dlsim.cost.layers import Gemm
    from dlsim.spec.model import build_model
    cpu = torch.device("cpu")
    if fp8_support("cpu")[0]:
        assert tuple(gemm_fn(Gemm(32, 16, 48), "fp8", cpu)().shape) == (32, 16)
    with pytest.raises(DlsimError, match="batched FP8"):
        gemm_fn(Gemm(32, 32, 32, 4), "fp8", cpu)
    fn, nbytes = copy_fn(1000, "bf16", cpu)
    assert nbytes == 4000 and fn().dtype == torch.bfloat16
    layer = build_model("g", "bf16", (4, 64), "tensor", [{"name": "act", "type": "swiglu"}]).layers[0]
    assert tuple(memory_op(layer, 2, "forward", "bf16", cpu)().shape) == (2, 4, 32)
    assert len(memory_op(layer, 2, "backward_data", "bf16", cpu)()) == 1


@pytest.mark.torch
def test_sdpa_backends_here_one_runs_one_is_unavailable():
    torch = pytest.importorskip("torch")
    from dlsim.calibrate.compute_timer import KernelTimer
    from dlsim.calibrate.kernel_families import time_sdpa
    timer = KernelTimer("cpu", repeats=1, min_block_s=0.0)
    flash = time_sdpa((1, 2, 32, 16), "flash", "backward_data", "fp32", torch.device("cpu"), timer)
    assert flash["status"] == "measured" and flash["time_s"] > 0 and flash["flops"] > 0
    efficient = time_sdpa((1, 2, 32, 16), "efficient", "forward", "fp32", torch.device("cpu"), timer)
    assert efficient["status"] == "unavailable" and "\n" not in efficient["reason"]


@pytest.mark.torch
def test_a_calibration_stops_when_told_and_keeps_its_rows(tmp_path):
    from dlsim.calibrate.compute_plan import square_gemms
    from dlsim.calibrate.compute_run import Backend, run_calibration
    from dlsim.calibrate.compute_timer import KernelTimer
    asked = []
    tasks = square_gemms(["fp32"], (4, 8, 16, 32))
    s = run_calibration(tasks, tmp_path, Backend.create("cpu"), KernelTimer("cpu", repeats=1, min_block_s=0.0),
                        device_params=False, stop=lambda: asked.append(1) or len(asked) > 2)
    assert (s.measured, s.stopped) == (2, 2)
    assert len((tmp_path / "gemm.csv").read_text().splitlines()) == 1 + 2


@pytest.mark.torch
def test_amp_runner_keeps_fp32_parameters_and_channels_last_input():
    torch = pytest.importorskip("torch")
    from dlsim.api.validate_gpu_compare import case_model
    from dlsim.calibrate.compute_ops import make_optimizer
    from dlsim.validate.compute_iteration import IterationRunner
    resnet = next(c for c in CPU_CASES if c.channels_last)
    run = IterationRunner(case_model(resnet, "cpu"), 2, make_optimizer, amp="bf16")
    assert run.x.is_contiguous(memory_format=torch.channels_last) and run.x.dtype == torch.float32
    gpt = CPU_CASES[2]
    run = IterationRunner(case_model(gpt, "cpu"), 1, make_optimizer, amp=gpt.amp, attention="sdpa")
    f, b, o = run.step()
    assert min(f, b, o) > 0 and {p.dtype for p in run.net.parameters()} == {torch.float32}
    assert all(p.grad is not None for p in run.net.parameters() if p.requires_grad)


# ------------------------------------------------------------------------------------ a run cut short
@pytest.fixture(scope="module")
def cut_run(tmp_path_factory):
    """One small network on the CPU, the clock jumping past the budget when the steps phase starts."""
    pytest.importorskip("torch")
    from dlsim.api import validate_gpu as vg
    tmp_path = tmp_path_factory.mktemp("cut")
    small = scale_for("cpu", 60.0)
    clock = FakeClock(0.0)
    messages = []
    def progress(text: str) -> None:
        messages.append(text)
        if text.startswith("steps:"):
            clock.now += 10_000.0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vg, "scale_for", lambda device, budget: type(small)(**{
            **small.__dict__, "gemm_sizes": (16, 32), "elements": (4096,), "sdpa_shapes": ((1, 2, 32, 16),),
            "adam_params": (2**12,), "repeats": 1}))
        mp.setattr(vg, "step_cases", lambda device: (CPU_CASES[2],))
        rec = vg.validate_gpu(tmp_path, device="cpu", budget_s=600.0, compile_backend="eager", clock=clock,
                              progress=progress, command="test")
    return tmp_path, rec, messages


@pytest.mark.torch
def test_a_run_cut_by_the_budget_keeps_what_it_measured(cut_run):
    out, rec, messages = cut_run
    work = out / "validation-gpu-cpu"
    records = [json.loads(line) for line in (work / "records.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in records]
    assert kinds[:3] == ["run", "device", "phase"] and kinds[-1] == "end"
    gemm = next(r for r in records if r["kind"] == "calibration" and r["phase"] == "gemm")
    assert gemm["measured"] > 6 and not gemm["failed"] and not gemm["stopped"]
    later = [r for r in records if r["kind"] == "calibration" and r["phase"] != "gemm"]
    assert later and all(r["measured"] == 0 and r["stopped"] > 0 for r in later)
    steps = [r for r in records if r["kind"] == "step"]
    assert [(r["mode"], r["status"]) for r in steps] == [("eager", "cut"), ("compiled", "cut")]
    assert "not started" in steps[0]["reason"]
    assert (work / "cpu-measured" / "profile.yaml").exists() and (work / "cpu-measured" / "gemm.csv").exists()
    summary = json.loads((out / "validation-gpu-cpu.json").read_text())
    assert summary == json.loads(json.dumps(rec)) and summary["finished"] and summary["calibrated_profile_written"]
    assert {p["phase"]: p["status"] for p in summary["phases"]} == {
        "device": "done", "gemm": "done", "steps": "stopped", "kernels": "stopped", "families": "stopped",
        "compiled": "stopped"}
    assert {r["status"] for r in summary["networks"]} == {"cut"}
    fams = {f["family"] for f in summary["kernel_families"]}
    assert {"gemm-square-bf16", "gemm-square-fp16", "gemm-networks-bf16"} <= fams
    md = (out / "validation-gpu-cpu.md").read_text()
    assert "| gemm-square-bf16 |" in md and "cut: not started" in md and messages[0].startswith("device")


@pytest.mark.torch
def test_a_run_killed_midway_still_reports_what_it_recorded(cut_run, cli, tmp_path):
    from dlsim.api.validate_gpu import report_gpu
    import shutil
    out = tmp_path / "copy"
    shutil.copytree(cut_run[0], out)
    work = out / "validation-gpu-cpu"
    lines = (work / "records.jsonl").read_text().splitlines()
    gemm_done = next(i for i, line in enumerate(lines) if '"phase":"gemm"' in line and '"kind":"phase"' in line)
    (work / "records.jsonl").write_text("\n".join(lines[:gemm_done + 1]) + "\n" + lines[gemm_done + 1][:25])
    rec = report_gpu(work)
    assert not rec["finished"] and rec["not_reached"] == ["steps", "kernels", "families", "compiled"]
    assert rec["networks"] == [] and any(f["family"] == "gemm-square-bf16" for f in rec["kernel_families"])
    assert "did not finish" in (out / "validation-gpu-cpu.md").read_text()
    code, text, err = cli("validate", "gpu", "--device", "cpu", "--report-only", "--out", out)
    assert code == 0 and "not reached within the budget: steps, kernels, families, compiled" in text


@pytest.mark.torch
def test_bad_input_is_one_line(cli, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for args, reason in ((["--device", "cuda"], "no CUDA device"), (["--device", "cpu", "--budget", "0"], "positive"),
                         (["--device", "cpu", "--budget", "5 m"], "unknown time unit"),
                         (["--device", "cpu", "--report-only"], "no run of dlsim validate gpu"),
                         (["--device", "cpu", "--builtin", "nonesuch"], "no such profile")):
        code, out, err = cli("validate", "gpu", "--out", tmp_path / "r", *args)
        assert code == 1 and err.count("\n") == 1 and reason in err, (args, err)
    assert not (tmp_path / "r").exists()


@pytest.mark.torch
@pytest.mark.slow
def test_cpu_run_end_to_end(tmp_path, cli):
    """The whole command at its CPU sizes (about 100 s on 2 cores; the run ends when its work is done, the
    budget is a cap, generous here so that a busy machine does not cut it): every phase, every network eager
    and compiled (Dynamo's eager backend: inductor's C++ compilation takes minutes on 2 cores)."""
    code, text, err = cli("validate", "gpu", "--device", "cpu", "--budget", "20m", "--compile-backend", "eager",
                          "--out", tmp_path)
    assert code == 0, err
    rec = json.loads((tmp_path / "validation-gpu-cpu.json").read_text())
    assert rec["finished"] and not rec["not_reached"]
    assert {(n["case"], n["mode"]) for n in rec["networks"] if n["status"] == "measured"} == \
        {(c.key, m) for c in CPU_CASES for m in ("eager", "compiled")}
    assert all(n["predicted_builtin_s"] > 0 and n["predicted_calibrated_s"] > 0 for n in rec["networks"])
    fams = {f["family"] for f in rec["kernel_families"]}
    assert {"layernorm-fwd-bf16", "rmsnorm-bwd-bf16", "softmax-fwd-bf16", "dropout-fwd-bf16", "adam-step",
            "sdpa-flash-fwd-bf16", "copy-bf16", "gemm-square-bf16"} <= fams
    from dlsim.io.profile_yaml import load_profile
    assert set(load_profile(Path(rec["calibrated_profile"])).tables) >= {"gemm", "conv", "memory"}
