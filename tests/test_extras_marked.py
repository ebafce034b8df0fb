"""Every test that needs PyTorch carries the `torch` marker (issue 34 item 1).

Without torch such a test skips (tests/conftest.py), so the README's test command passes in a fresh venv,
and CI's second leg, with torch installed, runs exactly these tests (`python -m pytest -m torch`). A test
that imports torch, asks for it with `pytest.importorskip("torch")`, or uses a fixture of its module that
does, and is not marked, would run in neither leg with torch: this test names it.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _needs_torch(node: ast.AST) -> bool:
    """The node imports torch or calls pytest.importorskip("torch") somewhere inside."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Import) and any(a.name.split(".")[0] == "torch" for a in sub.names):
            return True
        if isinstance(sub, ast.ImportFrom) and (sub.module or "").split(".")[0] == "torch":
            return True
        if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "importorskip"
                and sub.args and isinstance(sub.args[0], ast.Constant) and sub.args[0].value == "torch"):
            return True
    return False


def _is_torch_mark(node: ast.AST) -> bool:
    return any(isinstance(sub, ast.Attribute) and sub.attr == "torch" and isinstance(sub.value, ast.Attribute)
               and sub.value.attr == "mark" for sub in ast.walk(node))


def unmarked_torch_tests(path: Path) -> list[str]:
    """Names of the module's tests that need torch without the marker ("<module>" for module-level use)."""
    tree = ast.parse(path.read_text())
    module_marked = any(isinstance(s, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in s.targets)
                        and _is_torch_mark(s.value) for s in tree.body)
    module_level = [s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.ClassDef))]
    if any(_needs_torch(s) for s in module_level):
        return [] if module_marked else ["<module>"]
    if module_marked:
        return []
    functions = [s for s in tree.body if isinstance(s, ast.FunctionDef)]
    torch_fixtures = {f.name for f in functions if not f.name.startswith("test_") and _needs_torch(f)}
    missing = []
    for f in functions:
        if not f.name.startswith("test_"):
            continue
        uses = _needs_torch(f) or any(a.arg in torch_fixtures for a in f.args.args)
        if uses and not any(_is_torch_mark(d) for d in f.decorator_list):
            missing.append(f.name)
    return missing


def test_every_torch_test_is_marked():
    missing = {p.name: names for p in sorted(TESTS.glob("test_*.py")) if (names := unmarked_torch_tests(p))}
    assert not missing, f"mark these @pytest.mark.torch (or the module with pytestmark): {missing}"


def test_the_check_finds_an_unmarked_test(tmp_path):
    source = tmp_path / "test_x.py"
    source.write_text("import pytest\n\n@pytest.fixture\ndef net():\n    pytest.importorskip('torch')\n\n"
                      "def test_a(net):\n    pass\n\n@pytest.mark.torch\ndef test_b():\n    import torch\n\n"
                      "def test_c():\n    from torch import nn\n\ndef test_d():\n    pass\n")
    assert unmarked_torch_tests(source) == ["test_a", "test_c"]
    source.write_text("import pytest\ntorch = pytest.importorskip('torch')\n\ndef test_a():\n    pass\n")
    assert unmarked_torch_tests(source) == ["<module>"]
    source.write_text("import pytest\npytestmark = pytest.mark.torch\ntorch = pytest.importorskip('torch')\n")
    assert unmarked_torch_tests(source) == []
