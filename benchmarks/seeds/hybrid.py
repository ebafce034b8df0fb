"""(i) Krizhevsky's "one weird trick" hybrid against data and model parallelism (seeds-inventory §11 V16).

Seeds (S002 L617-625): data or model parallelism alone on 4 GPUs ~2.2x [Yadan et al. 2013]; the
hybrid (data-parallel convolutions, model-parallel fully connected layers) up to 6.25x on 8 GPUs
[Krizhevsky 2014], 3.1x on 4 GPUs [Ben-Nun 2015]. The study itself is benchmarks/
study_alexnet_strategies.py (reports/strategies-alexnet.md): AlexNet on `gpu-2013` (K20, PCIe 2.0,
FDR), 128 samples per GPU, gradients exchanged after the backward pass; this module runs it and
compares its numbers with the seeds'.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from common import REPORTS, SEEDS, compared

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import study_alexnet_strategies as study  # noqa: E402
from dlsim.report.sim_plots import speedups  # noqa: E402

NAME = "hybrid"
REPORT = "strategies-alexnet.md"   # the study's own report, under reports/
HYBRID, DATA, MODEL = "hybrid (DP conv + MP FC)", "data parallel", "model parallel"
SEED = {(DATA, 4): 2.2, (MODEL, 4): 2.2, (HYBRID, 4): 3.1, (HYBRID, 8): 6.25}


def run(out: Path, tiny: bool = False) -> dict[str, Any]:
    # the study's report: reports/strategies-alexnet.{md,json,png}, or beside `out`'s other reports
    era = study.main(REPORTS if out == SEEDS else out)[0] if not tiny else study.study(False)
    sp = speedups(era)
    # how much slower the exchange would have to be for dlsim to give each seed number (compute unchanged)
    slower = {f"{name}, {n}": study.exchange_factor(era, name, n, seed) for (name, n), seed in SEED.items()}
    return {"speedup": {k: {str(n): v for n, v in by.items()} for k, by in sp.items()}, "slower_exchange": slower,
            "report": REPORT}


TITLE = "(i) the \"one weird trick\" hybrid against data and model parallelism (Krizhevsky 2014)"


def headline(res: dict[str, Any]) -> tuple[str, str]:
    s = res["speedup"]
    return ("DP or MP ~2.2x on 4 GPUs; hybrid 6.25x on 8, 3.1x on 4 (S002 L617-625)",
            f"DP {s[DATA]['4']:.2f}x, MP {s[MODEL]['4']:.2f}x on 4; hybrid {s[HYBRID]['8']:.2f}x on 8, "
            f"{s[HYBRID]['4']:.2f}x on 4 (gpu-2013, exchange after backprop)")


def numbers(res: dict[str, Any]) -> list[dict[str, Any]]:
    s, slow = res["speedup"], res["slower_exchange"]
    era = (f"the seed's exchange would be {slow[f'{DATA}, 4']:.1f}x (data parallel, Yadan 2013) and "
           f"{slow[f'{HYBRID}, 8']:.1f}x (hybrid, Krizhevsky 2014) slower than dlsim prices peer-to-peer PCIe 2.0 "
           "(6 GB/s per GPU): one factor, about 3, for both, the host-staged copies of 2013 (about 2 GB/s per GPU "
           "through a shared root complex) that the profile does not carry")
    return [compared("data parallel, 4 GPUs (Yadan 2013)", SEED[(DATA, 4)], s[DATA]["4"], era),
            compared("model parallel, 4 GPUs (Yadan 2013)", SEED[(MODEL, 4)], s[MODEL]["4"], era),
            compared("hybrid, 8 GPUs (Krizhevsky 2014)", SEED[(HYBRID, 8)], s[HYBRID]["8"], era),
            compared("hybrid, 4 GPUs (Ben-Nun 2015, another implementation)", SEED[(HYBRID, 4)], s[HYBRID]["4"],
                     f"Ben-Nun's exchange would be {slow[f'{HYBRID}, 4']:.1f}x slower than dlsim's: a 2015 system "
                     "the seeds do not describe")]
