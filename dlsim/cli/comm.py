"""``dlsim comm``: time, algorithm and bus bandwidth, and the lower bound of a collective."""

from __future__ import annotations

from typing import Any

import click

from dlsim.api.comm import comm, comm_sweep
from dlsim.cli import main
from dlsim.cli.options import FINITE_FLOAT, json_option
from dlsim.cli.output import OutputFile, check_plot_path, emit_json, emit_plot, json_safe, prepare_output, wants_summary
from dlsim.cost.collectives import COLLECTIVES
from dlsim.cost.p2p import MODELS
from dlsim.errors import SpecError
from dlsim.report.text import table
from dlsim.units import GBYTE_PER_S, format_bytes, format_time, size_is_decimal


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / GBYTE_PER_S:.4g} GB/s"


def _network_line(rec: dict[str, Any]) -> str:
    net = rec["network"]
    link = net["link"]
    parts = [f"{net['model']}", f"L={format_time(link['latency_s'])}"]
    if link["overhead_s"] or link["gap_s"]:
        parts += [f"o={format_time(link['overhead_s'])}", f"g={format_time(link['gap_s'])}"]
    parts.append(_rate(link["bandwidth_bytes_per_s"]))
    if link.get("burst_bytes"):
        peak = link["peak_bandwidth_bytes_per_s"]
        parts.append(f"burst {format_bytes(link['burst_bytes'])}" + ("" if peak == float("inf") else f" at {_rate(peak)}"))
    if net["gamma_s_per_byte"]:
        parts.append(f"reduce {_rate(1 / net['gamma_s_per_byte'])}")
    return f"{net['source']}, link {link['name']} ({', '.join(parts)})"


def comm_text(rec: dict[str, Any], decimal: bool = False) -> str:
    """One collective priced by each algorithm; the size in decimal units when it was given so (`decimal`)."""
    head = (f"{rec['collective']} of {format_bytes(rec['size_bytes'], decimal)} on {rec['ranks']} ranks; "
            f"{_network_line(rec)}")
    rows = []
    for r in sorted(rec["results"], key=lambda r: r["time_s"]):
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items())
        ratio = f"{r['lower_bound_ratio']:.3f}" if r["lower_bound_ratio"] is not None else "-"
        rows.append([r["algorithm"] + (" *" if r["algorithm"] == rec["best"] else ""), format_time(r["time_s"]),
                     _rate(r["algbw_bytes_per_s"]), _rate(r["busbw_bytes_per_s"]), ratio, params])
    body = table(["algorithm", "time", "algbw", "busbw", "x bound", "parameters"], rows,
                 [False, True, True, True, True, False])
    net = rec["network"]
    where = (f"{net['link']['name']} NICs and {net['intra']['name']} across nodes of {net['ranks_per_node']} ranks"
             if net.get("intra") and (net.get("ranks_per_node") or 1) > 1 else f"link {net['link']['name']}")
    lines = [head, body, f"lower bound: {format_time(rec['lower_bound_s'])} on {where}; busbw = algbw x {rec['bus_factor']:.4g} (nccl-tests convention)"]
    # measured rows and what the closed form alone does not say (contention on a shared network)
    lines += [f"{r['algorithm']}: {r['source']}, {r['note']}" for r in rec["results"]
              if r["source"] != "model" or "; " in r["note"]]
    lines += [f"skipped {s['algorithm']}: {s['reason']}" for s in rec["skipped"]]
    return "\n".join(lines)


def sweep_text(rec: dict[str, Any], decimal: bool = False) -> str:
    """Times over sizes and the crossovers; sizes in decimal units when the sweep was given so (`decimal`)."""
    names = rec["algorithms"]
    rows = []
    for i, size in enumerate(rec["sizes_bytes"]):
        rows.append([format_bytes(size, decimal)] + [format_time(rec["times_s"][a][i]) for a in names]
                    + [rec["best"][i], format_time(rec["lower_bound_s"][i])])
    body = table(["size"] + names + ["best", "bound"], rows, [True] * (len(names) + 1) + [False, True])
    lines = [f"{rec['collective']} on {rec['ranks']} ranks; {_network_line(rec)}", body]
    if rec["crossovers"]:
        lines.append("crossovers of the best algorithm:")
        lines += [f"  {c['from']} -> {c['to']} at {format_bytes(c['size_bytes'], decimal)}" for c in rec["crossovers"]]
    else:
        lines.append("no crossover: one algorithm is best over the whole range")
    return "\n".join(lines)


