"""The benchmarks and reports indexes (issue 28): every script in `benchmarks/` and every report in
`reports/` is listed in its folder's README, so that nothing there is an orphan nobody can regenerate."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _unlisted(folder: str, name_of) -> list[str]:
    index = (ROOT / folder / "README.md").read_text()
    return sorted(p.name for p in (ROOT / folder).iterdir()
                  if p.name != "README.md" and not p.name.startswith((".", "__")) and name_of(p) not in index)


def test_every_benchmark_is_in_the_benchmarks_index():
    assert _unlisted("benchmarks", lambda p: p.name) == []


def test_every_report_is_in_the_reports_index():
    """A report is listed by its stem (`validation-stacks.{md,json}` lists both files)."""
    assert _unlisted("reports", lambda p: p.name.split(".")[0]) == []
