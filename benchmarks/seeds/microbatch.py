"""(g) μ-cuDNN's published speedups beside the plans dlsim makes (seeds-inventory §7.1, §11 V11).

Seeds: μ-cuDNN splits a layer's minibatch into micro-batches so that faster convolution algorithms
fit the workspace limit: "Fast (up to 4.54x faster on DeepBench)" (S003 L4587). The μ-cuDNN paper
(Oyama et al., arXiv 1804.04806 abstract) reports 1.63x for AlexNet and 1.21x for ResNet-18 on a
P100-SXM2; its README, DeepBench's 3x3 and 5x5 layers on a P100-SXM2 at mini-batch 256 and workspace
limits of 128, 256 and 512 MiB: up to 2.31x (3x3) and 3.85x (5x5). Simulated: `dlsim plan
microbatch` (WR: per-layer DP over powers of two, against the best undivided algorithm under the same
limit) on `dgx1-p100` (P100 SXM2) and `dgx1-v100` (V100 SXM2), with algorithm times from dlsim's
convolution-method cost model priced by each profile's device numbers (neither profile has a
measured cuDNN table); DeepBench's layers (reports/seeds/deepbench-conv-train.csv) through the same
planner through its API on the same modelled algorithm times.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from common import SEEDS, cli_json, compared, header, rel, table, write_report
from dlsim.api.microbatch import microbatch_sweep, plan_from_table
from dlsim.api.models import as_cluster
from dlsim.cost.conv_methods import METHODS, PASSES, ConvGeometry, applicable
from dlsim.io.files import write_atomic
from dlsim.plan.microbatch.model_table import method_time_s
from dlsim.plan.microbatch.configs import Kernel
from dlsim.plan.microbatch.policies import batch_sizes
from dlsim.plan.microbatch.table import BenchTable
from dlsim.report.microbatch_plots import plot_sweep
from dlsim.units import MIB

NAME = "microbatch"
BATCH = 256
NETS = {"alexnet": 1.63, "resnet18": 1.21}      # arXiv 1804.04806 abstract, P100-SXM2
NET_CLUSTER = "dgx1-p100"
DEEPBENCH = SEEDS / "deepbench-conv-train.csv"
README_LIMITS_MIB = (128, 256, 512)              # μ-cuDNN README (DeepBench, P100-SXM2)
SEED_DEEPBENCH = {"dgx1-p100": {"3x3": 2.31, "5x5": 3.85}, "dgx1-v100": {"any": 4.54}}
TINY_LAYERS = 6


def deepbench_layers(limit: int | None = None) -> list[tuple[str, ConvGeometry]]:
    """(name, per-sample geometry) of each DeepBench training convolution (duplicates dropped)."""
    rows = [r for r in csv.DictReader(line for line in DEEPBENCH.read_text().splitlines() if not line.startswith("#"))]
    out = []
    for i, r in enumerate(rows[:limit]):
        g = ConvGeometry(n=1, c_in=int(r["C_in"]), h=int(r["H"]), w=int(r["W"]), c_out=int(r["C_out"]),
                         k_h=int(r["kernel_h"]), k_w=int(r["kernel_w"]), stride_h=int(r["stride_h"]),
                         stride_w=int(r["stride_w"]), pad_h=int(r["pad_h"]), pad_w=int(r["pad_w"]))
        out.append((f"{r['source'].replace(' ', '_')}{i}_{g.k_h}x{g.k_w}", g))
    return out


def deepbench_table(cluster: str, layers: list[tuple[str, ConvGeometry]]) -> BenchTable:
    """Modelled (layer, pass, micro-batch, algorithm) -> (time, workspace) rows for `cluster`'s device,
    the same rows `dlsim plan microbatch MODEL -c CLUSTER` builds for a model's own convolutions."""
    device = as_cluster(cluster).device
    rows = []
    for name, g in layers:
        for p in PASSES:
            for m in METHODS:
                if applicable(m, g):
                    continue
                for b in batch_sizes("powerOfTwo", BATCH):
                    t, ws = method_time_s(m, p, g.with_batch(b), device, "fp32")
                    rows.append((name, p, Kernel(m, b, t, float(ws))))
    return BenchTable.from_rows(rows, source="model", origin=f"roofline model of {device.name}")


def _per_layer(tab: BenchTable, limit_mib: int) -> dict[str, float]:
    plan = plan_from_table(tab, BATCH, limit_mib * MIB, "wr", "powerOfTwo")
    out = {}
    for layer in plan.layers:
        und = sum(p.undivided.time_s for p in layer.passes if p.undivided)
        out[layer.name] = und / layer.time_s if layer.time_s else 1.0
    return out


