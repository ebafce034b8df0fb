"""AlexNet on a 2013-era GPU cluster: data vs model vs hybrid parallelism (seeds-inventory §11 V16).

Simulates AlexNet (models/alexnet.yaml) on the gpu-2013 profile with 128 samples per GPU, as
Krizhevsky 2014 ("One weird trick for parallelizing convolutional neural networks") ran it:
* data parallel: every GPU a replica, gradients all-reduced;
* model parallel: every layer split over the GPUs (tensor parallelism), one batch of 128;
* hybrid: the convolutions data-parallel, the fully connected layers model-parallel over the same
  GPUs on the gathered batch (layer groups).
Two settings: the era's synchronous gradient exchange after the backward pass (overlap off), and
today's wait-free backpropagation (overlap on). Writes reports/strategies-alexnet.{json,png,md}.

Usage: python benchmarks/study_alexnet_strategies.py
"""

from __future__ import annotations

import json
from pathlib import Path

from dlsim.api.simulate import simulate
from dlsim.io.files import write_atomic
from dlsim.report.sim_plots import plot_strategy_study, speedups
from dlsim.spec.strategy import LayerGroup

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports"
MODEL, CLUSTER, BATCH, OPTIMIZER = "alexnet", "gpu-2013", 128, "momentum"
STACK = "eager"  # cuda-convnet2: unfused fp32 kernels (benchmarks/seeds/common.py STACK)
GROUPS = (LayerGroup("conv1", "drop6", "data"), LayerGroup("fc6", "loss", "model"))
STRATEGIES = {"data parallel": lambda n: {"dp": n}, "model parallel": lambda n: {"tp": n},
              "hybrid (DP conv + MP FC)": lambda n: {"dp": n, "layer_groups": GROUPS}}
DEVICES = (2, 4, 8)
# seeds-inventory.md §11 V16 (S002 L617-625)
REFERENCES = [
    {"strategy": "data or model parallel", "devices": 4, "speedup": 2.2, "source": "Yadan 2013: DP or MP ~2.2x"},
    {"strategy": "hybrid (DP conv + MP FC)", "devices": 4, "speedup": 3.1, "source": "Ben-Nun 2015: 3.1x"},
    {"strategy": "hybrid (DP conv + MP FC)", "devices": 8, "speedup": 6.25, "source": "Krizhevsky 2014: 6.25x"},
]


def study(overlap: bool) -> dict:
    baseline = simulate(MODEL, CLUSTER, microbatch_size=BATCH, overlap=overlap, optimizer=OPTIMIZER, stack=STACK).to_dict()
    runs = []
    for name, fields in STRATEGIES.items():
        for n in DEVICES:
            rec = simulate(MODEL, CLUSTER, microbatch_size=BATCH, overlap=overlap, optimizer=OPTIMIZER, stack=STACK,
                           **fields(n)).to_dict()
            runs.append({"strategy": name, "devices": n, "record": rec})
    title = (f"AlexNet on {CLUSTER}, {BATCH} samples per GPU, gradient exchange "
             f"{'overlapped with backprop' if overlap else 'after the backward pass (2013-era)'}")
    return {"kind": "strategy-study", "title": title, "overlap": overlap, "baseline": baseline, "runs": runs,
            "references": REFERENCES}


def exchange_factor(st: dict, strategy: str, devices: int, speedup: float) -> float:
    """How many times slower the exposed exchange of `strategy` on `devices` GPUs would have to be for
    the study to give `speedup` (its compute unchanged): n·T1/speedup − compute = factor × exposed comm."""
    run = next(r["record"] for r in st["runs"] if r["strategy"] == strategy and r["devices"] == devices)
    needed = devices * st["baseline"]["iteration_time_s"] / speedup - run["breakdown_s"]["compute"]
    comm = run["breakdown_s"]["exposed_comm"]
    return needed / comm if comm > 0 else float("inf")


