"""The panels ``--help`` groups each long command's options into (rich-click option groups).

Keyed by command path; each option of these commands is in exactly one panel (tests/test_cli_help.py holds
them to the commands' options, so a new option needs a line here). Commands not listed show one
``Options`` panel.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

_OUTPUT = ["--json", "--force", "--help"]

PANELS: dict[str, list[tuple[str, list[str]]]] = {
    "dlsim simulate": [
        ("Model and cluster", ["--cluster", "--nodes", "--set", "--dtype", "--optimizer", "--optimizer-impl",
                               "--model-only"]),
        ("Parallelism and batch", ["--strategy", "--dp", "--tp", "--pp", "--ep", "--cp", "--spatial", "--halo-overlap",
                                   "--microbatch-size",
                                   "--num-microbatches", "--global-batch"]),
        ("Pipeline", ["--schedule", "--virtual-stages", "--stage-partition", "--p2p-overlap",
                      "--p2p-scatter-gather"]),
        ("Memory: recomputation, sharding, offload",
         ["--recompute", "--recompute-layers", "--zero", "--fsdp", "--hybrid-shard", "--offload",
          "--grad-accumulation"]),
        ("Software stack: kernels and overlap", ["--stack", "--fused-kernels", "--sequence-parallel",
                                                 "--tp-async-backward", "--tp-comm-overlap", "--ep-overlap",
                                                 "--param-gather-overlap"]),
        ("Gradient synchronisation", ["--sync", "--collective", "--bucket-size", "--overlap", "--compression",
                                      "--compression-bits", "--compression-density",
                                      "--compression-value-bits"]),
        ("Parameter server, asynchronous and stale-synchronous training",
         ["--staleness", "--ps-shards", "--fetch-every", "--push-every", "--iterations"]),
        ("Variability", ["--jitter", "--jitter-cv", "--straggler-fraction", "--straggler-slowdown", "--seed"]),
        ("Convolutions (μ-cuDNN micro-batching)", ["--microbatch-plan", "--workspace-limit"]),
        ("Simulation detail", ["--full", "--expand-collectives", "--analytic"]),
        ("Output", ["--tokens", "--json", "--trace", "--trace-ranks", "--trace-window", "--gantt", "--gantt-devices",
                    "--force", "--help"]),
    ],
    "dlsim optimize": [
        ("Problem", ["--cluster", "--gpus", "--global-batch", "--nodes", "--set", "--stack", "--model-only"]),
        ("Search space", ["--stacks", "--fix", "--schedules", "--max-microbatch-size", "--tp-across-nodes", "--cp", "--spatial",
                          "--hybrid-shard", "--offload"]),
        ("Ranking", ["--objective", "--top", "--max-memory-fraction", "--max-simulations", "--jobs"]),
        ("Whole run (--objective time-to-train, cost or energy)", ["--tokens", "--checkpoint", "--usd-per-gpu-hour",
                                                                 "--usd-per-kwh"]),
        ("Output", ["--save-best", "--json", "--csv", "--plot", "--force", "--help"]),
    ],
    "dlsim compare": [
        ("Model and cluster", ["--cluster", "--nodes", "--set", "--stack", "--model-only"]),
        ("Strategies and scaling", ["--strategy", "--grid", "--gpus", "--scaling", "--global-batch", "--jobs"]),
        ("Parameter server, asynchronous and stale-synchronous training",
         ["--sync", "--staleness", "--ps-shards", "--iterations"]),
        ("Output", ["--csv", "--json", "--plot", "--force", "--help"]),
    ],
    "dlsim sweep": [
        ("Run", ["--out", "--jobs", "--stack", "--analytic", "--quiet"]),
        ("Dask", ["--scheduler", "--dask-local"]),
        ("Output", ["--summary", "--plot", *_OUTPUT]),
    ],
    "dlsim calibrate compute": [
        ("Device and output", ["--device", "--out", "--threads", "--dtype"]),
        ("What to measure", ["--model", "--input-shape", "--tokens", "--vocab", "--batch", "--set", "--no-grid",
                             "--algorithm"]),
        ("How to time", ["--repeats", "--flush-cache", "--statistic", "--warm", "--passes", "--reprobe"]),
        ("Check and report", ["--quick", "--quiet", *_OUTPUT]),
    ],
    "dlsim comm": [
        ("Collective", ["--size", "--sweep", "--ranks", "--algorithm", "--model"]),
        ("Network: a profile, or the link's parameters", ["--cluster", "--latency", "--bandwidth", "--overhead",
                                                          "--gap", "--burst", "--peak-bandwidth",
                                                          "--reduce-bandwidth", "--ranks-per-node"]),
        ("Algorithm parameters", ["--inter-algorithm", "--segments", "--shards", "--fanout", "--rounds", "--density",
                                  "--value-bytes"]),
        ("Output", ["--plot", *_OUTPUT]),
    ],
}


@lru_cache(maxsize=1)
def help_config() -> Any:
    """rich-click's help configuration: these panels, plain text (no markup in the help strings), 100 columns."""
    from rich_click import RichHelpConfiguration
    groups = {path: [{"name": name, "options": options} for name, options in panels]
              for path, panels in PANELS.items()}
    return RichHelpConfiguration(option_groups=groups, text_markup="ansi", max_width=100, theme="default-slim")