def run(out: Path, tiny: bool = False) -> dict[str, Any]:
    nets = {}
    for net, seed in NETS.items():
        if tiny and net != "alexnet":
            continue
        args = ["plan", "microbatch", net, "-c", NET_CLUSTER, "--batch", str(BATCH), "--workspace-limit", "64MiB"]
        if not tiny:
            args += ["--plot", str(out / f"{NAME}-{net}-p100.png"), "--force"]
        rec = cli_json(out / f"{NAME}-{net}-p100.json", *args)
        sweep = rec.get("sweep")
        best = None
        if sweep:
            mu = next(s for s in sweep["series"] if s["policy"] == "powerOfTwo")
            pairs = [(lim, sp) for lim, sp in zip(sweep["limits_bytes"], mu["speedup"]) if sp]
            best = max(pairs, key=lambda x: x[1]) if pairs else None
        nets[net] = {"seed": seed, "speedup_64mib": rec["speedup"], "best": best}
    layers = deepbench_layers(TINY_LAYERS if tiny else None)
    deep = {}
    for cluster in SEED_DEEPBENCH:
        tab = deepbench_table(cluster, layers)
        total = plan_from_table(tab, BATCH, 256 * MIB, "wr", "powerOfTwo").to_dict()
        if not tiny:
            sweep = microbatch_sweep(tab, BATCH, "wr", label=f"DeepBench conv training layers on {cluster}",
                                     source="model")
            write_atomic(out / f"{NAME}-deepbench-{cluster}.json", json.dumps(sweep, indent=1) + "\n")
            plot_sweep(sweep, out / f"{NAME}-deepbench-{cluster}.png", marker_limit=256 * MIB)
        per = {lim: _per_layer(tab, lim) for lim in README_LIMITS_MIB}
        by_kernel = {}
        for k in ("3x3", "5x5"):
            vals = [sp for lim in per for name, sp in per[lim].items() if name.endswith(k)]
            by_kernel[k] = max(vals) if vals else None
        by_kernel["any"] = max(sp for lim in per for sp in per[lim].values())
        deep[cluster] = {"total_speedup_256mib": total["speedup"], "max_layer_speedup": by_kernel}
    res = {"nets": nets, "deepbench": deep}
    if not tiny:
        _report(out, res)
    return res


