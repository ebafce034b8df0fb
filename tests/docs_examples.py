"""The commands shown in the docs (docs/**/*.md) and the README, found, run and checked (issue 34).

What runs: every fenced ``console`` block (a line ``$ COMMAND`` is a command, ``\\`` at a line's end
continues it, the lines after it are its output as pasted) and every fenced ``bash`` block (each line a
command; ``#`` starts a comment). A page's blocks run in order in one scratch directory that sees the
repository's ``examples/``, ``models/``, ``hardware_profiles/``, ``benchmarks/`` and ``tests/``, so a later
command reads what an earlier one wrote. ``dlsim ...`` runs in this process (``dlsim.cli.run``); anything else
in ``bash -c`` with this checkout on ``PYTHONPATH``.

What a block says about itself, in its title (mkdocs-material shows the title above the block): a
block of any other language titled with a relative file name (``title="tiny-gpt.yaml"``) is that file, written
into the scratch directory where it stands in the page, for the commands after it;
``title="not run by the docs tests: REASON"`` is not run (kept few: long calibrations, root, a GPU);
``title="needs PyTorch ..."`` runs only where torch is installed (CI's second leg). A command expects exit
code 0, or 1 when its pasted output's last line starts with ``error:``.

What is checked: the exit code, and a console block's pasted output against the command's (stdout, then
stderr), line by line after stripping trailing blanks; a line ``...`` stands for any number of lines.
``python tests/docs_examples.py --update`` re-runs every page and pastes the current code's output into the
console blocks (keeping each block's ``...`` cut: its first and last lines around it) and copies the figures
a page draws into docs/img (`FIGURES`).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINKED = ("examples", "models", "hardware_profiles", "benchmarks", "tests")
_FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
_TITLE = re.compile(r'title="([^"]*)"')
_FILE = re.compile(r"^[\w.-]+(/[\w.-]+)*\.\w+$")  # a relative file name: the block is that file's text
ELLIPSIS = "..."


@dataclass
class Command:
    text: str                     # the command as shown (continuations joined)
    output: list[str] | None      # the pasted output (console blocks), else None
    start: int = 0                # offsets of the output in the page's text (for --update)
    end: int = 0

    @property
    def expected_code(self) -> int:
        return 1 if self.output and self.output[-1].startswith("error:") else 0


@dataclass
class Block:
    page: Path
    lang: str
    title: str
    line: int
    commands: list[Command] = field(default_factory=list)
    body: str = ""                # a file block's text

    @property
    def runs(self) -> bool:
        return not self.title.lower().startswith("not run")

    @property
    def needs_torch(self) -> bool:
        return "needs pytorch" in self.title.lower()


def pages() -> list[Path]:
    """The README and every page of the docs site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _join_continuations(lines: list[tuple[int, str]]) -> list[tuple[int, int, str]]:
    """(start offset, end offset, text) of each logical line: a line ending in a backslash continues."""
    out: list[tuple[int, int, str]] = []
    pending: tuple[int, str] | None = None
    for offset, line in lines:
        if pending is not None:
            start, text = pending
            text = text[:-1].rstrip() + " " + line.strip()
        else:
            start, text = offset, line
        end = offset + len(line) + 1
        if text.rstrip().endswith("\\"):
            pending = (start, text.rstrip())
        else:
            pending = None
            out.append((start, end, text))
    return out


def blocks(page: Path) -> list[Block]:
    """The console and bash blocks of a page, with their commands (and pasted outputs)."""
    text = page.read_text()
    found = []
    for match in _FENCE.finditer(text):
        lang, info, body = match.group(1), match.group(2), match.group(3)
        title = (_TITLE.search(info).group(1) if _TITLE.search(info) else "")
        block = Block(page, lang, title, text.count("\n", 0, match.start()) + 1)
        if _FILE.match(title) and lang not in ("console", "bash"):
            block.lang, block.body = "file", body
            found.append(block)
            continue
        if lang not in ("console", "bash"):
            continue
        offset = match.start(3)
        raw = []
        for line in body.splitlines():
            raw.append((offset, line))
            offset += len(line) + 1
        logical = _join_continuations(raw)
        if lang == "bash":
            for _, _, line in logical:
                command = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
                if command:
                    block.commands.append(Command(command, None))
        else:
            current: Command | None = None
            for start, end, line in logical:
                if line.startswith("$ "):
                    current = Command(line[2:].strip(), [], end, end)
                    block.commands.append(current)
                elif current is not None:
                    current.output.append(line.rstrip())
                    current.end = end
        found.append(block)
    return found


def _workdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        link = path / name
        if not link.exists():
            link.symlink_to(ROOT / name)
    return path


def _write(cwd: Path, block: Block) -> None:
    path = cwd / block.title
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(block.body)


