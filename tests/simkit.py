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
                t_b: float = 2.0, saved: float = 1.0, pricer=None, **fields):
    """Build and execute a pipeline of uniform chunks; returns (graph, timeline, strategy)."""
    s = make_strategy(pp=p, num_microbatches=m, microbatch_size=1, schedule=schedule, virtual_stages=v, **fields)
    model = chain(layers_per_chunk * s.chunks)
    table = uniform_table(model, t_f / v / layers_per_chunk, t_b / v / layers_per_chunk, saved)
    ranges = partition(model, [t_f + t_b] * len(table), s.chunks)
    x = IterationInputs(model, table, tuple(ranges), s, Layout(s.dp, s.tp, p, 8), pricer or FreeComm(), "fp32",
                        "test device", 1e18, lambda n: ZERO, lambda f, b: ZERO)
    graph = build_iteration(x)
    return graph, execute(graph), s
