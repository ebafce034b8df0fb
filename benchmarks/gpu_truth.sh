#!/usr/bin/env bash
# GPU truth on a lent GPU machine, in one command (issue 33): `dlsim validate gpu --device cuda` within a
# budget, run from this checkout, everything it writes brought back in $OUT.
#
# It installs nothing. It finds a Python with PyTorch, says what it found (Python, torch, CUDA, the GPU,
# dlsim's packages present or missing) and stops with one line when the run cannot happen (no torch, no
# CUDA device, numpy / PyYAML / click missing). simpy (dlsim's simulator) is needed only for the
# predictions: without it the measurements run all the same and the report says the predictions are
# missing; rewrite the report afterwards where simpy is, from the files that came back:
#     tar xzf gpu-truth.tar.gz && dlsim validate gpu --report-only --out reports
# or carry simpy's source (pure Python) with the run, prepared once in the checkout that the device tool sends:
#     mkdir -p .gpu-deps && cp -r "$(python -c 'import os, simpy; print(os.path.dirname(simpy.__file__))')" .gpu-deps/ \
#         && echo /.gpu-deps/ >> .git/info/exclude
#
# From the device tool (8 minutes of budget, the call ends well inside its 10-minute limit):
#     run(command="bash benchmarks/gpu_truth.sh 8m", carry=[".gpu-deps"], timeout_s=600)
# Back in $OUT: gpu-truth.log (everything printed), validation-gpu-<device>.md and .json (the report),
# records.jsonl (every measurement of the run), gpu-truth.tar.gz (all of it and the calibrated profile, as
# `--out reports` wrote them: `tar xzf gpu-truth.tar.gz` gives reports/).
# GPU_TRUTH_DEVICE=cpu runs the same script through the CPU pipeline (small sizes) to check it without a GPU.
set -u
BUDGET="${1:-8m}"
DEVICE="${GPU_TRUTH_DEVICE:-cuda}"
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-truth-out}"
mkdir -p "$OUT"
WORK="$(mktemp -d /tmp/gpu-truth.XXXXXX)"
LOG="$OUT/gpu-truth.log"
export PYTHONUNBUFFERED=1
say() { echo "gpu_truth: $*" | tee -a "$LOG"; }

PY=""
for candidate in python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import torch" >/dev/null 2>&1; then
        PY="$(command -v "$candidate")"
        break
    fi
done
if [ -z "$PY" ]; then
    say "no Python here imports torch (tried python3, python): nothing run; PyTorch with CUDA is needed"
    exit 1
fi
if [ -d .gpu-deps ]; then
    export PYTHONPATH="$PWD:$PWD/.gpu-deps${PYTHONPATH:+:$PYTHONPATH}"
    say "using the carried packages in .gpu-deps: $(ls .gpu-deps | tr '\n' ' ')"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
DEVICE="$DEVICE" "$PY" - <<'EOF' 2>&1 | tee -a "$LOG"
import importlib.util, os, platform, sys
import torch
cuda = torch.cuda.is_available()
print(f"gpu_truth: {sys.executable} (Python {platform.python_version()}), torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, device: {torch.cuda.get_device_name(0) if cuda else 'none visible'}")
need, optional = ("numpy", "yaml", "click"), ("simpy",)
missing = [m for m in need + optional if importlib.util.find_spec(m) is None]
print(f"gpu_truth: dlsim's packages missing here: {', '.join(missing) or 'none'}"
      + (" (simpy: the report will lack the predictions; see the header of this script)" if "simpy" in missing else ""))
sys.exit(0 if (cuda or os.environ["DEVICE"] == "cpu") and not set(missing) & set(need) else 3)
EOF
if [ "${PIPESTATUS[0]}" -ne 0 ]; then
    say "cannot run: no CUDA device visible to torch, or numpy / PyYAML / click missing (above)"
    exit 1
fi
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"

# the run stops itself at its budget; the timeout (budget + 45 s) only guards against a hang, and ends before
# the device tool's 10 minutes with time to pack. The report is copied into $OUT as the run rewrites it (after
# every phase), so that a run killed from outside still brings back what it measured.
SECONDS_BUDGET=$("$PY" -c "from dlsim.cli.validate import parse_budget; print(int(parse_budget('$BUDGET')))") || exit 1
collect() {
    cp "$WORK"/reports/validation-gpu-*.md "$WORK"/reports/validation-gpu-*.json "$OUT"/ 2>/dev/null
    cp "$WORK"/reports/validation-gpu-*/records.jsonl "$OUT"/records.jsonl 2>/dev/null
}
timeout --signal=TERM --kill-after=15 $((SECONDS_BUDGET + 45)) \
    "$PY" -m dlsim validate gpu --device "$DEVICE" --budget "$BUDGET" --out "$WORK/reports" > >(tee -a "$LOG") 2>&1 &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
    sleep 10
    collect
done
wait "$pid"
status=$?
collect
say "dlsim validate gpu ended with status $status"
tar czf "$OUT/gpu-truth.tar.gz" -C "$WORK" reports 2>&1 | tee -a "$LOG"
say "in \$OUT: $(ls "$OUT" | tr '\n' ' ')"
exit "$status"
