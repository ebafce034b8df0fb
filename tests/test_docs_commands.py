"""Every command shown in the docs runs, and prints what the docs show (issue 34; tests/docs_examples.py says
how blocks are found, run and checked, and `python tests/docs_examples.py --update` refreshes the output shown).
The README's own commands are the ones CI runs as written (.ci/run); the README stays short."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from docs_examples import ROOT, blocks, matches, pages, readme_ci_commands, run_page

PAGES = [p for p in pages() if any(b.runs and b.commands and not b.needs_torch for b in blocks(p))]
TORCH_PAGES = [p for p in pages() if any(b.runs and b.needs_torch for b in blocks(p))]
MAX_NOT_RUN = 10


def _id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_the_commands_of_a_page_run_and_print_what_it_shows(page, tmp_path):
    problems = run_page(page, tmp_path, torch=False)
    assert not problems, "\n".join(problems)


@pytest.mark.torch
@pytest.mark.parametrize("page", TORCH_PAGES, ids=_id)
def test_the_commands_needing_torch_run(page, tmp_path):
    problems = run_page(page, tmp_path, torch=True)
    assert not problems, "\n".join(problems)


def test_commands_not_run_are_few_and_say_why():
    skipped = [(b.page.name, b.line, b.title) for p in pages() for b in blocks(p) if not b.runs]
    assert len(skipped) <= MAX_NOT_RUN, skipped
    for name, line, title in skipped:
        assert re.match(r"not run by the docs tests: \S", title), f"{name}:{line}: say why: {title!r}"
    shown = [c for p in pages() for b in blocks(p) for c in b.commands]
    assert len(shown) >= 5 * len(skipped)


def test_every_shell_block_is_seen():
    """A fence the runner does not understand (```sh, ```shell, a $ prompt in a bash block) would go unrun."""
    for page in pages():
        text = page.read_text()
        assert not re.search(r"^```(sh|shell|zsh|console\w+)\b", text, re.M), page
        for block in blocks(page):
            if block.lang == "bash":
                assert not any(c.text.startswith("$ ") for c in block.commands), f"{page}:{block.line}"


def test_readme_commands_are_what_ci_runs():
    assert readme_ci_commands() == [
        "pip install -e . && dlsim simulate gpt2 --cluster dgx-h100 --dp 8 --tp 2 --pp 2 --microbatch-size 4 "
        "--num-microbatches 8",
        "pip install -e '.[dev]' && python -m pytest"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "docs_examples.py --readme-commands" in ci


def test_readme_fits_a_screen_or_few():
    text = (ROOT / "README.md").read_text()
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    assert len(prose.split()) < 1200
    for line in text.splitlines():
        if line.startswith("|"):
            assert all(len(cell.split()) <= 60 for cell in line.strip("|").split("|")), line


def test_matches_with_an_ellipsis():
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert matches(["a", "..."], ["a", "b"])
    assert not matches(["a", "...", "d"], ["a", "b", "c"])
    assert not matches(["a", "b"], ["a", "c"])
    assert matches([], ["anything"])
