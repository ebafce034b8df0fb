"""Build-time generators of the docs site (mkdocs hooks), so that two pages are drawn from the code itself.

- The command-line reference: each command's ``--help`` exactly as ``dlsim COMMAND --help`` prints it (its
  rich-click option panels included), walked from the click command tree. (mkdocs-click renders these
  commands with empty option lists or ``Sentinel.UNSET`` defaults under click 8.3 and rich-click, so the
  reference runs the commands' own help instead.)
- The architecture drawing: a mermaid graph of dlsim's top-level parts with an edge wherever a module of one
  imports a module of another (grimp, the import graph import-linter checks), grouped by the layers of the
  "one-way data flow" contract in pyproject.toml.

A page asks for them with the markers ``<!-- generated: cli-reference -->``,
``<!-- generated: import-graph -->`` and ``<!-- generated: scenario-graph -->`` (who imports the scenario).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI_MARK = "<!-- generated: cli-reference -->"
GRAPH_MARK = "<!-- generated: import-graph -->"
SCENARIO_MARK = "<!-- generated: scenario-graph -->"


def _help(path: list[str]) -> str:
    from dlsim.cli import run
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run([*path, "--help"])
    if code != 0:
        raise RuntimeError(f"dlsim {' '.join(path)} --help exited {code}")
    return "\n".join(line.rstrip() for line in out.getvalue().strip("\n").splitlines())


def cli_reference() -> str:
    """Markdown: one section per command and subcommand, its help in a text block."""
    os.environ.setdefault("TERMINAL_WIDTH", "100")  # rich-click's width when there is no terminal
    from dlsim.cli import _register, main
    _register()
    parts = ["## dlsim", "", "```text", _help([]), "```", ""]
    for name in sorted(main.commands):
        command = main.commands[name]
        subcommands = sorted(getattr(command, "commands", {}))
        parts += [f"## dlsim {name}", "", "```text", _help([name]), "```", ""]
        for sub in subcommands:
            parts += [f"### dlsim {name} {sub}", "", "```text", _help([name, sub]), "```", ""]
    return "\n".join(parts)


def _part(module: str) -> str:
    """`dlsim.cost.layers._moe` -> `cost`: the top-level package or module a module belongs to."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else pieces[0]


def import_edges() -> set[tuple[str, str]]:
    """(importer, imported) pairs of dlsim's top-level parts, from every direct import between their modules."""
    import grimp
    graph = grimp.build_graph("dlsim")
    edges = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = _part(module), _part(imported)
            if a != b and module != "dlsim" and imported != "dlsim":
                edges.add((a, b))
    return edges


def layers() -> list[list[str]]:
    """The layers of import-linter's "one-way data flow" contract, highest first, as top-level part names."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    contract = next(c for c in config if c.get("type") == "layers")
    return [[name.strip().removeprefix("dlsim.") for name in layer.split("|")] for layer in contract["layers"]]


def reduced(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The transitive reduction: an edge stays unless a longer path already joins its ends."""
    succ: dict[str, set[str]] = {}
    for a, b in edges:
        succ.setdefault(a, set()).add(b)

    def reachable(start: str, skip: tuple[str, str]) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for nxt in succ.get(node, ()):
                if (node, nxt) != skip and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen
    return {(a, b) for a, b in edges if b not in reachable(a, (a, b))}


def import_graph() -> str:
    """A mermaid flowchart of the layers top to bottom (an arrow where one part imports another and no longer
    chain of imports joins them already), then every part's direct imports in a table."""
    edges = import_edges()
    stack = layers()
    placed = {name for layer in stack for name in layer}
    loose = sorted({n for edge in edges for n in edge} - placed - {"__main__"})
    lines = ["```mermaid", "flowchart TB"]
    for depth, layer in enumerate(stack):
        lines.append(f'  subgraph L{depth}["layer {len(stack) - 1 - depth}"]')
        lines += [f"    {name}" for name in layer]
        lines.append("  end")
    if loose:
        lines.append('  subgraph helpers["helpers outside the layers"]')
        lines += [f"    {name}" for name in loose]
        lines.append("  end")
    shown = {(a, b) for a, b in edges if "__main__" not in (a, b)}
    lines += [f"  {a} --> {b}" for a, b in sorted(reduced(shown))]
    lines.append("```")
    upward = sorted((a, b) for a, b in edges if a in placed and b in placed and _depth(stack, a) > _depth(stack, b))
    lines += ["", f"{len(shown)} import relations between {len(placed | set(loose))} parts (the drawing leaves out "
              f"{len(shown) - len(reduced(shown))} that a chain of arrows already implies); "
              f"{len(upward)} point from a lower layer to a higher one{': ' + str(upward) if upward else ''}.", "",
              "| part | imports directly |", "|---|---|"]
    for name in [n for layer in stack for n in layer] + loose:
        targets = sorted(b for a, b in shown if a == name)
        lines.append(f"| `{name}` | {', '.join(f'`{b}`' for b in targets) or '(nothing in dlsim)'} |")
    return "\n".join(lines) + "\n"


def scenario_graph() -> str:
    """The modules that import `dlsim.plan.scenario` (the one place a scenario is assembled and priced) and the
    modules it imports, as a mermaid flowchart; a sentence when this build has no such module."""
    import grimp
    graph = grimp.build_graph("dlsim")
    target = "dlsim.plan.scenario"
    if target not in graph.modules:
        return f"*This build has no `{target}` module yet; the drawing appears when it does.*\n"
    users = sorted(graph.find_modules_that_directly_import(target))
    used = sorted(m for m in graph.find_modules_directly_imported_by(target)
                  if m.startswith(("dlsim.plan", "dlsim.cost", "dlsim.spec")))
    ident = {m: m.replace(".", "_") for m in [target, *users, *used]}
    lines = ["```mermaid", "flowchart LR"]
    lines += [f'  {ident[m]}["{m}"] --> {ident[target]}["{target}"]' for m in users]
    lines += [f'  {ident[target]} --> {ident[m]}["{m}"]' for m in used]
    lines.append("```")
    return "\n".join(lines) + "\n"


def _depth(stack: list[list[str]], name: str) -> int:
    return next(i for i, layer in enumerate(stack) if name in layer)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001  (mkdocs' hook signature)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_reference())
    if GRAPH_MARK in markdown:
        markdown = markdown.replace(GRAPH_MARK, import_graph())
    if SCENARIO_MARK in markdown:
        markdown = markdown.replace(SCENARIO_MARK, scenario_graph())
    return markdown
