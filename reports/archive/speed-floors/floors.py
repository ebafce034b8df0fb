"""What issue 30's open speed lines would cost at the interpreter's floor on this machine (the
probe behind reports/speed-floors.md). Prints JSON.

* Event loop floors, per event (CPU time, the collector paused as `dlsim.api.gcpause` pauses it for
  a simulation, and running again after each):
  a bare heapq loop popping (time, priority, id, callback) and pushing one new event per event,
  the same resuming a generator per event (how the engine runs its streams), and SimPy's own
  `env.timeout` loop.
* Per event-simulation row of `benchmarks/bench_predict.py` (GPT-3 175B interleaved, Megatron 1T):
  its CPU per `simulate()` call, its processed events (`SimResult.events`) and tasks, and those
  events times each floor, against the row's target.
* The GPT-3 175B / 1,024 A100 search space (`bench_predict.space`'s): CPU of the sizing phase alone,
  the candidates per CPU-second an evaluator would reach if timing cost nothing, the timing budget
  left for each fitting candidate at 5,000 candidates per CPU-second, and the per-candidate timing
  CPU of the space (min, quartiles).

Usage: PYTHONPATH=$PWD python reports/archive/speed-floors/floors.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import os
import statistics
import sys
import time
from pathlib import Path

from dlsim.api.gcpause import paused_gc

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

N_EVENTS = 200_000
TARGETS_S = {"175B interleaved": 0.05, "1T": 0.2}
TARGET_CANDIDATES_PER_CPU_S = 5000


def heap_callbacks() -> float:
    return _paused(_heap_callbacks)


def heap_generators() -> float:
    return _paused(_heap_generators)


def simpy_timeouts() -> float:
    return _paused(_simpy_timeouts)


def _paused(fn) -> float:
    gc.disable()
    try:
        return fn()
    finally:
        gc.enable()


def _heap_callbacks() -> float:
    q: list = []
    push, pop = heapq.heappush, heapq.heappop

    def callback(t: float) -> None:
        pass
    for i in range(64):
        push(q, (0.0, 1, i, callback))
    eid = 64
    t0 = time.process_time()
    while eid < N_EVENTS:
        t, _, _, f = pop(q)
        f(t)
        push(q, (t + 1.0, 1, eid, f))
        eid += 1
    return (time.process_time() - t0) / (N_EVENTS - 64)


def _heap_generators() -> float:
    q: list = []
    push, pop = heapq.heappush, heapq.heappop

    def stream():
        t = 0.0
        while True:
            t = yield t + 1.0
    for i in range(64):
        g = stream()
        next(g)
        push(q, (0.0, 1, i, g))
    eid = 64
    t0 = time.process_time()
    while eid < N_EVENTS:
        t, _, _, g = pop(q)
        push(q, (g.send(t), 1, eid, g))
        eid += 1
    return (time.process_time() - t0) / (N_EVENTS - 64)


def _simpy_timeouts() -> float:
    import simpy
    env = simpy.Environment()

    def stream(env):
        while True:
            yield env.timeout(1.0)
    for _ in range(64):
        env.process(stream(env))
    t0 = time.process_time()
    env.run(until=N_EVENTS // 64)
    return (time.process_time() - t0) / N_EVENTS


def event_rows(repeats: int, floors: dict[str, float]) -> list[dict]:
    import bench_predict as B

    from dlsim.api.models import as_cluster, as_model
    from dlsim.api.simulate import simulate
    out = []
    for name, target in TARGETS_S.items():
        case = next(c for c in B.ROWS if name in c["name"])
        model, cluster = as_model(case["model"], case["overrides"]), as_cluster(case["cluster"])
        r = simulate(model, cluster, **case["strategy"])
        cpu = []
        for _ in range(repeats):
            t0 = time.process_time()
            simulate(model, cluster, **case["strategy"])
            cpu.append(time.process_time() - t0)
        events = r.result.events if hasattr(r, "result") else r.events
        tasks = r.result.tasks if hasattr(r, "result") else r.tasks
        out.append({"row": case["name"], "target_s": target, "cpu_s": round(statistics.median(cpu), 4),
                    "events": events, "tasks": tasks,
                    "events_at_floor_s": {k: round(events * v, 4) for k, v in floors.items()},
                    "cpu_us_per_event": round(1e6 * statistics.median(cpu) / events, 3)})
    return out


@paused_gc
def search_space() -> dict:
    """The space sized and timed with the collector paused, as `bench_predict.space` and the API run it."""
    from collections import Counter
    from dataclasses import replace

    from dlsim.api.models import as_cluster, as_model
    from dlsim.api.simulate import default_pricers, kernel_tables
    from dlsim.api.stacks import apply_stack, choose_stack
    from dlsim.plan.evaluate import Evaluator
    from dlsim.plan.scenario import ScenarioBuilder
    from dlsim.plan.search import SEARCHED, SearchSpace, candidates
    model = as_model("gpt3-175b")
    cluster = replace(as_cluster("dgx-a100"), nodes=128)
    stack, _ = choose_stack(None, model)
    fixed = apply_stack(stack, {}, set(SEARCHED), model, cluster)
    ev = Evaluator.of(ScenarioBuilder(model, cluster, fixed.get("dtype", model.dtype), default_pricers(cluster),
                                      kernel_tables(cluster)[0]))
    t0 = time.process_time()
    pool = list(candidates(model, SearchSpace(1024, 1536, cluster.devices_per_node, fixed=fixed), Counter()))
    fit = [s for s in pool if max(x.total for x in ev.memory(s)) <= ev.capacity]
    sizing = time.process_time() - t0
    each = _timed_each(ev, fit)
    budget = len(pool) / TARGET_CANDIDATES_PER_CPU_S - sizing
    q = statistics.quantiles(each, n=4)
    return {"candidates": len(pool), "fit": len(fit), "sizing_cpu_s": round(sizing, 3),
            "timing_cpu_s": round(sum(each), 3),
            "candidates_per_cpu_s_if_timing_were_free": round(len(pool) / sizing),
            "timing_budget_per_fitting_candidate_us_at_target": round(1e6 * budget / len(fit), 1),
            "timing_per_candidate_us": {"min": round(1e6 * min(each), 1), "q1": round(1e6 * q[0], 1),
                                        "median": round(1e6 * q[1], 1), "q3": round(1e6 * q[2], 1)}}


def _timed_each(ev, fit: list) -> list[float]:
    """CPU seconds of each candidate's timing, in the space's order, as the API runs the evaluator."""
    each = []
    for s in fit:
        t = time.process_time()
        ev.evaluate(s)
        each.append(time.process_time() - t)
    return each


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    floors = {}
    for f in (heap_callbacks, heap_generators, simpy_timeouts):
        floors[f.__name__] = statistics.median(f() for _ in range(args.repeats))
    print(json.dumps({"load_average": os.getloadavg(),
                      "floor_us_per_event": {k: round(1e6 * v, 3) for k, v in floors.items()},
                      "event_simulations": event_rows(args.repeats, floors),
                      "search_space": search_space(),
                      "load_average_after": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