@main.command("comm")
@click.argument("collective", metavar="COLLECTIVE")
@click.option("--size", help="Message size, e.g. 100MB, 64MiB (per rank; nccl-tests convention).")
@click.option("--sweep", help="Sizes START:STOP[:FACTOR], e.g. 1KB:1GB (factor 2).")
@click.option("--ranks", type=int, required=True, help="Number of ranks.")
@click.option("--cluster", "-c", help="Hardware profile: built-in name or directory.")
@click.option("--latency", help="Link latency L, e.g. 5us.")
@click.option("--bandwidth", help="Link bandwidth 1/G, e.g. 10GB/s or 100Gbps.")
@click.option("--overhead", help="LogGP per-message CPU overhead o, e.g. 1us.")
@click.option("--gap", help="LogGP gap g between messages, e.g. 2us.")
@click.option("--burst", help="Token bucket of the link: bytes that pass at the peak rate once refilled, e.g. 3KB.")
@click.option("--peak-bandwidth", help="Rate of the bytes in the bucket, e.g. 1GB/s (default: unlimited).")
@click.option("--reduce-bandwidth", help="Reduction speed (sets gamma = 1/rate), e.g. 20GB/s.")
@click.option("--algorithm", "-a", default="auto", show_default=True,
              help="ring, recursive-doubling, rabenseifner, binomial-tree, binomial-tree-openmpi, double-binary-tree, chain, "
                   "hierarchical, ... or auto (the cheapest) or all.")
@click.option("--model", default="auto", show_default=True, type=click.Choice(["auto", *(m for m in MODELS if m != "table")]),
              help="Point-to-point model (auto: LogGP when o or g is set, else Hockney).")
@click.option("--ranks-per-node", type=int, help="Ranks per node (hierarchical allreduce).")
@click.option("--inter-algorithm", help="Inter-node allreduce of 'hierarchical' [default: ring].")
@click.option("--segments", type=int, help="Pipeline segments of chain / double-binary-tree (default: best).")
@click.option("--shards", type=int, help="Parameter-server shards (push, pull, allreduce parameter-server) [default: 1].")
@click.option("--fanout", type=int, help="Gossip peers per round [default: 3].")
@click.option("--rounds", type=int, help="Gossip rounds [default: 1].")
@click.option("--density", type=FINITE_FLOAT, help="Sparse allreduce: nonzeros per rank over elements, in (0, 1] "
              "[default: 1].")
@click.option("--value-bytes", type=FINITE_FLOAT, help="Sparse allreduce: bytes per value (indices 4 bytes) [default: 4].")
@click.option("--plot", "plot_path", type=OutputFile(figure=True), help="Draw the sweep into FILE.png.")
@json_option
def comm_cmd(collective: str, size: str | None, sweep: str | None, ranks: int, plot_path: str | None,
             json_out: str | None, **kwargs: Any) -> None:
    """Price COLLECTIVE (allreduce, reduce-scatter, allgather, broadcast, reduce, all-to-all, send-recv,
    push, pull, gossip, sparse-allreduce) with the alpha-beta, LogP or LogGP model: time, algorithm and bus bandwidth
    (nccl-tests convention) and the lower bound; --sweep prints a table over sizes with the
    crossover points between algorithms.
    """
    if collective not in COLLECTIVES:
        raise SpecError(f"unknown collective {collective!r} (use {', '.join(COLLECTIVES)})", field="COLLECTIVE")
    if (size is None) == (sweep is None):
        raise SpecError("give either --size or --sweep", field="size")
    if plot_path and sweep is None:
        raise SpecError("--plot needs --sweep", field="plot")
    if plot_path:
        prepare_output(check_plot_path(plot_path), "--plot")
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    algorithm = kwargs.pop("algorithm")
    model = kwargs.pop("model")
    if sweep is not None:
        rec = comm_sweep(collective, sweep, ranks, algorithm=algorithm, model=model, **kwargs).to_dict()
        if plot_path:
            from dlsim.report.comm_plots import plot_sweep
            json_safe(rec)
            emit_plot(plot_path, lambda tmp: plot_sweep(rec, tmp))
        text = sweep_text(rec, size_is_decimal(sweep.split(":", 1)[0]))
    else:
        rec = comm(collective, size, ranks, algorithm=algorithm, model=model, **kwargs).to_dict()
        text = comm_text(rec, size_is_decimal(size))
    if json_out is not None:
        emit_json(rec, json_out)
    if wants_summary(json_out):
        json_safe(rec)
        click.echo(text)
