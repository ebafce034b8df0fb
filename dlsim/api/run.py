"""`run()`: a whole training run, not one iteration: iterations, time to train with failures and
checkpoints (expected and as a seeded Monte Carlo distribution), energy and cost.

One iteration is simulated (`dlsim.api.simulate.run_simulation`; each phase of a batch-size
ramp-up once more) and scaled to the token budget; `run_model` adds, from the profile's run
sections (`dlsim.io.profile_run`) or the caller's overrides:

- failures: the job's interruption rate from its nodes and devices (`dlsim.spec.run.Reliability`);
- checkpoints: what each rank writes (`dlsim.cost.checkpoint`, from the model states the
  simulation holds per rank), the write time on the storage tier (synchronous: the job blocks for
  it; asynchronous: it blocks for the copy to host memory and the write becomes durable while the
  next interval runs), the read time of a restart, the relaunch and warm-up;
- the interval that minimises the expected wall time (`dlsim.cost.reliability`; Young's and Daly's
  closed forms reported beside it), rounded to whole iterations; the expected wall time, failures,
  lost work, restarts and goodput; the distribution over `trials` simulated runs
  (`dlsim.sim.failures`);
- energy (`dlsim.cost.power`): per iteration and device from the simulated breakdown, the
  checkpoint and restart time at the waiting and idle power, node overhead, PUE; cost from the
  prices the caller gives.

Asynchronous checkpointing in closed form treats the write's lag as part of each restart (a
failure within the lag loses one interval more); the Monte Carlo follows the lag exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Unpack

from dlsim.api.fields import StrategyFields
from dlsim.api.models import as_cluster, as_model
from dlsim.api.simulate import run_simulation
from dlsim.cost.checkpoint import StageStates, checkpoint_plan, snapshot_time
from dlsim.cost.power import cluster_power, device_energy, iteration_energy
from dlsim.cost.reliability import daly_interval, expected_run, mtbf, optimal_interval, young_interval
from dlsim.cost.roofline import sustained
from dlsim.errors import SpecError
from dlsim.io.profile_run import load_run_profile
from dlsim.plan.offload import offloads_optimizer
from dlsim.results_run import RunResult
from dlsim.results_sim import SimResult
from dlsim.spec.cluster import Cluster
from dlsim.spec.model import Model
from dlsim.spec.run import DAY, PowerModel, Reliability, Restart, RunProfile, StorageTier
from dlsim.spec.strategy import Strategy
from dlsim.units import GBYTE_PER_S

RUN_OBJECTIVES = ("time-to-train", "cost", "energy")
CHECKPOINT_MODES = ("sync", "async")
MAX_TOKENS = 1e18


@dataclass(frozen=True)
class RunOptions:
    """What a run needs beyond one iteration; None takes the profile's value. Rates per 1000 node-
    or device-days, bandwidths in GB/s, prices in USD."""

    tokens: float
    checkpoint: str = "sync"
    interval_s: float | None = None
    node_failures_per_1000_node_days: float | None = None
    device_failures_per_1000_device_days: float | None = None
    planned_interruptions_per_day: float | None = None
    storage_write_gbytes_per_s_per_node: float | None = None
    storage_aggregate_write_gbytes_per_s: float | None = None
    relaunch_s: float | None = None
    pue: float | None = None
    usd_per_gpu_hour: float | None = None
    usd_per_kwh: float | None = None
    failures: bool = True
    trials: int = 200
    seed: int = 0

    def check(self) -> "RunOptions":
        """One `SpecError` naming the option for a value that cannot be (negative rates, a zero budget)."""
        t = self.tokens
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0 or t > MAX_TOKENS:
            raise SpecError(f"the token budget must be a positive number up to {MAX_TOKENS:.0e}, got {t!r}",
                            field="tokens")
        if self.checkpoint not in CHECKPOINT_MODES:
            raise SpecError(f"unknown checkpointing {self.checkpoint!r} (use {', '.join(CHECKPOINT_MODES)})",
                            field="checkpoint")
        for name in ("interval_s", "node_failures_per_1000_node_days", "device_failures_per_1000_device_days",
                     "planned_interruptions_per_day", "storage_write_gbytes_per_s_per_node",
                     "storage_aggregate_write_gbytes_per_s", "relaunch_s", "pue", "usd_per_gpu_hour", "usd_per_kwh"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise SpecError(f"must be a non-negative number, got {v!r}", field=name)
            if v == 0 and (name.startswith("storage_") or name == "interval_s"):
                raise SpecError(f"must be positive, got {v!r}", field=name)
        if self.pue is not None and self.pue < 1:
            raise SpecError(f"is facility / IT power and must be at least 1, got {self.pue!r}", field="pue")
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or not 0 <= self.trials <= 100_000:
            raise SpecError(f"must be an integer in [0, 100000], got {self.trials!r}", field="trials")
        return self


def tokens_per_sample(model: Model) -> int:
    """Tokens one sample holds: the sequence length of a token model, else 1 (the budget counts samples)."""
    return int(model.input_shape[0]) if model.input_kind == "tokens" and model.input_shape else 1


def parse_batch_schedule(text: str | Sequence[tuple[int, float]] | None) -> tuple[tuple[int, float], ...]:
    """``"512:252M,1024:2.87T"``: ramp-up phases, each a global batch (samples) kept for a token count,
    before the strategy's own batch takes the rest of the budget."""
    from dlsim.units import parse_count
    if text is None or text == "":
        return ()
    if not isinstance(text, str):
        return tuple((int(b), float(t)) for b, t in text)
    out = []
    for item in text.split(","):
        batch, sep, tokens = item.partition(":")
        try:
            b = int(batch.strip())
        except ValueError:
            b = 0
        if not sep or b < 1:
            raise SpecError(f"each phase is GLOBAL_BATCH:TOKENS with a positive batch, got {item.strip()!r}",
                            field="batch_schedule")
        out.append((b, parse_count(tokens.strip())))
    return tuple(out)


