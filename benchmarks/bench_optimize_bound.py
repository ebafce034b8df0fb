"""Soundness of `optimize`'s pruning on the issue-14 benchmark space (GPT-3 175B, 1,024 A100s, global
batch 1,536): the evaluator's lower bound never exceeds its estimate on any candidate that fits, and
optimize with pruning returns the ranking and Pareto front it returns without. A check for changes to
`Evaluator.lower_bound` (tests/test_optimize.py holds the same on small spaces); about 3 minutes.

Prints JSON: candidates checked, violations (label, bound, estimate), the largest bound / estimate,
and whether the pruned and unpruned runs agree. Usage: python benchmarks/bench_optimize_bound.py
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import replace

from dlsim.api.models import as_cluster, as_model
from dlsim.api.optimize import label, optimize
from dlsim.api.simulate import default_pricers, kernel_tables
from dlsim.plan.evaluate import Evaluator
from dlsim.plan.scenario import ScenarioBuilder
from dlsim.plan.search import SearchSpace, candidates

CASE = dict(gpus=1024, global_batch=1536, nodes=128)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    model, cluster = as_model("gpt3-175b"), replace(as_cluster("dgx-a100"), nodes=CASE["nodes"])
    ev = Evaluator.of(ScenarioBuilder(model, cluster, "fp16", default_pricers(cluster), kernel_tables(cluster, True)[0]))
    checked, worst, bad = 0, 0.0, []
    for s in candidates(model, SearchSpace(CASE["gpus"], CASE["global_batch"], cluster.devices_per_node), Counter()):
        if max(x.total for x in ev.memory(s)) > ev.capacity:
            continue
        bound, estimate = ev.lower_bound(s), ev.evaluate(s).iteration_time_s
        checked += 1
        worst = max(worst, bound / estimate)
        if bound > estimate:
            bad.append((label(s), bound, estimate))
    pruned = optimize("gpt3-175b", "dgx-a100", **CASE)
    full = optimize("gpt3-175b", "dgx-a100", prune_bound=False, **CASE)
    print(json.dumps({"checked": checked, "violations": bad, "max_bound_over_estimate": worst,
                      "evaluated_pruned": pruned.evaluated, "evaluated_unpruned": full.evaluated,
                      "same_ranking": [c.row(1) for c in pruned.ranked] == [c.row(1) for c in full.ranked],
                      "same_pareto": pruned.pareto == full.pareto}, indent=1))


if __name__ == "__main__":
    main()
