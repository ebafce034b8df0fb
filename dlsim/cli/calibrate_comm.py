"""``dlsim calibrate comm``: measure real point-to-point and collective times into a hardware profile."""

from __future__ import annotations

import sys

import click

from dlsim.cli import resumable

from dlsim.api.calibrate_comm import calibrate_comm, import_nccl_tests, size_range
from dlsim.cli.calibrate import calibrate
from dlsim.cli.options import FINITE_FLOAT, json_option
from dlsim.cli.output import emit_json, wants_summary
from dlsim.units import format_time, parse_time


def _print_fits(fits: dict) -> None:
    if not fits:
        return
    hk, link = fits["hockney"], fits["link"]
    click.echo(f"  Hockney: alpha {format_time(hk['alpha'])}, beta {hk['beta'] * 1e9:.4g} ns/B "
               f"({1 / hk['beta'] / 1e6 if hk['beta'] else float('inf'):.4g} MB/s), median error "
               f"{hk['median_abs_rel_error']:.1%} over {hk['points']} sizes")
    lg = fits.get("loggp_netgauge", {})
    if "L" in lg:
        click.echo(f"  LogGP (Netgauge PRTT): L {format_time(lg['L'])}, o {format_time(lg['o'])}, "
                   f"g {format_time(lg['g'])}, G {lg['G'] * 1e9:.4g} ns/B")
    click.echo(f"  profile tier: L {format_time(link['latency'])}, o {format_time(link['overhead'])}, "
               f"g {format_time(link['gap'])}, {link['bandwidth'] / 1e6:.4g} MB/s")
    if "gamma_s_per_byte" in fits:
        click.echo(f"  reduction gamma {fits['gamma_s_per_byte'] * 1e12:.4g} ps/B")


@calibrate.command("comm")
@click.option("--backend", type=click.Choice(["mpi", "gloo", "nccl"]), default="mpi", show_default=True)
@click.option("--ranks", "-n", type=int, default=2, show_default=True, help="Processes (one per host with --hosts).")
@click.option("--out", "-o", required=False, help="Profile directory (created; a rerun resumes and keeps what exists).")
@click.option("--hosts", default=None, metavar="local|ssh:H1,H2,...",
              help="Where ranks run: this machine (default) or one rank per host over ssh.")
@click.option("--emulated", type=int, default=None, metavar="HOSTS",
              help="Build an emulated cluster of HOSTS network namespaces (root) and run one rank per host.")
@click.option("--rate", default="200mbit", show_default=True, help="Link rate of each emulated host (tc tbf).")
@click.option("--burst", default="64kb", show_default=True, help="tbf bucket depth of each emulated link.")
@click.option("--queue", default="100ms", show_default=True, help="tbf queue (latency) of each emulated link.")
@click.option("--tcp-congestion", default=None, help="TCP congestion control of the emulated hosts (e.g. reno).")
@click.option("--algorithm", "algorithms", multiple=True,
              help="Forced Open MPI allreduce algorithm to measure (repeatable; default: ring, recursive-doubling, "
                   "rabenseifner, binomial-tree-openmpi with mpi; 'none' for none).")
@click.option("--collective", "collectives", multiple=True, help="Collectives to measure (repeatable; default all).")
@click.option("--sizes", default=None, metavar="LO:HI", help="Collective sizes, powers of two (default 1KiB:16MiB).")
@click.option("--idle-gap", default="0", show_default=True, metavar="TIME",
              help="Every rank sleeps TIME (e.g. 1ms) before each collective repetition, so the links are idle "
                   "(a token bucket refills) as when a collective follows compute; 0: back to back.")
@click.option("--idle-wait", type=click.Choice(["sleep", "spin", "sleep-barrier"]), default="sleep", show_default=True,
              help="How ranks wait out --idle-gap: sleep (CPUs idle too), spin (only the links idle), or "
                   "sleep-barrier (sleep, then one extra barrier to wake the ranks).")
@click.option("--budget", type=FINITE_FLOAT, default=0.5, show_default=True, help="Seconds of repetitions per point.")
@click.option("--max-reps", type=int, default=40, show_default=True)
@click.option("--quick", is_flag=True, help="Few sizes and repetitions (a smoke test).")
@click.option("--import-nccl-tests", "nccl_files", multiple=True, type=click.Path(),
              help="Import nccl-tests output (all_reduce_perf ...) into OUT's collective table instead of measuring.")
@click.option("--quiet", "-q", is_flag=True, help="No per-point progress lines.")
@json_option
def comm_cmd(backend: str, ranks: int, out: str | None, hosts: str | None, emulated: int | None, rate: str, burst: str,
             queue: str, tcp_congestion: str | None, algorithms: tuple[str, ...], collectives: tuple[str, ...], sizes: str | None, budget: float,
             max_reps: int, quick: bool, nccl_files: tuple[str, ...], quiet: bool, json_out: str | None, idle_gap: str,
             idle_wait: str) -> None:
    """Ping-pong and PRTT over sizes (alpha-beta and LogGP fits), then collectives over sizes.

    Writes comm_p2p.csv, comm_collectives.csv, meta.yaml and profile.yaml into OUT. Interrupt it at any
    time: rerunning the same command measures only what is missing.
    """
    if not out:
        raise click.UsageError("--out PROFILE_DIR is required")
    idle_gap_s = parse_time(idle_gap)
    if nccl_files:
        if len(collectives) > 1:
            raise click.UsageError("--import-nccl-tests takes one --collective (the one the files measured)")
        rec = import_nccl_tests(out, nccl_files, collective=collectives[0] if collectives else None)
        rec["dtype"] = "as in the nccl-tests files (sizes in bytes)"
        if json_out is not None:
            emit_json(rec, json_out)
            if not wants_summary(json_out):
                return
        click.echo(f"{rec['out']}: {rec['rows_added']} rows imported from {len(rec['files'])} file(s), "
                   f"{rec['rows_already_there']} already there")
        for line in rec["profile"]:
            click.echo(f"  {line}")
        return
    forced = None if not algorithms else tuple(a for a in algorithms if a != "none")
    resumable("every point measured so far")
    rec = calibrate_comm(out, backend=backend, ranks=ranks, hosts=hosts, algorithms=forced,
                         sizes=size_range(sizes) if sizes else None, collectives=collectives or None, quick=quick,
                         budget_s=budget, max_reps=max_reps, emulated=emulated, rate=rate, burst=burst, queue=queue,
                         tcp_congestion=tcp_congestion, quiet=quiet, command="dlsim " + " ".join(sys.argv[1:]),
                         idle_gap_s=idle_gap_s, idle_wait=idle_wait)
    rec["dtype"] = "bytes (messages are untyped; reductions on float32)"
    if json_out is not None:
        emit_json(rec, json_out)
        if not wants_summary(json_out):
            return
    total = sum(x["seconds"] for x in rec["launches"])
    click.echo(f"{rec['out']}: {backend} on {rec['ranks']} ranks ({rec['hosts']}), {len(rec['launches'])} launch(es) "
               f"in {format_time(total)}")
    _print_fits(rec["fits"])
    for line in rec["profile"]:
        click.echo(f"  {line}")