def _profile(cluster: Cluster, o: RunOptions) -> RunProfile:
    """The profile's run sections with the caller's overrides."""
    p = load_run_profile(cluster)
    rel = p.reliability
    if any(v is not None for v in (o.node_failures_per_1000_node_days, o.device_failures_per_1000_device_days,
                                   o.planned_interruptions_per_day)):
        base = rel or Reliability(0.0, source="")
        rel = Reliability(
            base.node_rate if o.node_failures_per_1000_node_days is None else o.node_failures_per_1000_node_days / 1000 / DAY,
            base.device_rate if o.device_failures_per_1000_device_days is None
            else o.device_failures_per_1000_device_days / 1000 / DAY,
            base.planned_rate if o.planned_interruptions_per_day is None else o.planned_interruptions_per_day / DAY,
            "given on the command line" + (f"; else {base.source}" if base.source else ""))
    st = p.storage
    if o.storage_write_gbytes_per_s_per_node is not None or o.storage_aggregate_write_gbytes_per_s is not None:
        node = o.storage_write_gbytes_per_s_per_node
        agg = o.storage_aggregate_write_gbytes_per_s
        if st is None and (node is None or agg is None):
            raise SpecError(f"{cluster.name} has no storage tier: give both --storage-write-per-node and "
                            "--storage-aggregate-write (GB/s)", field="storage")
        base = st or StorageTier("given", node * GBYTE_PER_S, node * GBYTE_PER_S, agg * GBYTE_PER_S, agg * GBYTE_PER_S)
        st = replace(base, write_per_node=base.write_per_node if node is None else node * GBYTE_PER_S,
                     write_aggregate=base.write_aggregate if agg is None else agg * GBYTE_PER_S,
                     source="given on the command line" + (f"; else {base.source}" if base.source else ""))
    rs = p.restart
    if o.relaunch_s is not None:
        rs = Restart(o.relaunch_s, rs.warmup_iterations if rs else 0.0, "given on the command line")
    pw = p.power
    if o.pue is not None and pw is not None:
        pw = replace(pw, pue=o.pue, source=pw.source + f"; PUE {o.pue:g} given on the command line")
    return replace(p, reliability=rel, storage=st, restart=rs, power=pw)


