"""The committed reproduction reports equal what their commands now write (issue 32 item 5).

Every reproduction of benchmarks/seeds_reproduce.py is regenerated into a temporary folder and its
markdown and JSON records compared with the committed ones in reports/seeds/ (and the AlexNet
strategy study's in reports/), then the index reports/seeds-reproduced.md. Regenerating all of them
takes minutes: those tests are marked slow and run as their own step of .ci/run; the default suite
checks the committed index itself (every seed number within 15% of dlsim's or with its reason).
Figures (PNG) are not compared byte for byte: their pixels depend on the matplotlib build.
The per-stack validation of published runs (reports/validation-stacks.json), the published GPU runs
(reports/validation-published-gpu.json) and the whole-run report (reports/validation-run.md) are held to
what their benchmarks now predict.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "seeds"))

import seeds_reproduce  # noqa: E402
from common import REPORTS, SEEDS  # noqa: E402

INDEX = REPORTS / "seeds-reproduced.md"
_RUNS: dict[str, tuple[dict, Path]] = {}


def _regenerated(name: str, tmp: Path) -> tuple[dict, Path]:
    """(summary, folder) of reproduction `name` written into a temporary folder (once per session)."""
    if name not in _RUNS:
        out = tmp / name
        _RUNS[name] = (seeds_reproduce.reproduce(name, out), out)
    return _RUNS[name]


def _committed(name: str, out: Path) -> list[tuple[Path, Path]]:
    """(regenerated, committed) pairs of the markdown and JSON files reproduction `name` wrote."""
    pairs = []
    for new in sorted(out.iterdir()):
        if new.suffix not in (".md", ".json"):
            continue
        old = (REPORTS if new.name.startswith("strategies-") else SEEDS) / new.name
        pairs.append((new, old))
    return pairs


def _text(path: Path, out: Path) -> str:
    return path.read_text().replace(str(out), str(SEEDS))


@pytest.fixture(scope="module")
def tmp_reports(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reports")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(seeds_reproduce.NAMES))
def test_committed_report_equals_its_command(name: str, tmp_reports: Path) -> None:
    _, out = _regenerated(name, tmp_reports)
    pairs = _committed(name, out)
    assert any(new.suffix == ".md" for new, _ in pairs), f"{name} wrote no report"
    for new, old in pairs:
        assert old.exists(), f"{old.relative_to(ROOT)} is not committed (run python benchmarks/seeds_reproduce.py {name})"
        assert _text(new, out) == old.read_text(), (
            f"{old.relative_to(ROOT)} differs from what `python benchmarks/seeds_reproduce.py {name}` now writes: "
            "regenerate it and commit the result")


@pytest.mark.slow
def test_committed_index_equals_its_command(tmp_reports: Path) -> None:
    results = {name: _regenerated(name, tmp_reports)[0] for name in seeds_reproduce.NAMES}
    seeds_reproduce.write_index(results, tmp_reports)
    assert (tmp_reports / INDEX.name).read_text() == INDEX.read_text(), (
        "reports/seeds-reproduced.md differs from what `python benchmarks/seeds_reproduce.py` now writes")


def test_index_lists_every_seed_number_within_tolerance_or_with_its_reason() -> None:
    """The committed index: one row per compared number, each within 15% or saying why not."""
    text = INDEX.read_text()
    rows = [line for line in text.split("## Every seed number", 1)[1].splitlines() if line.startswith("| (")]
    names = {seeds_reproduce.NAMES[n] for n in seeds_reproduce.NAMES}
    assert len(rows) >= len(names)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        error, agreement = cells[4], cells[5]
        pct = abs(int(re.fullmatch(r"[+-]?(\d+)%", error).group(1)))
        assert (pct <= 15 and agreement.startswith("within 15%")) or (agreement.startswith("outside: ")
                                                                       and len(agreement) > 30), row
    for name in seeds_reproduce.NAMES:
        assert f"seeds_reproduce.py {name}`" in text


@pytest.mark.slow
def test_committed_stack_validation_equals_its_command() -> None:
    """reports/validation-stacks.json holds what `python benchmarks/validate_stacks.py --report` now
    predicts for every run of benchmarks/stack_runs/ (and no run that is gone)."""
    import json

    import validate_stacks

    committed = json.loads((ROOT / "reports" / "validation-stacks.json").read_text())
    old = {(r["stack"], r["run"]): r["predicted_s"] for r in committed["runs"]}
    new = {}
    for spec in validate_stacks.load_sets():
        for run in spec["runs"]:
            new[(spec["stack"], run["id"])] = validate_stacks.run_one(spec, run)["predicted_s"]
    stale = "regenerate it with python benchmarks/validate_stacks.py --report and commit the result"
    assert new.keys() == old.keys(), f"reports/validation-stacks.json lists other runs: {stale}"
    for key, seconds in new.items():
        assert seconds == pytest.approx(old[key], rel=1e-9), f"{key}: {seconds} s now, {old[key]} s committed: {stale}"


@pytest.mark.slow
def test_committed_published_gpu_validation_equals_its_command() -> None:
    """reports/validation-published-gpu.json holds what `python benchmarks/validate_published.py --report`
    now predicts for its Selene, GPT-3 H100 and Llama 3.1 runs (the sensitivity variants are not rerun)."""
    import json

    import validate_published

    committed = json.loads((ROOT / "reports" / "validation-published-gpu.json").read_text())
    stale = "regenerate it with python benchmarks/validate_published.py --report --sensitivity and commit the result"
    for key, runs, one in (("runs", validate_published.published_runs(), validate_published.run_one),
                           ("h100_runs", validate_published.h100_runs(), validate_published.run_stack),
                           ("llama_runs", validate_published.llama_runs(), validate_published.run_stack)):
        old = {r["run"]: r["predicted_s"] for r in committed[key]}
        new = {run["run"]: one(run)["predicted_s"] for run in runs}
        assert new.keys() == old.keys(), f"{key}: other runs than committed: {stale}"
        for name, seconds in new.items():
            assert seconds == pytest.approx(old[name], rel=1e-9), f"{name}: {seconds} s now, {old[name]} s: {stale}"


@pytest.mark.slow
def test_committed_whole_run_validation_equals_its_command() -> None:
    """reports/validation-run.md is what `python benchmarks/validate_run.py` now writes."""
    import validate_run

    text = validate_run.report(validate_run.interruptions(), [validate_run.one(s) for s in validate_run.RUNS])
    assert text == (ROOT / "reports" / "validation-run.md").read_text(), (
        "reports/validation-run.md differs from what `python benchmarks/validate_run.py` now writes: regenerate it "
        "and commit the result")


def test_published_gpu_and_stack_reports_agree_run_by_run() -> None:
    """The H100 runs of reports/validation-published-gpu.json (GPT-3 175B, Llama 3.1) are the megatron-core
    set's: each run has the same prediction in both reports (one pricing per run: the stack and the run's
    own configuration)."""
    import json

    stacks = json.loads((ROOT / "reports" / "validation-stacks.json").read_text())
    published = json.loads((ROOT / "reports" / "validation-published-gpu.json").read_text())
    by_id = {r["run"]: r["predicted_s"] for r in stacks["runs"] if r["stack"] == "megatron-core"}
    rows = published["h100_runs"] + published["llama_runs"]
    assert rows and {r["run"] for r in rows} == set(by_id)
    for r in rows:
        assert r["predicted_s"] == by_id[r["run"]], r["run"]


def test_committed_attention_kernel_validation_equals_its_command() -> None:
    """reports/validation-attention-a100.json holds what `python benchmarks/validate_attention_kernels.py
    --report` now predicts, entry by entry (fast: a few hundred kernel prices)."""
    import json

    import validate_attention_kernels as vak

    from dlsim.io.profile_yaml import load_profile

    committed = json.loads((ROOT / "reports" / "validation-attention-a100.json").read_text())
    key = ("kernel", "head_dim", "causal", "seq")
    old = {tuple(r[k] for k in key): r["dlsim_tflops"] for r in committed["rows"]}
    new = {tuple(r[k] for k in key): r["dlsim_tflops"] for r in vak.rows(load_profile("dgx-a100").device)}
    stale = "regenerate it with python benchmarks/validate_attention_kernels.py --report and commit the result"
    assert new.keys() == old.keys(), stale
    for k, tflops in new.items():
        assert tflops == pytest.approx(old[k], rel=1e-9), f"{k}: {tflops} now, {old[k]} committed: {stale}"
