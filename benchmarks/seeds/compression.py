"""(d) 1-bit SGD and SparCML-style quantised allreduce against dense (seeds-inventory §6.1-6.2, §11 V24-V25).

Seeds: 1-bit SGD with error feedback: "A 160M-parameter model training processes 3300h of data in
under 16h on 20 dual-GPU servers - a 10 times speedup" (S004 L277-279). SparCML's table (S001
L416-419, S003 L6922-6940): on Piz Daint, VGG19 on 8 nodes with Q4 (4-bit quantisation) 1.55x
(3.31), AlexNet on 16 nodes Q4 1.30x (1.36). Simulated with `dlsim simulate --compression`:
* Q4 against fp32 on `piz-daint` (the seeds' machine, one P100 per node on Aries), VGG-19 and
  AlexNet, 32 samples per GPU (the seed gives no batch), gradient exchange overlapped with
  backpropagation or after it;
* 1-bit against fp32 on `gpu-2013` (K20 GPUs, FDR InfiniBand: the era's GPU cluster) for a fully
  connected speech DNN of the seed's 160 M parameters (reports/seeds/models/distbelief-speech.yaml
  widened to 5,900 units and 9,304 outputs: the seed gives only the parameter count), 256 frames per
  GPU, speedup over one GPU as the seed states it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common import SEEDS, STACK, header, rel, save_series, table, write_report
from dlsim.api.models import as_model
from dlsim.api.simulate import simulate
from dlsim.spec.strategy import Compression

NAME = "compression"
SPARCML = {"vgg19": (8, 1.55, 3.31), "alexnet": (16, 1.30, 1.36)}   # model: (nodes, speedup, parenthesised)
SPARCML_CLUSTER, SPARCML_BATCH = "piz-daint", 32
GPUS = (2, 4, 8, 16, 32)
TINY_GPUS = (8,)
SPEECH = SEEDS / "models" / "distbelief-speech.yaml"
SPEECH_SET = {"hidden": 5900, "classes": 9304}
SPEECH_CLUSTER, SPEECH_BATCH, SPEECH_GPUS, SEED_1BIT = "gpu-2013", 256, (1, 2, 4, 8, 16, 40), (40, 10.0)
TINY_SPEECH_GPUS = (1, 40)


def _time(model: Any, cluster: str, dp: int, batch: int, kind: str, overlap: bool = True, **kw: Any) -> dict[str, Any]:
    return simulate(model, cluster, dp=dp, microbatch_size=batch, compression=Compression(kind=kind), overlap=overlap,
                    stack=STACK, **kw).to_dict()


def run(out: Path, tiny: bool = False) -> dict[str, Any]:
    gpus = TINY_GPUS if tiny else GPUS
    q4: dict[str, dict[str, list[float]]] = {}
    for model in SPARCML:
        for overlap in (False, True):
            key = f"{model}, exchange {'overlapped' if overlap else 'after backprop'}"
            q4[key] = {"gpus": list(gpus), "speedup": [
                _time(model, SPARCML_CLUSTER, n, SPARCML_BATCH, "none", overlap)["iteration_time_s"]
                / _time(model, SPARCML_CLUSTER, n, SPARCML_BATCH, "qsgd", overlap)["iteration_time_s"] for n in gpus]}
    speech = as_model(SPEECH, SPEECH_SET)
    sgpus = TINY_SPEECH_GPUS if tiny else SPEECH_GPUS
    base = _time(speech, SPEECH_CLUSTER, 1, SPEECH_BATCH, "none")["throughput_samples_per_s"]
    onebit = {k: [_time(speech, SPEECH_CLUSTER, n, SPEECH_BATCH, k)["throughput_samples_per_s"] / base for n in sgpus]
              for k in ("none", "1bit")}
    rec = {"kind": "series", "title": "Gradient compression against dense fp32 allreduce",
           "panels": [{"title": f"Q4 (4-bit QSGD) over fp32, {SPARCML_CLUSTER}, {SPARCML_BATCH} per GPU",
                       "x_label": "nodes (1 P100 each)", "y_label": "speedup of an iteration (fp32 time / Q4 time)",
                       "x_log": 2,
                       "lines": [{"label": f"dlsim: {k}", "x": v["gpus"], "y": v["speedup"]} for k, v in q4.items()],
                       "points": [{"label": f"seed (SparCML, S001 L416-419): {m}", "x": [n], "y": [s]}
                                  for m, (n, s, _) in SPARCML.items()],
                       "hlines": [{"label": "no gain", "y": 1.0}]},
                      {"title": f"160 M-parameter FC speech DNN, {SPEECH_CLUSTER}, {SPEECH_BATCH} frames per GPU",
                       "x_label": "GPUs", "y_label": "speedup over one GPU (throughput ratio)", "x_log": 2,
                       "lines": [{"label": "dlsim: fp32 allreduce", "x": list(sgpus), "y": onebit["none"]},
                                 {"label": "dlsim: 1-bit SGD", "x": list(sgpus), "y": onebit["1bit"]}],
                       "points": [{"label": "seed: 1-bit SGD, 20 dual-GPU servers, 10x (S004 L277-279)",
                                   "x": [SEED_1BIT[0]], "y": [SEED_1BIT[1]]}]}]}
    png = save_series(rec, out, NAME)
    res = {"q4": q4, "speech_gpus": list(sgpus), "speech_speedup": onebit, "speech_params": speech.params,
           "png": str(png)}
    if not tiny:
        _report(out, res, png)
    return res


def _at(curve: dict[str, list[float]], n: int) -> float:
    return curve["speedup"][curve["gpus"].index(n)]


def _report(out: Path, res: dict[str, Any], png: Path) -> None:
    q4, sp = res["q4"], res["speech_speedup"]
    rows = [(f"{m}, {n} nodes, Q4 over fp32", f"{s:.2f}x ({par:.2f})",
             f"{_at(q4[f'{m}, exchange after backprop'], n):.2f}x", f"{_at(q4[f'{m}, exchange overlapped'], n):.2f}x")
            for m, (n, s, par) in SPARCML.items()]
    i = res["speech_gpus"].index(SEED_1BIT[0])
    rows.append((f"160 M FC speech DNN, {SEED_1BIT[0]} GPUs, over one GPU", f"{SEED_1BIT[1]:.0f}x with 1-bit",
                 "-", f"1-bit {sp['1bit'][i]:.1f}x, fp32 {sp['none'][i]:.1f}x"))
    lines = header("1-bit SGD and SparCML's quantised allreduce against dense", NAME,
                   "Seeds: 1-bit SGD (Seide et al. 2014, error feedback): a 160 M-parameter model \"processes 3300h of "
                   "data in under 16h on 20 dual-GPU servers - a 10 times speedup\" (S004 L277-279, seeds-inventory "
                   "§6.1, V25). SparCML (Renggli et al.): on Piz Daint, VGG19 on 8 nodes with Q4 1.55 (3.31), AlexNet "
                   "on 16 nodes with Q4 1.30 (1.36) (S001 L416-419, S003 L6922-6940, §6.2, V24; the seeds do not say "
                   "what the parenthesised numbers are).")
    lines += [f"Simulated with `dlsim simulate MODEL -c PROFILE --dp N --microbatch-size B --compression "
              "none|qsgd|1bit [--no-overlap]` (QSGD at its default 4 bits with one norm per 512 values; 1-bit with "
              "two floats per column; both priced as smaller allreduce messages plus the quantisation kernels). "
              f"Q4: `vgg19` and `alexnet` on `{SPARCML_CLUSTER}`, {SPARCML_BATCH} samples per GPU (not in the seed). "
              f"1-bit: `{rel(SPEECH)}` with `--set hidden=5900 --set classes=9304` "
              f"({res['speech_params'] / 1e6:.0f} M parameters; the seed gives only the count) on `{SPEECH_CLUSTER}`, "
              f"{SPEECH_BATCH} frames per GPU.", "",
              *table(("case", "seed", "dlsim, exchange after backprop", "dlsim, exchange overlapped"), rows), "",
              f"![speedups]({png.name})", "",
              "## Agreement and disagreement", "",
              "* Compression pays exactly where the exchange is exposed: AlexNet (61 M parameters, little compute per "
              "sample) gains on Piz Daint in both settings; VGG-19 gains only when the exchange waits for the "
              "backward pass, because with overlap its long convolutions hide the fp32 all-reduce on Aries "
              "(10 GB/s per node), and the quantisation kernels then cost a little (speedup just below 1).",
              "* dlsim's Q4 gains differ from SparCML's because the seed's runs fix what dlsim has to assume: the "
              "batch per node, whether CNTK overlapped the exchange, and MPI's dense allreduce on Aries (SparCML's "
              "baseline). AlexNet's larger simulated gain follows from dlsim's optimistic P100 compute "
              "(roofline efficiencies marked as estimates in the profile), which makes the exchange a larger "
              "share of the iteration.",
              "* 1-bit SGD: dlsim's 40-GPU speedup is above the seed's 10x, and so is its fp32 baseline: the seed "
              "counts data-loading, the era's host-staged exchange on dual-GPU servers (PCIe, no GPUDirect) and "
              "its accuracy-preserving double-buffering, none of which the K20/FDR profile carries. The "
              "qualitative result holds: with 640 MB of fp32 gradients per step, 1-bit cuts the exchange 32-fold "
              "and roughly doubles the 40-GPU throughput."]
    write_report(out, NAME, lines)


TITLE = "(d) 1-bit SGD and SparCML-style Q4 allreduce against dense"


def headline(res: dict[str, Any]) -> tuple[str, str]:
    q4 = res["q4"]
    i = res["speech_gpus"].index(SEED_1BIT[0])
    return ("VGG19/8 nodes Q4 1.55x, AlexNet/16 Q4 1.30x (S001); 1-bit 10x on 40 GPUs (S004)",
            f"{_at(q4['vgg19, exchange after backprop'], 8):.2f}x / "
            f"{_at(q4['alexnet, exchange after backprop'], 16):.2f}x (exchange after backprop); "
            f"1-bit {res['speech_speedup']['1bit'][i]:.0f}x")