def _need(value: Any, what: str, key: str, cluster: Cluster, hint: str):
    if value is None:
        raise SpecError(f"{cluster.name} has no {what} (a '{key}:' section in its profile.yaml; {hint})", field=key)
    return value


def stage_states(result: SimResult) -> list[StageStates]:
    """Per pipeline stage: the weights and optimizer state one rank holds (the simulation's memory
    record) and the ranks of the stage."""
    by: dict[int, list] = {}
    for d in result.devices:
        by.setdefault(d.stage, []).append(d)
    return [StageStates(max(d.memory.get("weights", 0.0) for d in ds), max(d.memory.get("optimizer", 0.0) for d in ds),
                        sum(d.multiplicity for d in ds)) for _, ds in sorted(by.items())]


def checkpoint_of(result: SimResult, cluster: Cluster):
    """The `dlsim.cost.checkpoint.CheckpointPlan` of a simulated iteration's strategy."""
    s = result.strategy
    if offloads_optimizer(s.get("offload", "none")):
        raise SpecError("checkpoints of an optimizer state offloaded to host memory are not modelled "
                        "(offload none or activations)", field="offload")
    per_node = cluster.devices_per_node
    shard = max(1, min(s["dp"] * s.get("cp", 1), per_node // max(s["tp"], 1))) if s.get("hybrid_shard") else 0
    return checkpoint_plan(s.get("zero", 0), s["dp"] * s.get("cp", 1), bool(s.get("hybrid_shard")),
                           stage_states(result), per_node, shard)


def attainable_flops(cluster: Cluster, dtype: str) -> float:
    """The device's matrix peak in `dtype` times its best measured GEMM efficiency (else its
    `compute_efficiency`), sustained (`dlsim.cost.roofline.sustained`)."""
    dev = cluster.device
    peak = dev.peak_flops.get(dtype) or max(dev.peak_flops.values())
    curve = dev.efficiency.matrix.get(dtype)
    return peak * sustained(dev) * (max(curve.values) if curve is not None else dev.compute_efficiency)


def iteration_energy_of(result: SimResult, cluster: Cluster, power: PowerModel, nodes: int):
    """`dlsim.cost.power.IterationEnergy` of a simulated iteration."""
    flops = result.flops_per_iteration / max(result.total_devices, 1)
    rate = attainable_flops(cluster, result.strategy.get("dtype") or "bf16")
    devices = [device_energy(d.name, d.multiplicity, d.breakdown, flops, rate, power.device) for d in result.devices]
    return iteration_energy(devices, nodes, result.iteration_time_s, power)


def run_model(phases: Sequence[tuple[SimResult, int]], model: Model, cluster: Cluster, o: RunOptions,
              profile: RunProfile | None = None) -> RunResult:
    """The run of `phases` ((simulated iteration, iterations), the last the strategy's own batch)
    under options `o` (module docstring)."""
    o = o.check()
    profile = profile or _profile(cluster, o)
    main, _ = phases[-1]
    if not isinstance(main, SimResult) or main.strategy.get("sync", "allreduce") != "allreduce":
        raise SpecError("a run is modelled for synchronous training (sync allreduce)", field="sync")
    if not main.feasible:
        raise SpecError(f"the iteration does not fit: {main.infeasible_reason}", field="strategy")
    gpus = main.total_devices
    per_node = cluster.devices_per_node
    nodes = -(-gpus // per_node)
    t_iter = main.iteration_time_s
    work = sum(r.iteration_time_s * n for r, n in phases)
    iterations = sum(n for _, n in phases)
    notes: list[str] = []
    sources: dict[str, str] = {}
    # failures
    if o.failures:
        rel = _need(profile.reliability, "failure rates", "reliability", cluster,
                    "or give --node-failures-per-1000-node-days, or --no-failures")
        rate, planned = rel.job_rate(nodes, gpus), rel.planned_rate
        sources["reliability"] = rel.source
    else:
        rate, planned = 0.0, 0.0
        notes.append("no failures (--no-failures): the run is iterations x iteration time plus checkpoints")
    m = mtbf(rate)
    # checkpoints
    plan = checkpoint_of(main, cluster)
    write = read = block = lag = 0.0
    storage = profile.storage
    if o.failures and rate > 0:
        storage = _need(storage, "checkpoint storage tier", "storage", cluster,
                        "or give --storage-write-per-node and --storage-aggregate-write")
        sources["storage"] = storage.source
        write, read = plan.write_time(storage), plan.read_time(storage)
        if o.checkpoint == "async":
            host = cluster.host
            if host is None:
                raise SpecError(f"asynchronous checkpointing copies the states to host memory: {cluster.name} "
                                "has no host_link (use --checkpoint sync)", field="checkpoint")
            block, lag = snapshot_time(plan.rank_bytes, host.effective_bandwidth), write
        else:
            block = write
    restart = profile.restart
    if o.failures and rate > 0:
        restart = _need(restart, "restart model", "restart", cluster, "or give --relaunch-s")
        sources["restart"] = restart.source
    relaunch = restart.relaunch_s if restart and rate > 0 else 0.0
    warmup = restart.warmup_iterations * t_iter if restart and rate > 0 else 0.0
    restart_s = relaunch + read + warmup
    # interval
    young = young_interval(block, m) if block > 0 and math.isfinite(m) else math.inf
    daly = daly_interval(block, m) if block > 0 and math.isfinite(m) else math.inf
    if o.interval_s is not None:
        tau = o.interval_s
    elif rate > 0:
        tau = optimal_interval(block, restart_s + lag, m, minimum_s=max(lag, t_iter))
    else:
        tau = math.inf
    every = max(1, round(tau / t_iter)) if math.isfinite(tau) else iterations
    every = min(every, max(iterations, 1))
    tau = every * t_iter
    exp = expected_run(work, tau, block if rate > 0 else 0.0, restart_s + lag, m)
    planned_n = planned * exp.wall_s
    expected = exp.to_dict()
    if planned_n:
        expected["restart_s"] += planned_n * restart_s
        expected["wall_s"] += planned_n * restart_s
        expected["goodput"] = work / expected["wall_s"]
    expected["planned_interruptions"] = planned_n
    failures = {"job_interruptions_per_day": rate * DAY, "mtbf_s": m, "mtbf_h": m / 3600.0,
                "nodes": nodes, "devices": gpus, "expected_unplanned": exp.failures,
                "expected_planned": planned_n, "restart_s": restart_s,
                "restart_parts_s": {"relaunch": relaunch, "read_checkpoint": read, "warmup": warmup}}
    checkpoint = {"mode": o.checkpoint, **plan.to_dict(), "write_s": write, "read_s": read, "blocking_s": block,
                  "durable_lag_s": lag, "interval_s": tau, "interval_iterations": every,
                  "young_interval_s": young, "daly_interval_s": daly, "count": exp.checkpoints,
                  "interval_given": o.interval_s is not None}
    mc = None
    if o.trials and rate > 0:
        from dlsim.sim.failures import simulate_failures
        try:
            runs = simulate_failures(work, tau, block, restart_s, m, o.trials, o.seed, lag)
        except ValueError as exc:
            raise SpecError(str(exc), field="trials") from None
        mc = {"seed": o.seed, **runs.summary()}
    energy = _energy(phases, cluster, profile.power, nodes, gpus, exp, expected, relaunch, read, warmup, planned_n,
                     restart_s, block, notes)
    if profile.power is not None:
        sources["power"] = profile.power.source
        sources["device_power"] = profile.power.device.source
    cost = _cost(o, gpus, expected["wall_s"], energy)
    tps = tokens_per_sample(model)
    return RunResult(main.model, main.cluster, gpus, nodes, dict(main.strategy), main.stack, o.tokens, tps,
                     tuple({"global_batch": r.global_batch, "iterations": n, "iteration_time_s": r.iteration_time_s,
                            "tokens": n * r.global_batch * tps} for r, n in phases),
                     iterations, t_iter, work, failures, checkpoint, expected, mc, energy, cost,
                     {"iteration_time_s": t_iter, "global_batch": main.global_batch, "mfu": main.mfu,
                      "breakdown_s": main.breakdown.to_dict(), "peak_memory_bytes": main.peak_memory_bytes},
                     tuple(notes), sources)


def _energy(phases, cluster: Cluster, power: PowerModel | None, nodes: int, gpus: int, exp, expected, relaunch: float,
            read: float, warmup: float, planned_n: float, restart_s: float, block: float, notes: list[str]):
    if power is None:
        notes.append(f"no energy: {cluster.name} has no 'power:' section")
        return None
    its = [(iteration_energy_of(r, cluster, power, nodes), n) for r, n in phases]
    train_it = sum(e.it_j * n for e, n in its)
    work = sum(e.iteration_s * n for e, n in its)
    p_train = train_it / work if work > 0 else 0.0
    p_wait = cluster_power(power, gpus, nodes, "waiting")
    p_idle = cluster_power(power, gpus, nodes, "idle")
    restarts = expected["restart_s"]
    share = (lambda part: part / restart_s * restarts) if restart_s > 0 else (lambda part: 0.0)
    parts = {"training": train_it, "lost_work": exp.lost_s * p_train, "checkpoints": exp.checkpoint_s * p_wait,
             "restart_relaunch": share(relaunch) * p_idle, "restart_read": share(read) * p_wait,
             "restart_warmup": share(warmup) * p_train}
    it_j = sum(parts.values())
    main_e = its[-1][0]
    return {"iteration": main_e.to_dict(), "parts_it_j": parts, "it_j": it_j, "pue": power.pue,
            "facility_j": it_j * power.pue, "facility_kwh": it_j * power.pue / 3.6e6,
            "facility_mwh": it_j * power.pue / 3.6e9, "mean_it_power_w": it_j / expected["wall_s"],
            "training_power_w": p_train, "waiting_power_w": p_wait, "idle_power_w": p_idle,
            "checkpoint_blocking_s": block}


def _cost(o: RunOptions, gpus: int, wall_s: float, energy: dict | None) -> dict | None:
    if o.usd_per_gpu_hour is None and o.usd_per_kwh is None:
        return None
    gpu_h = wall_s * gpus / 3600.0
    out = {"gpu_hours": gpu_h, "usd_per_gpu_hour": o.usd_per_gpu_hour, "usd_per_kwh": o.usd_per_kwh,
           "gpu_usd": gpu_h * o.usd_per_gpu_hour if o.usd_per_gpu_hour is not None else 0.0, "energy_usd": 0.0}
    if o.usd_per_kwh is not None:
        if energy is None:
            raise SpecError("--usd-per-kwh needs a power model (the profile's 'power:' section)", field="usd_per_kwh")
        out["energy_usd"] = energy["facility_kwh"] * o.usd_per_kwh
    out["total_usd"] = out["gpu_usd"] + out["energy_usd"]
    return out


def phase_iterations(tokens: float, per_sample: int, schedule: Sequence[tuple[int, float]], main_batch: int) -> list[tuple[int, int]]:
    """(global batch, iterations) per phase: each ramp-up phase's tokens at its batch (whole
    iterations, rounded up), then the rest of the budget at `main_batch`."""
    left = tokens
    out = []
    for batch, phase_tokens in schedule:
        take = min(phase_tokens, left)
        if take <= 0:
            break
        n = math.ceil(take / (batch * per_sample))
        out.append((batch, n))
        left -= n * batch * per_sample
    if left > 0 or not out:
        out.append((main_batch, max(1, math.ceil(left / (main_batch * per_sample)))))
    return out


def run(model: Model | str | Path, cluster: Cluster | str | Path, strategy: Strategy | str | Path | None = None, *,
        tokens: float, options: RunOptions | Mapping[str, Any] | None = None, batch_schedule=None,
        nodes: int | None = None, measured: bool = True, overrides: Mapping[str, Any] | None = None,
        given: Iterable[str] = (), **fields: Unpack[StrategyFields]) -> RunResult:
    """Simulate one iteration of `model` on `cluster` under `strategy` (or strategy `fields`, as for
    `dlsim.api.simulate.simulate`) and model the run of `tokens` tokens (samples for a model without
    a token input): ``run("llama3-405b", "dgx-h100", tokens=15e12, dp=128, tp=8, pp=16, ...)``.
    `options` (`RunOptions` fields) set checkpointing, rates and prices; `batch_schedule` ramps the
    global batch up (``"512:252M,1024:2.87T"``); the record is a `RunResult`."""
    o = options if isinstance(options, RunOptions) else RunOptions(tokens=tokens, **dict(options or {}))
    o = replace(o, tokens=tokens).check()
    schedule = parse_batch_schedule(batch_schedule)
    model, cluster = as_model(model, overrides), as_cluster(cluster)
    sim = run_simulation(model, cluster, strategy, measured=measured, nodes=nodes, given=given, **fields).result
    if not isinstance(sim, SimResult):
        raise SpecError("a run is modelled for synchronous training (sync allreduce)", field="sync")
    if nodes is not None:
        cluster = replace(cluster, nodes=nodes)
    per = tokens_per_sample(model)
    plan = phase_iterations(o.tokens, per, schedule, sim.global_batch)
    phases = []
    base = {k: v for k, v in fields.items() if k not in ("global_batch", "num_microbatches")}
    for batch, n in plan[:-1]:
        s = sim.strategy
        per_step = s["dp"] * s["microbatch_size"]
        if batch % per_step:
            raise SpecError(f"ramp-up batch {batch} is not a multiple of dp x microbatch_size = {per_step}",
                            field="batch_schedule")
        r = run_simulation(model, cluster, strategy, measured=measured, nodes=nodes, given=given,
                           **{**base, "num_microbatches": batch // per_step}).result
        phases.append((r, n))
    phases.append((sim, plan[-1][1]))
    return run_model(phases, model, cluster, o)


def run_scaling(model: Model | str | Path, cluster: Cluster | str | Path, strategy: Strategy | str | Path | None = None,
                *, gpus: Sequence[int], tokens: float, **kwargs: Any) -> list[RunResult]:
    """`run` at each GPU count of `gpus`: dp = gpus / (tp·pp·cp) on enough nodes, the global batch of
    the strategy kept (its micro-batches per replica rescaled), so that the runs differ in size only."""
    model, cluster = as_model(model, kwargs.pop("overrides", None)), as_cluster(cluster)
    kwargs.pop("nodes", None)
    first = run_simulation(model, cluster, strategy, measured=kwargs.get("measured", True),
                           given=kwargs.get("given", ()), **{k: v for k, v in kwargs.items() if k not in (
                               "options", "batch_schedule", "measured", "given")}).result
    s = first.strategy
    group = s["tp"] * s["pp"] * s.get("cp", 1)
    out = []
    fields = {k: v for k, v in kwargs.items() if k not in ("options", "batch_schedule", "measured", "given")}
    for g in gpus:
        if g % group:
            raise SpecError(f"{g} GPUs is not a multiple of tp x pp x cp = {group}", field="scale")
        dp = g // group
        per_replica = first.global_batch / (dp * s["microbatch_size"])
        if per_replica != int(per_replica) or per_replica < 1:
            raise SpecError(f"global batch {first.global_batch} does not split into whole micro-batches of "
                            f"{s['microbatch_size']} over dp {dp} ({g} GPUs)", field="scale")
        f = {**fields, "dp": dp, "num_microbatches": int(per_replica)}
        f.pop("global_batch", None)
        out.append(run(model, cluster, strategy, tokens=tokens, nodes=-(-g // cluster.devices_per_node),
                       options=kwargs.get("options"), batch_schedule=kwargs.get("batch_schedule"),
                       measured=kwargs.get("measured", True), given=kwargs.get("given", ()), **f))
    return out