def _table(st: dict) -> list[str]:
    sp = speedups(st)
    refs = {(r["strategy"], r["devices"]): r["speedup"] for r in REFERENCES}
    for n_ref in [r for r in REFERENCES if r["strategy"] == "data or model parallel"]:
        refs[("data parallel", n_ref["devices"])] = refs[("model parallel", n_ref["devices"])] = n_ref["speedup"]
    lines = ["| strategy | " + " | ".join(f"{n} GPUs" for n in DEVICES) + " |",
             "|---|" + "---|" * len(DEVICES)]
    for name in STRATEGIES:
        cells = []
        for n in DEVICES:
            ref = refs.get((name, n))
            cells.append(f"{sp[name][n]:.2f}x" + (f" (seeds: {ref}x)" if ref else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _breakdown(st: dict, devices: int) -> list[str]:
    lines = ["| strategy | iteration | compute | exposed comm. | comm. total | peak memory |", "|---|---|---|---|---|---|"]
    for run in st["runs"]:
        if run["devices"] != devices:
            continue
        r = run["record"]
        b = r["breakdown_s"]
        lines.append(f"| {run['strategy']} | {r['iteration_time_s'] * 1e3:.1f} ms | {b['compute'] * 1e3:.1f} ms | "
                     f"{b['exposed_comm'] * 1e3:.1f} ms | {r['communication_s'] * 1e3:.1f} ms | "
                     f"{r['peak_memory_bytes'] / 2**30:.2f} GiB |")
    return lines


def main(out: Path = OUT) -> tuple[dict, dict]:
    """Write strategies-alexnet.{json,md} and the figures into `out` (default reports/); returns the two
    studies (exchange after the backward pass, overlapped)."""
    era, modern = study(False), study(True)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "strategies-alexnet.json", json.dumps({"era": era, "modern": modern}, indent=1) + "\n")
    plot_strategy_study(era, out / "strategies-alexnet.png")
    plot_strategy_study(modern, out / "strategies-alexnet-overlap.png")
    base = era["baseline"]
    sp_era, sp_mod = speedups(era), speedups(modern)
    md = [
        "# AlexNet: data, model and hybrid parallelism on a 2013-era cluster",
        "",
        "Generated by `python benchmarks/study_alexnet_strategies.py` (records: `strategies-alexnet.json`).",
        "",
        f"Model `{MODEL}` (torchvision single-tower AlexNet, 61.1 M parameters), profile `{CLUSTER}` (Tesla K20, "
        "4 per node on PCIe 2.0 at 8 GB/s, FDR InfiniBand at 13.6 Gb/s per GPU), fp32, SGD with momentum "
        f"(as Krizhevsky trained it), {BATCH} samples per GPU. One GPU: "
        f"{base['iteration_time_s'] * 1e3:.1f} ms per iteration, {base['throughput_samples_per_s']:.0f} samples/s. "
        "Speedup = throughput over that of one GPU (samples per second, the measure of Krizhevsky 2014, Table 1).",
        "",
        "* **data parallel**: `--dp N`; all 61 M gradients all-reduced (bucketed, algorithm chosen by closed form).",
        "* **model parallel**: `--tp N`; every convolution and FC layer split (column/row alternation), one batch.",
        "* **hybrid**: `--dp N` with layer groups conv1..drop6 data-parallel, fc6..loss model-parallel on the "
        "gathered N x 128 batch (all-gather of pool5 activations forward, reduce-scatter of their gradient backward; "
        "only the 2.5 M convolution weights are all-reduced).",
        "",
        "## Simulated speedups beside the seeds' (2013-era: gradients exchanged after the backward pass)",
        "",
        *_table(era),
        "",
        "![speedups and breakdown](strategies-alexnet.png)",
        "",
        "Seeds (seeds-inventory §11 V16, S002 L617-625): data or model parallelism alone on 4 GPUs ~2.2x "
        "[Yadan et al. 2013]; hybrid up to 6.25x on 8 GPUs [Krizhevsky 2014]; 3.1x on 4 GPUs [Ben-Nun 2015].",
        "",
        f"The hybrid beats both pure strategies on 4 and 8 GPUs ({sp_era['hybrid (DP conv + MP FC)'][4]:.2f}x "
        f"and {sp_era['hybrid (DP conv + MP FC)'][8]:.2f}x against {sp_era['data parallel'][4]:.2f}x / "
        f"{sp_era['data parallel'][8]:.2f}x for data and {sp_era['model parallel'][4]:.2f}x / "
        f"{sp_era['model parallel'][8]:.2f}x for model parallelism). The simulated 8-GPU hybrid speedup is "
        f"{sp_era['hybrid (DP conv + MP FC)'][8] / 6.25 - 1:+.0%} off Krizhevsky's 6.25x, data parallelism's 4-GPU "
        f"speedup {sp_era['data parallel'][4] / 2.2 - 1:+.0%} off Yadan's ~2.2x. Both gaps have one measured size: "
        f"for dlsim to give the seeds' numbers the exposed exchange would have to be "
        f"{exchange_factor(era, 'data parallel', 4, 2.2):.1f}x (data parallel, 4 GPUs) and "
        f"{exchange_factor(era, 'hybrid (DP conv + MP FC)', 8, 6.25):.1f}x (hybrid, 8 GPUs) slower than dlsim "
        "prices it (ring all-reduces and all-gathers over peer-to-peer PCIe 2.0 at 6 GB/s per GPU): about 3 in "
        "both, what host-staged copies through a shared root complex gave 2013 implementations (about 2 GB/s per "
        "GPU; the seeds: parameter swapping limited by PCIe, S004 L310), which the profile does not carry. "
        "Model parallelism is limited by the all-reduces of large convolution activations "
        "(conv2's output alone is 128 x 192 x 27 x 27 floats).",
        "",
        "Time per iteration at 8 GPUs:",
        "",
        *_breakdown(era, 8),
        "",
        "## With wait-free backpropagation (gradient buckets overlapped with the backward pass)",
        "",
        *_table(modern),
        "",
        "![with overlap](strategies-alexnet-overlap.png)",
        "",
        "Overlapping the gradient all-reduce with the 0.25 s backward pass hides it almost entirely on these "
        f"GPUs, so plain data parallelism scales nearly linearly ({sp_mod['data parallel'][8]:.2f}x on 8) and "
        "overtakes the hybrid, whose model-parallel collectives block the FC layers. The hybrid's advantage in "
        "the seeds rests on the era's exchange after the backward pass and on slow host-staged transfers.",
        "",
        "Caveats: roofline-priced kernels (no measured K20 tables: 0% of the time is priced from measured data); "
        "the FC layers run more efficiently at the hybrid's larger gathered batch (the roofline efficiency curve), "
        "which is why the hybrid can exceed linear speedup slightly at 2-4 GPUs.",
    ]
    write_atomic(out / "strategies-alexnet.md", "\n".join(md) + "\n")
    print(json.dumps({"era": sp_era, "modern": sp_mod}, indent=1))
    return era, modern


if __name__ == "__main__":
    main()