def _report(out: Path, res: dict[str, Any]) -> None:
    rows = []
    for net, r in res["nets"].items():
        best = f"{r['best'][1]:.2f}x at {r['best'][0] / MIB:g} MiB" if r["best"] else "-"
        rows.append((f"{net}, P100 (dgx1-p100), batch {BATCH}, whole network", f"{r['seed']:.2f}x",
                     f"{r['speedup_64mib']:.2f}x", best))
    for cluster, seeds in SEED_DEEPBENCH.items():
        d = res["deepbench"][cluster]["max_layer_speedup"]
        gpu = "P100" if "p100" in cluster else "V100"
        for k, s in seeds.items():
            src = "README" if "p100" in cluster else "S003 L4587 (GPU not named)"
            rows.append((f"DeepBench {'all' if k == 'any' else k} layers, {gpu} ({cluster}), best layer at "
                         f"128/256/512 MiB", f"up to {s:.2f}x ({src})", "-", f"up to {d[k]:.2f}x"))
    lines = header("μ-cuDNN's published speedups beside dlsim's micro-batch plans", NAME,
                   "Seeds: μ-cuDNN (S003 L4434-4765, seeds-inventory §7.1) splits each convolution's minibatch into "
                   "micro-batches so that faster algorithms fit the workspace limit, chosen by dynamic programming "
                   "(WR) or an ILP over the network (WD): \"up to 4.54x faster on DeepBench\" (S003 L4587). The "
                   "μ-cuDNN paper's abstract: 1.63x for AlexNet and 1.21x for ResNet-18 on a P100-SXM2; its README: "
                   "DeepBench on a P100-SXM2 at mini-batch 256 and limits 128/256/512 MiB, up to 2.31x for 3x3 and "
                   "3.85x for 5x5 layers (reference/algorithms.md §1.9).")
    lines += [f"Simulated: `dlsim plan microbatch MODEL -c {NET_CLUSTER} --batch {BATCH} --workspace-limit 64MiB "
              "--plot F.png` (WR, powers of two; 64 MiB is μ-cuDNN's default limit; the figure sweeps the limit) and, "
              f"for DeepBench's layers (`{rel(DEEPBENCH)}`, not a zoo model), the same planner through dlsim's API "
              "(`plan_from_table`, `microbatch_sweep`) on the same modelled algorithm times for each profile's device. Speedup = the best undivided algorithm under the same limit over the plan.", "",
              *table(("case", "published", "dlsim at 64 MiB", "dlsim, best over limits"), rows), "",
              f"Whole DeepBench set at 256 MiB: dlsim {res['deepbench']['dgx1-p100']['total_speedup_256mib']:.2f}x on "
              f"P100, {res['deepbench']['dgx1-v100']['total_speedup_256mib']:.2f}x on V100.", "",
              f"![AlexNet on P100: time and speedup against the workspace limit]({NAME}-alexnet-p100.png)", "",
              f"Figures by `dlsim plan microbatch --plot`: [{NAME}-resnet18-p100.png]({NAME}-resnet18-p100.png), "
              f"[{NAME}-deepbench-dgx1-p100.png]({NAME}-deepbench-dgx1-p100.png), "
              f"[{NAME}-deepbench-dgx1-v100.png]({NAME}-deepbench-dgx1-v100.png).", "",
              "## Agreement and disagreement", "",
              "* The mechanism is the seed's: under a limit the fastest undivided algorithm (FFT, Winograd, "
              "im2col, whose workspace grows with the batch) does not fit; micro-batches of 16-64 let it fit, and "
              "the plan is faster than the best undivided algorithm that fits. The gain shrinks to 1 as the limit "
              "grows past the undivided workspace (the figures' right ends).",
              "* The sizes agree in range, not point by point. dlsim's per-layer peaks on DeepBench land near the "
              "published ones (within about 1.5x either way), and its whole-network AlexNet and ResNet-18 speedups "
              "bracket the paper's: below them at μ-cuDNN's default 64 MiB, above them at the limit where dlsim's "
              "gain peaks. The abstract does not state the limit behind 1.63x and 1.21x, so the table gives both. "
              "The differences come from the algorithm times: dlsim prices each method by the roofline of its "
              "FLOPs and bytes with one efficiency curve per device, whereas cuDNN 7's kernels differ in "
              "efficiency shape by shape (which kernel is slow, and by how much, is what μ-cuDNN exploits). "
              "A measured `conv_algorithms` table of the GPU replaces the model; the CPU reproduction with "
              "measured NumPy algorithms is reports/microbatch-cpu.md.",
              "* The seed's 4.54x names no GPU or limit; the V100 row compares it with dlsim's best DeepBench "
              "layer on `dgx1-v100` over the README's limits."]
    write_report(out, NAME, lines)


TITLE = "(g) μ-cuDNN's published speedups beside dlsim's micro-batch plans"


def headline(res: dict[str, Any]) -> tuple[str, str]:
    n = res["nets"]
    d = res["deepbench"]
    return ("AlexNet 1.63x, ResNet-18 1.21x (P100); DeepBench up to 2.31x/3.85x (P100), 4.54x (S003)",
            f"AlexNet {n['alexnet']['speedup_64mib']:.2f}x, ResNet-18 {n['resnet18']['speedup_64mib']:.2f}x at 64 MiB; "
            f"DeepBench up to {d['dgx1-p100']['max_layer_speedup']['3x3']:.2f}x/"
            f"{d['dgx1-p100']['max_layer_speedup']['5x5']:.2f}x (P100), "
            f"{d['dgx1-v100']['max_layer_speedup']['any']:.2f}x (V100)")


def numbers(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Each published speedup beside dlsim's (`common.compared`)."""
    n, d = res["nets"], res["deepbench"]
    out = []
    for net, r in n.items():
        best = f"{r['best'][1]:.2f}x at {r['best'][0] / MIB:g} MiB" if r["best"] else "none"
        out.append(compared(f"{net}, P100, whole network, 64 MiB", r["seed"], r["speedup_64mib"],
                            f"the abstract states no workspace limit: dlsim's gain grows with it, to {best}"))
    why = ("algorithm times are modelled per method (roofline with one efficiency curve per device), not cuDNN 7's "
           "measured kernels, whose shape-by-shape slowness is what μ-cuDNN exploits; no measured P100 algorithm "
           "table exists to recompute with")
    for cluster, seeds in SEED_DEEPBENCH.items():
        for k, s in seeds.items():
            out.append(compared(f"DeepBench {'all' if k == 'any' else k} layers, best layer, {cluster}", s,
                                d[cluster]["max_layer_speedup"][k], why))
    return out
