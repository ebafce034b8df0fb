"""``dlsim validate``: dlsim's predictions against real PyTorch runs.

``dlsim validate MODEL --cluster PROFILE --batch N`` (the same as ``dlsim validate model MODEL ...``)
times real training iterations; ``dlsim validate kernels --cluster PROFILE`` checks held-out kernel
shapes. Other validations attach to the `validate` group.
"""

from __future__ import annotations

from typing import Any, Callable

import click

from dlsim.api.validate import validate_kernels, validate_model
from dlsim.cli import main
from dlsim.cli.command import DlsimGroup
from dlsim.cli.options import FINITE_FLOAT, json_option, parse_overrides, set_option
from dlsim.cli.output import OutputFile, check_plot_path, emit_json, emit_plot, prepare_output, state_dtype, wants_summary
from dlsim.report.text import table
from dlsim.units import format_bytes, format_time


class _DefaultModelGroup(DlsimGroup):
    """A group whose unknown first word is a model name for the ``model`` subcommand."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["model", *args]
        return super().resolve_command(ctx, args)


quiet_option = click.option("--quiet", "-q", is_flag=True,
                            help="No progress display (it is drawn on a terminal only, on stderr).")

allocator_option = click.option(
    "--allocator", type=click.Choice(["default", "retained", "jemalloc", "tcmalloc", "mimalloc"]), default="default",
    show_default=True, help="The process measured and predicted: the C library as it comes (default), freed memory "
                            "retained (mallopt), or an allocator preloaded with LD_PRELOAD.")


@main.group("validate", cls=_DefaultModelGroup)
def validate() -> None:
    """Compare predictions with real runs: `dlsim validate MODEL ...` or `dlsim validate kernels ...`."""


def _pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{100 * x:+.1f}%"


def _time(x: float | None) -> str:
    return "-" if x is None else format_time(x)


def model_report(rec: dict, top: int | None) -> str:
    """Per-layer and end-to-end predicted vs measured, as text (a time not measured prints as -)."""
    pl = rec["per_layer"]
    layers = sorted(rec["layers"], key=lambda r: -(r["measured_s"] if r["measured_s"] is not None else r["predicted_s"]))
    shown = layers[:top] if top else layers
    rows = [[r["name"], r["type"], _time(r["predicted_forward_s"]), _time(r["measured_forward_s"]),
             _time(r["predicted_backward_s"]), _time(r["measured_backward_s"]), _pct(r["error"]), r["source"]]
            for r in shown]
    body = table(["layer", "type", "fwd pred", "fwd meas", "bwd pred", "bwd meas", "error", "src"], rows,
                 [False, False, True, True, True, True, True, False])
    p, m, e = rec["predicted"], rec["measured"], rec["error"]
    phases = table(["phase", "predicted", "measured", "error"],
                   [[k, _time(p[f"{k}_s"]), _time(m[f"{k}_s"]), _pct(e[k])]
                    for k in ("forward", "backward", "optimizer", "iteration")], [False, True, True, True])
    big = pl["layers_over_1pct"]
    lines = [f"{rec['model']} batch {rec['batch']} {rec['dtype']} on {rec['cluster']} ({rec['device']}, "
             f"{rec['threads']} threads), {rec['optimizer']} ({rec['optimizer_impl']}), {rec['statistic']} of {rec['repeats']} "
             f"iterations (spread {100 * m['spread']:.1f}%), allocator {rec.get('allocator', 'default')}", "", body]
    if top and len(layers) > top:
        lines.append(f"({len(layers) - top} more layers; --all shows every layer)")
    if pl.get("measured", True):
        per_layer = (f"per layer (hooks): {big.get('count', 0)} layers over 1% of the iteration, median |error| "
                     f"{_pct(big.get('median_abs')).lstrip('+')}, worst {_pct(big.get('max_abs')).lstrip('+')}; "
                     f"time-weighted |error| {_pct(pl['time_weighted_abs_error']).lstrip('+')}")
    else:
        per_layer = f"per layer: {pl.get('why', 'not measured')}; the layers' predicted times are listed"
    lines += ["", phases, "", per_layer,
              f"end to end: predicted {_time(p['iteration_s'])}, measured {_time(m['iteration_s'])}, "
              f"error {_pct(e['iteration'])}  (src: M measured, I interpolated, X extrapolated, R roofline)",
              *fresh_page_lines(rec)]
    return "\n".join(lines)


@validate.command("model")
@click.argument("model")
@click.option("--cluster", "-c", required=True, help="Hardware profile (with measured tables) to predict with.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--batch", type=int, default=8, show_default=True)
@click.option("--dtype", default=None, help="Data type (default: the model's).")
@click.option("--optimizer", type=click.Choice(["sgd", "momentum", "adam"]), default="adam", show_default=True)
@click.option("--repeats", type=int, default=5, show_default=True, help="Timed iterations (median taken).")
@click.option("--warmup", type=int, default=2, show_default=True)
@click.option("--threads", type=int, default=None, help="Intra-op threads (default: PyTorch's).")
@click.option("--no-layers", is_flag=True, help="Skip the per-layer (hooked) iterations.")
@click.option("--statistic", type=click.Choice(["median", "min"]), default="median", show_default=True,
              help="Summarise the timed iterations by their median or (on a busy machine) their minimum.")
@click.option("--plot", type=OutputFile(figure=True), default=None, help="Write a predicted-vs-measured figure.")
@click.option("--all", "show_all", is_flag=True, help="Show every layer (default: the 25 slowest).")
@allocator_option
@quiet_option
@set_option
@json_option
def model_cmd(model: str, cluster: str, device: str, batch: int, dtype: str | None, optimizer: str, repeats: int,
              warmup: int, threads: int | None, no_layers: bool, statistic: str, plot: str | None, show_all: bool,
              allocator: str, quiet: bool, overrides: tuple[str, ...], json_out: str | None) -> None:
    """Time real training iterations of MODEL in PyTorch and compare them with dlsim's prediction."""
    from dlsim.progress import Progress
    if plot:
        prepare_output(check_plot_path(plot), "--plot")
    with Progress(enabled=False if quiet else None) as bar:
        rec = validate_model(model, cluster, batch, device=device, dtype=dtype, optimizer=optimizer, repeats=repeats,
                             warmup=warmup, per_layer=not no_layers, threads=threads,
                             overrides=parse_overrides(overrides), statistic=statistic, allocator=allocator,
                             progress=bar.callback())
    state_dtype(rec, dtype, rec["dtype"])
    _emit_model_validation(rec, plot, json_out, lambda: model_report(rec, None if show_all else 25))


