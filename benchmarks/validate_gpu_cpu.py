"""`dlsim validate gpu --device cpu` end to end (issue 33): the whole GPU-truth pipeline at its CPU sizes.

Every phase runs for real on this machine's CPU: device facts, the GEMM curve (bf16, fp16, fp8 where
PyTorch runs it), eager training steps of the four networks (small Llama-style decoder at two sequence
lengths, GPT-2, ResNet-50 channels-last AMP) each in a fresh process, their kernels, the kernel
families, compiled steps (``--compile-backend``, default ``eager``: Dynamo's capture without inductor's
C++ compilation, which takes minutes on 2 cores), predictions with the built-in and the calibrated
profile, the report. Prints one JSON record: how long it took, which phases finished, what was measured.

    python benchmarks/validate_gpu_cpu.py [--budget 4m] [--compile-backend eager] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from dlsim.api.validate_gpu import validate_gpu
from dlsim.cli.validate import parse_budget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="4m")
    parser.add_argument("--compile-backend", default="eager", choices=("inductor", "aot_eager", "eager", "none"))
    parser.add_argument("--out", default=None, help="report directory (default: a temporary one)")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="validate-gpu-cpu-")
    start = time.perf_counter()
    rec = validate_gpu(out, device="cpu", budget_s=parse_budget(args.budget), compile_backend=args.compile_backend,
                       command=f"python benchmarks/validate_gpu_cpu.py --budget {args.budget}")
    wall = time.perf_counter() - start
    nets = rec["networks"]
    print(json.dumps({
        "benchmark": "validate_gpu_cpu", "budget": args.budget, "wall_s": round(wall, 1), "finished": rec["finished"],
        "phases": {p["phase"]: [p["status"], round(p["seconds"], 1)] for p in rec["phases"]},
        "not_reached": rec["not_reached"],
        "steps_measured": sum(n["status"] == "measured" for n in nets), "steps": len(nets),
        "steps_cut": [f"{n['case']} {n['mode']}" for n in nets if n["status"] != "measured"],
        "kernel_families": len(rec["kernel_families"]),
        "family_kernels": sum(f["kernels"] for f in rec["kernel_families"]),
        "calibrated_profile_written": rec["calibrated_profile_written"], "report": rec["report_md"]}, indent=1))


if __name__ == "__main__":
    main()