def run_command(command: str, cwd: Path) -> tuple[int, str]:
    """Run one command in `cwd`: its exit code and its output (stdout, then stderr)."""
    words = shlex.split(command)
    if words and words[0] == "dlsim" and not any(w in ("|", ">", "<", "&&", ";") for w in words):
        from dlsim.cli import run
        out, err = io.StringIO(), io.StringIO()
        here = os.getcwd()
        os.chdir(cwd)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = run(words[1:])
        finally:
            os.chdir(here)
        return code, out.getvalue() + err.getvalue()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def _lines(output: str) -> list[str]:
    return [line.rstrip() for line in output.rstrip("\n").splitlines()]


def matches(pasted: list[str], actual: list[str]) -> bool:
    """`actual` equals `pasted`, where a pasted line "..." stands for any number of lines."""
    if not pasted:
        return True  # a console block may show a command without its output
    if ELLIPSIS not in pasted:
        return pasted == actual
    head = pasted[:pasted.index(ELLIPSIS)]
    rest = pasted[pasted.index(ELLIPSIS) + 1:]
    if actual[:len(head)] != head:
        return False
    remaining = actual[len(head):]
    return any(matches(rest, remaining[i:]) for i in range(len(remaining) + 1)) if rest else True


def _runs(page: Path, workdir: Path, torch: bool):
    """Run a page's blocks in order (files written, blocks needing torch only if `torch`): yields each command
    with its block, exit code and output."""
    cwd = _workdir(workdir)
    for block in blocks(page):
        if block.lang == "file":
            _write(cwd, block)
        elif block.runs and (torch or not block.needs_torch):
            for command in block.commands:
                yield (block, command, *run_command(command.text, cwd))


def run_page(page: Path, workdir: Path, torch: bool) -> list[str]:
    """Run a page's runnable blocks (those needing torch only if `torch`); the problems found, one line each."""
    problems = []
    for block, command, code, output in _runs(page, workdir, torch):
        where = f"{page.relative_to(ROOT)}:{block.line}: {command.text}"
        if code != command.expected_code:
            problems.append(f"{where}: exit code {code}, expected {command.expected_code}: {output[-600:]}")
        elif command.output is not None and not matches(command.output, _lines(output)):
            problems.append(f"{where}: the pasted output differs from the command's (python tests/docs_examples.py "
                            f"--update pastes the current output):\n{output}")
    return problems


def update_page(page: Path, workdir: Path, torch: bool) -> int:
    """Paste the current output under each console command of a page; returns how many outputs changed."""
    text = page.read_text()
    edits: list[tuple[int, int, str]] = []
    for block, command, code, output in _runs(page, workdir, torch):
        if code != command.expected_code:
            raise SystemExit(f"{page}:{block.line}: {command.text}: exit code {code}\n{output}")
        if command.output is None:
            continue
        lines = _lines(output)
        if ELLIPSIS in command.output:
            cut = command.output.index(ELLIPSIS)
            tail = len(command.output) - cut - 1
            if len(lines) > cut + tail:
                lines = lines[:cut] + [ELLIPSIS] + (lines[-tail:] if tail else [])
        if lines != command.output:
            edits.append((command.start, command.end, "".join(f"{line}\n" for line in lines)))
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    page.write_text(text)
    return len(edits)


# Figures the docs show, drawn by a page's own commands: `--update` copies them from the scratch directory.
FIGURES = {"docs/tutorial/llama3-70b.md": {"front.png": "docs/img/llama3-70b-front.png",
                                           "cmp.png": "docs/img/llama3-70b-compare.png",
                                           "gantt.png": "docs/img/llama3-70b-gantt.png"}}


def copy_figures(page: Path, workdir: Path) -> None:
    import shutil
    for made, kept in FIGURES.get(str(page.relative_to(ROOT)), {}).items():
        shutil.copyfile(workdir / made, ROOT / kept)


def readme_ci_commands() -> list[str]:
    """The README's install and test commands: its first bash block, which .ci/run runs as written."""
    first = next(b for b in blocks(ROOT / "README.md") if b.lang == "bash")
    return [c.text for c in first.commands]


if __name__ == "__main__":
    import argparse
    import tempfile
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="paste the current output into the console blocks")
    parser.add_argument("--readme-commands", action="store_true", help="print the README's install and test commands")
    parser.add_argument("pages", nargs="*", type=Path, help="pages to run (default: all)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.readme_commands:
        print("\n".join(readme_ci_commands()))
        raise SystemExit(0)
    import importlib.util
    has_torch = importlib.util.find_spec("torch") is not None
    failed = 0
    for page in [p.resolve() for p in args.pages] or pages():
        with tempfile.TemporaryDirectory() as tmp:
            if args.update:
                print(f"{page.relative_to(ROOT)}: {update_page(page, Path(tmp), has_torch)} outputs updated")
                copy_figures(page, Path(tmp))
            else:
                problems = run_page(page, Path(tmp), has_torch)
                failed += len(problems)
                print("\n".join(problems) or f"{page.relative_to(ROOT)}: ok")
    raise SystemExit(1 if failed else 0)