def _emit_model_validation(rec: dict, plot: str | None, json_out: str | None, report: Callable[[], str]) -> None:
    """Warnings on stderr, then the plot, the JSON record and the text report of a model validation."""
    for line in rec.get("warnings", []):
        click.echo(f"warning: {line}", err=True)
    if plot:
        from dlsim.report.validation_plots import plot_model_validation
        emit_plot(plot, lambda tmp: plot_model_validation(rec, tmp))
    if json_out is not None:
        emit_json(rec, json_out)
    if wants_summary(json_out):
        click.echo(report())


@validate.command("kernels")
@click.option("--cluster", "-c", required=True, help="Hardware profile whose tables to check.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--dtype", default="fp32", show_default=True)
@click.option("--gemms", type=int, default=40, show_default=True, help="Held-out GEMM shapes.")
@click.option("--convs", type=int, default=20, show_default=True, help="Held-out convolution kernels.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--threads", type=int, default=None)
@click.option("--statistic", type=click.Choice(["median", "min"]), default="median", show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed calls per held-out kernel (use the calibration's count or more).")
@click.option("--passes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Time every kernel once per pass, in a new shuffled order each pass; min/median over passes.")
@click.option("--anchors", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also time the N measured table GEMMs nearest to each held-out one: the machine's drift "
                   "since calibration, and the error with that drift removed.")
@click.option("--plot", type=OutputFile(figure=True), default=None, help="Write a predicted-vs-measured figure.")
@quiet_option
@json_option
def kernels_cmd(cluster: str, device: str, dtype: str, gemms: int, convs: int, seed: int, threads: int | None,
                statistic: str, repeats: int, passes: int, anchors: int, plot: str | None, quiet: bool,
                json_out: str | None) -> None:
    """Time GEMM and convolution shapes the calibration did not measure; compare with the lookup."""
    from dlsim.progress import Progress
    with Progress(enabled=False if quiet else None) as bar:
        rec = validate_kernels(cluster, device=device, dtype=dtype, gemms=gemms, convs=convs, seed=seed,
                               threads=threads, statistic=statistic, repeats=repeats, passes=passes, anchors=anchors,
                               progress=bar.message)
    if plot:
        from dlsim.report.validation_plots import plot_kernel_validation
        emit_plot(plot, lambda tmp: plot_kernel_validation(rec, tmp))
    if json_out is not None:
        emit_json(rec, json_out)
        if not wants_summary(json_out):
            return
    for kind in ("gemm", "conv"):
        s = rec[kind]["summary"]
        if s.get("count"):
            click.echo(f"{kind}: {s['count']} held-out shapes, median |error| {100 * s['median_abs']:.1f}%, "
                       f"90th percentile {100 * s['p90_abs']:.1f}%, worst {100 * s['max_abs']:.1f}%")
    drift, removed = rec["gemm"]["anchor_summary"], rec["gemm"]["drift_removed_summary"]
    if drift.get("count"):
        click.echo(f"anchors: {drift['count']} table GEMMs re-timed, measured/table - 1: median |.| "
                   f"{100 * drift['median_abs']:.1f}%, mean {100 * drift['mean_signed']:+.1f}% (the machine now vs at "
                   f"calibration); gemm error with that drift removed: median |error| {100 * removed['median_abs']:.1f}%")
    for method in ("multilinear", "nearest"):
        n = rec["gemm"].get(f"{method}_summary", {})
        if n.get("count"):
            click.echo(f"gemm with the {method} lookup instead: median |error| {100 * n['median_abs']:.1f}%")
    for kind, s in rec["conv"]["by_kind"].items():
        if s.get("count"):
            click.echo(f"conv {kind}: {s['count']} kernels, median |error| {100 * s['median_abs']:.1f}%, "
                       f"worst {100 * s['max_abs']:.1f}%")


@validate.command("ddp")
@click.argument("model")
@click.option("--profile", "-p", "compute_profile", required=True,
              help="Compute profile of one rank (calibrated with --threads 1); the 2-host profile is written beside it.")
@click.option("--batch", type=int, default=4, show_default=True, help="Samples per rank.")
@click.option("--rate", default="200mbit", show_default=True, help="Per-port link rate of the emulated hosts (tc).")
@click.option("--optimizer", type=click.Choice(["sgd", "momentum", "adam"]), default="adam", show_default=True)
@click.option("--repeats", type=int, default=5, show_default=True, help="Timed DDP iterations.")
@click.option("--warmup", type=int, default=2, show_default=True)
@click.option("--bucket-mib", type=FINITE_FLOAT, default=25.0, show_default=True, help="DDP gradient bucket size.")
@click.option("--out-profile", type=OutputFile(), default=None, help="Where to write the 2-host profile (default: beside --profile).")
@click.option("--statistic", type=click.Choice(["median", "min"]), default="median", show_default=True)
@quiet_option
@set_option
@json_option
def ddp_cmd(model: str, compute_profile: str, batch: int, rate: str, optimizer: str, repeats: int, warmup: int,
            bucket_mib: float, out_profile: str | None, statistic: str, quiet: bool, overrides: tuple[str, ...],
            json_out: str | None) -> None:
    """2-host torch DDP (gloo) on the emulated cluster vs dlsim's simulation (needs root)."""
    from dlsim.api.validate import validate_ddp
    from dlsim.progress import Progress
    if repeats < 1 or warmup < 0:
        raise click.BadParameter("repeats must be >= 1 and warmup >= 0", param_hint="--repeats")
    with Progress(enabled=False if quiet else None) as bar:
        rec = validate_ddp(model, compute_profile, batch, rate=rate, optimizer=optimizer, repeats=repeats,
                           warmup=warmup, bucket_mib=bucket_mib, overrides=parse_overrides(overrides),
                           out_profile=out_profile, statistic=statistic, progress=bar.callback())
    if json_out is not None:
        emit_json(rec, json_out)
        if not wants_summary(json_out):
            return
    f, m, p = rec["link"]["fit"], rec["measured"], rec["predicted"]
    click.echo(f"link ({rate} tbf): latency {format_time(f['latency_s'])}, bandwidth "
               f"{format_bytes(f['bandwidth_bytes_per_s'])}/s (large messages fit within "
               f"{100 * f['large_message_median_abs_rel_error']:.1f}%); profile {rec['profile']}")
    click.echo(f"{rec['model']} DDP 2 ranks x {rec['batch_per_rank']} samples, {rec['threads_per_rank']} thread/rank: "
               f"measured {format_time(m['iteration_s'])} (spread {100 * m['spread']:.1f}%), predicted "
               f"{format_time(p['iteration_s'])} (compute {format_time(p['breakdown_s']['compute'])}, exposed "
               f"communication {format_time(p['breakdown_s']['exposed_comm'])}), error {_pct(rec['error'])}")


def parse_input_shape(text: str) -> list[int]:
    """``3,224,224`` -> [3, 224, 224]; one line naming the flag otherwise."""
    from dlsim.errors import SpecError
    try:
        shape = [int(v) for v in text.split(",")]
    except ValueError:
        raise SpecError(f"--input-shape must be integers like 3,224,224, got {text!r}") from None
    if not shape or min(shape) < 1:
        raise SpecError(f"--input-shape must be positive integers like 3,224,224, got {text!r}")
    return shape


def torch_report(rec: dict) -> str:
    """End to end, per phase and per operator kind, as text."""
    p, m, e = rec["predicted"], rec["measured"], rec["error"]
    phases = table(["phase", "predicted", "measured", "error"],
                   [[k, format_time(p[f"{k}_s"]), format_time(m[f"{k}_s"]), _pct(e[k])]
                    for k in ("forward", "backward", "optimizer", "iteration")], [False, True, True, True])
    kinds = table(["operator kind", "predicted", "measured (profiler)", "error"],
                  [[r["name"], format_time(r["predicted_s"]),
                    format_time(r["measured_s"]), _pct(r["error"])]
                   for r in rec["layers"]], [False, True, True, True])
    imp = rec["imported"]
    return "\n".join([
        f"{rec['factory']} ({rec['model']}, {rec['parameters']:,} parameters, {imp['layers']} dlsim layers, "
        f"{100 * imp['fallback_share']:.1f}% of the predicted time in generic layers) batch {rec['batch']} on "
        f"{rec['cluster']}, {rec['threads']} threads, {rec['optimizer']} ({rec['optimizer_impl']}), allocator "
        f"{rec['allocator']}; {rec['statistic']} of {rec['repeats']} plain-loop steps in a fresh process (spread "
        f"{100 * m['spread']:.1f}%)", "", phases, "", kinds,
        f"(per operator kind: ATen self times of {rec['per_layer']['operator_kinds'] and 'profiled'} steps; the "
        f"profiler adds its own cost to small operators)", "",
        f"end to end: predicted {format_time(p['iteration_s'])}, measured {format_time(m['iteration_s'])}, "
        f"error {_pct(e['iteration'])}", *fresh_page_lines(rec)])


RETAIN_HINT = "GLIBC_TUNABLES=glibc.malloc.trim_threshold=2147483647:glibc.malloc.mmap_max=0"
"""glibc's tunables (glibc >= 2.26) that keep freed memory in the process, as ``--allocator retained`` does
with mallopt (`dlsim.calibrate.compute_timer.retain_freed_memory`)."""


def fresh_page_lines(rec: dict) -> list[str]:
    """The step's fresh pages, predicted and measured, and the comparison without them (`FreshPageSplit`);
    with a hint where the measured ones cost at least 5% of the step in a default process."""
    fresh = rec.get("fresh_pages")
    if not fresh:
        return []
    page_us = fresh["seconds_per_byte"] * 4096 * 1e6
    w = fresh["without"]
    lines = [f"fresh pages (allocator {rec['allocator']}): predicted {format_bytes(fresh['predicted_bytes_per_step'])} "
             f"per step ({format_time(fresh['predicted_s'])}), measured {format_bytes(fresh['measured_bytes_per_step'])}"
             f" ({format_time(fresh['measured_s'])} at the profile's {page_us:.2f} us per 4 KiB page)"]
    if w["error"] is not None:
        lines.append(f"without them: predicted {format_time(w['predicted_s'])}, measured {format_time(w['measured_s'])}"
                     f", error {_pct(w['error'])} (how many pages a step faults changes from one process to the "
                     f"next with glibc's heap trimming)")
    if rec["allocator"] == "default" and fresh["measured_s"] >= 0.05 * rec["measured"]["iteration_s"]:
        lines.append(f"a process that keeps freed memory does not pay them: run it with {RETAIN_HINT} (or "
                     f"jemalloc), and predict it with --allocator retained")
    return lines


@validate.command("torch")
@click.argument("factory")
@click.option("--input-shape", required=True, help="Per-sample input shape, e.g. 3,224,224 (or L for --tokens).")
@click.option("--batch", type=click.IntRange(min=1), required=True, help="Samples per training step.")
@click.option("--cluster", "-c", required=True, help="Hardware profile (with measured tables) to predict with.")
@click.option("--tokens", is_flag=True, help="The input is integer token ids.")
@click.option("--vocab", type=int, default=2, show_default=True, help="Token ids are drawn below this (--tokens).")
@click.option("--optimizer", type=click.Choice(["sgd", "momentum", "adam"]), default="adam", show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=10, show_default=True, help="Timed steps.")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True)
@click.option("--threads", type=int, default=None, help="Intra-op threads (default: PyTorch's).")
@click.option("--statistic", type=click.Choice(["median", "min"]), default="median", show_default=True)
@click.option("--plot", type=OutputFile(figure=True), default=None, help="Write a predicted-vs-measured figure.")
@allocator_option
@quiet_option
@json_option
def torch_cmd(factory: str, input_shape: str, batch: int, cluster: str, tokens: bool, vocab: int, optimizer: str,
              repeats: int, warmup: int, threads: int | None, statistic: str, plot: str | None, allocator: str,
              quiet: bool, json_out: str | None) -> None:
    """Time YOUR PyTorch module (FILE.py:FACTORY) in a plain training loop and compare with dlsim's prediction."""
    from dlsim.api.validate_torch import validate_torch
    from dlsim.progress import Progress
    if plot:
        prepare_output(check_plot_path(plot), "--plot")
    with Progress(enabled=False if quiet else None) as bar:
        rec = validate_torch(factory, parse_input_shape(input_shape), batch, cluster, tokens=tokens, vocab=vocab,
                             optimizer=optimizer, repeats=repeats, warmup=warmup, threads=threads, statistic=statistic,
                             allocator=allocator, progress=bar.callback())
    _emit_model_validation(rec, plot, json_out, lambda: torch_report(rec))


MAX_BUDGET_S = 24 * 3600.0
"""The longest GPU-truth budget accepted (a day; the whole run is meant to take minutes)."""


def parse_budget(text: str) -> float:
    """Seconds from ``8m`` (minutes), ``90s``, ``2min``, ``0.5h`` or a plain number of seconds, in
    (0, `MAX_BUDGET_S`]."""
    import re

    from dlsim.errors import SpecError
    from dlsim.units import parse_time
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)m\s*", text)
    seconds = float(m.group(1)) * 60.0 if m else parse_time(text)
    if not seconds > 0:
        raise SpecError(f"--budget must be positive, got {text!r}")
    if seconds > MAX_BUDGET_S:
        raise SpecError(f"--budget is at most 24h (the run takes minutes), got {text!r}")
    return seconds


