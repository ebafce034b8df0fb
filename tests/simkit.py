"""Small builders shared by the simulator tests: chain models, uniform layer tables, graph runs."""

from __future__ import annotations

from dlsim.plan.comm import FreeComm, Layout
from dlsim.plan.iteration import IterationInputs, build_iteration
from dlsim.plan.layertable import LayerEntry
from dlsim.plan.partition import partition
from dlsim.plan.tensorparallel import TPLayer
from dlsim.results import Estimate, Source
from dlsim.sim.engine import execute
from dlsim.spec.model import build_model
from dlsim.spec.strategy import make_strategy

ZERO = Estimate(0.0, Source.MODEL)


def chain(n: int, width: int = 64, name: str = "chain"):
    """A model of `n` identical linear layers."""
    entries = [{"name": f"l{i}", "type": "linear", "out_features": width, "where": f"layers[{i}]"} for i in range(n)]
    return build_model(name, "fp32", (width,), "tensor", entries)


def uniform_table(model, t_f: float, t_b: float, saved: float = 1.0, params: int = 0, out_bytes: float = 0.0):
    """Every layer takes t_f forward and t_b backward, keeps `saved` bytes, holds `params`."""
    rep = TPLayer("replicated", False, False, False)
    return tuple(LayerEntry(i, layer.name, layer.type, 1, 1, Estimate(t_f, Source.MODEL), Estimate(t_b, Source.MODEL),
                            params, saved, out_bytes, 0.0, rep) for i, layer in enumerate(model.layers))


def run_uniform(schedule: str, p: int, m: int, v: int = 1, *, layers_per_chunk: int = 1, t_f: float = 1.0,
                t_b: float = 2.0, saved: float = 1.0, pricer=None, params: int = 0, out_bytes: float = 0.0, **fields):
    """Build and execute a pipeline of uniform chunks; returns (graph, timeline, strategy)."""
    s = make_strategy(pp=p, num_microbatches=m, microbatch_size=1, schedule=schedule, virtual_stages=v, **fields)
    model = chain(layers_per_chunk * s.chunks)
    table = uniform_table(model, t_f / v / layers_per_chunk, t_b / v / layers_per_chunk, saved, params, out_bytes)
    ranges = partition(model, [t_f + t_b] * len(table), s.chunks)
    x = IterationInputs(model, table, tuple(ranges), s, Layout(s.dp, s.tp, p, 8), pricer or FreeComm(), "fp32",
                        "test device", 1e18, lambda n: ZERO, lambda f, b: ZERO)
    graph = build_iteration(x)
    return graph, execute(graph), s


class RingPricer:
    """Test pricing with hand-checkable numbers: Hockney messages α + n·β, ring collectives
    (allreduce 2(p−1)(α + nβ/p); reduce-scatter and allgather (p−1)(α + nβ/p)), expanded into the
    same ring steps when asked."""

    def __init__(self, alpha: float, beta: float, layout=None):
        self.alpha, self.beta, self.layout = alpha, beta, layout

    def collective(self, op, nbytes, ranks):
        p = len(ranks)
        steps = {"allreduce": 2, "reduce_scatter": 1, "allgather": 1, "alltoall": 1}[op] * (p - 1)
        return Estimate(steps * (self.alpha + nbytes / p * self.beta), Source.MODEL, "test ring")

    def p2p(self, nbytes, src, dst):
        return Estimate(self.alpha + nbytes * self.beta, Source.MODEL, "test p2p")

    def expand(self, op, nbytes, ranks):
        from dlsim.plan.comm import Transfer
        p = len(ranks)
        rounds = {"allreduce": 2, "reduce_scatter": 1, "allgather": 1}[op] * (p - 1)
        t = self.alpha + nbytes / p * self.beta
        out = []
        for k in range(rounds):
            for i in range(p):
                deps = tuple((k - 1) * p + j for j in (i, (i - 1) % p)) if k else ()
                out.append(Transfer(i, (i + 1) % p, nbytes / p, t, deps, t, t))
        return out

    def tier(self, ranks):
        return self.layout.tier(ranks) if self.layout else "intra"


def captured_graph(monkeypatch, model, cluster, **kw):
    """The task graph `run_simulation(model, cluster, **kw)` executes (the whole iteration: the
    steady-state extension off)."""
    import dlsim.sim.scenario_run as scenario_run
    from dlsim.api.simulate import run_simulation
    seen = []
    real = scenario_run.simulate_graph

    def capture(graph, info):
        seen.append(graph)
        return real(graph, info)
    with monkeypatch.context() as m:
        m.setattr(scenario_run, "simulate_graph", capture)
        m.setattr(scenario_run, "simulate_steady", lambda x, info: None)
        run_simulation(model, cluster, **kw)
    return seen[0]
