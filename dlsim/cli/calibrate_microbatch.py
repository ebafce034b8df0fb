"""``dlsim calibrate microbatch``: time the NumPy convolution algorithms per layer, pass and micro-batch size."""

from __future__ import annotations

import click

from dlsim.cli import resumable

from dlsim.api.microbatch import calibrate_microbatch
from dlsim.cli.calibrate import calibrate
from dlsim.cli.options import parse_overrides, set_option
from dlsim.cli.output import OutputFile
from dlsim.cost.conv_methods import METHODS, PASSES
from dlsim.plan.microbatch.policies import POLICIES


@calibrate.command("microbatch")
@click.argument("model")
@click.option("--batch", type=int, required=True, help="Mini-batch size the table is for.")
@click.option("--out", required=True, type=OutputFile(resume=True),
              help="Benchmark CSV to write (resumed if it exists; rows are never rewritten).")
@click.option("--policy", type=click.Choice(POLICIES), default="powerOfTwo", show_default=True,
              help="Which micro-batch sizes to measure.")
@click.option("--layers", help="Comma-separated convolution layer names or prefixes (default: all).")
@click.option("--passes", default=",".join(PASSES), show_default=True, help="Comma-separated passes.")
@click.option("--algorithms", default=",".join(METHODS), show_default=True, help="Comma-separated algorithms.")
@click.option("--max-workspace", default=None, help="Skip configurations needing more workspace (e.g. 256MiB).")
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed repetitions (median kept).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="BLAS threads (1 gives steadier timings on a shared machine).")
@click.option("--no-prune", is_flag=True, help="Also time configurations dominated at the same micro-batch size.")
@click.option("--quiet", "-q", is_flag=True, help="No progress display (it is drawn on a terminal only, on stderr).")
@set_option
def microbatch_calibrate_cmd(model: str, batch: int, out: str, policy: str, layers: str | None, passes: str,
                             algorithms: str, max_workspace: str | None, repeats: int, threads: int | None,
                             no_prune: bool, quiet: bool, overrides: tuple[str, ...]) -> None:
    """Measure direct, im2col, FFT and Winograd convolutions (NumPy, fp32) on this CPU for MODEL's convolutions.

    Writes the table `dlsim plan microbatch MODEL --bench-table OUT` plans with; a progress bar on a terminal.
    """
    def split(text: str | None) -> list[str] | None:
        return [s.strip() for s in text.split(",") if s.strip()] if text else None
    from dlsim.calibrate.health import LoadWatch, quantisation_warning
    from dlsim.cli.calibrate_compute import print_warnings
    from dlsim.progress import Progress
    watch = LoadWatch(threads=threads or 1).start()
    resumable("every row measured so far")
    with Progress(enabled=False if quiet else None) as bar:
        table = calibrate_microbatch(model, batch, out, policy=policy, layers=split(layers),
                                     passes=split(passes) or PASSES, methods=split(algorithms) or METHODS,
                                     max_workspace=max_workspace, repeats=repeats, threads=threads,
                                     prune=not no_prune, overrides=parse_overrides(overrides), progress=lambda msg: bar.message(msg, keep_uncounted=True))
    rows = sum(len(k.rows) for k in table.kernels)
    times = [r.time_s for k in table.kernels for r in k.rows]
    print_warnings([w for w in (quantisation_warning(times), watch.warning()) if w])
    click.echo(f"{out}: {rows} rows for {len(table.layers())} layers")