def gpu_text(rec: dict) -> str:
    """The run in a few lines: each network against both predictions, the families that differ."""
    rows = []
    for n in rec["networks"]:
        if n["status"] != "measured":
            rows.append([n["case"], n["mode"], n["status"], "", "", "", ""])
            continue
        rows.append([n["case"], n["mode"], format_time(n["measured_step_s"]),
                     format_time(n["predicted_builtin_s"]) if n["predicted_builtin_s"] else "-", _pct(n["error_builtin"]),
                     format_time(n["predicted_calibrated_s"]) if n["predicted_calibrated_s"] else "-",
                     _pct(n["error_calibrated"])])
    builtin = (rec.get("builtin_profile") or {}).get("name") or "-"
    lines = [f"{rec['facts'].get('device', rec['device'])}: {len(rec['networks'])} training steps, "
             f"{sum(f['kernels'] for f in rec['kernel_families'])} family kernels in {format_time(rec['elapsed_s'] or 0)}"
             f"{'' if rec['finished'] else ' (cut short)'}; built-in profile {builtin}",
             table(["network", "mode", "measured", "built-in", "error", "calibrated", "error"], rows,
                   [False, False, True, True, True, True, True])]
    differ = [f["family"] for f in rec["kernel_families"] if f["differs"]]
    if differ:
        lines.append(f"built-in efficiency off the measured by > 20%: {', '.join(differ)}")
    if rec["not_reached"]:
        lines.append(f"not reached within the budget: {', '.join(rec['not_reached'])}")
    return "\n".join(lines)


@validate.command("gpu")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="cuda: full sizes on the GPU; cpu: the same pipeline at small sizes.")
@click.option("--budget", default="8m", show_default=True,
              help="Wall-clock budget of the whole run: 8m, 90s, 2min, 0.5h; phases of decreasing value share it.")
@click.option("--out", "-o", "out_dir", default="reports", show_default=True, type=click.Path(file_okay=False),
              help="Report directory: validation-gpu-<device>.md/.json and validation-gpu-<device>/ (records, "
                   "the calibrated profile; a rerun resumes its calibration).")
@click.option("--builtin", default=None,
              help="Built-in profile of prediction (a) (default: the one whose device is this GPU's model).")
@click.option("--compile-backend", type=click.Choice(["inductor", "aot_eager", "eager", "none"]), default="inductor",
              show_default=True, help="torch.compile backend of the compiled steps (none: no compiled steps).")
@click.option("--threads", type=int, default=None, help="Intra-op threads (default: PyTorch's).")
@click.option("--report-only", is_flag=True,
              help="Measure nothing: rewrite the report of the last run in --out from its records and profile.")
@json_option
def gpu_cmd(device: str, budget: str, out_dir: str, builtin: str | None, compile_backend: str, threads: int | None,
            report_only: bool, json_out: str | None) -> None:
    """Calibrate and validate on one GPU within a time budget: device facts, GEMM curve, real training steps
    (Llama 1.1B, GPT-2, ResNet-50; eager and compiled) against the built-in and the calibrated profile."""
    from dlsim.api.validate_gpu import report_gpu_in, validate_gpu
    from dlsim.progress import Progress
    if report_only:
        rec = report_gpu_in(out_dir, device)
    else:
        seconds = parse_budget(budget)
        with Progress() as bar:
            rec = validate_gpu(out_dir, device=device, budget_s=seconds, builtin=builtin,
                               compile_backend=compile_backend, threads=threads, progress=bar.line)
    if json_out is not None:
        emit_json(rec, json_out)
        if not wants_summary(json_out):
            return
    click.echo(gpu_text(rec))
    click.echo(f"wrote {rec['report_md']} and {rec['report_json']}; calibrated profile {rec['calibrated_profile']}")
