"""YAML is read with bounds, whichever parser PyYAML has (libyaml here): nesting, alias expansion,
integer size; only safe tags; each refusal one line naming the file."""

from __future__ import annotations

import pytest
import yaml

from dlsim.errors import SpecError
from dlsim.io import yamlfile
from dlsim.io.yamlfile import MAX_DEPTH, read_yaml

BOMB = "\n".join(["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] +
                 [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)])


@pytest.mark.parametrize("text, says", [
    ("k: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5), f"nested deeper than {MAX_DEPTH} levels"),
    ("k: " + "[" * 5000 + "]" * 5000, f"nested deeper than {MAX_DEPTH} levels"),
    ("".join("  " * i + f"k{i}:\n" for i in range(MAX_DEPTH + 5)) + "  " * (MAX_DEPTH + 5) + "x: 1\n",
     f"nested deeper than {MAX_DEPTH} levels"),
    (BOMB, "alias bomb"),
    ("a: &a [*a]\n", "cycle"),
    ("a: " + "9" * 60 + "\n", "out of range"),
    ("a: !!python/name:os.system\n", "malformed YAML"),
    ("a: [1, 2\n", "malformed YAML"),
])
def test_bad_yaml_is_one_line(tmp_path, text, says):
    path = tmp_path / "f.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        read_yaml(path)
    assert says in str(info.value) and str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_libyaml_parses_when_installed_and_gives_what_the_python_parser_gives(tmp_path):
    assert issubclass(yamlfile._BoundedLoader, yaml.CSafeLoader) == bool(yaml.__with_libyaml__)
    text = "a: &x {b: [1, 2.5, true, null, '3']}\nc: *x\nd: 0x1f\n"
    assert yamlfile.parse_yaml_text(text) == yaml.load(text, Loader=yaml.SafeLoader)
    nested = "k: " + "[" * (MAX_DEPTH - 2) + "1" + "]" * (MAX_DEPTH - 2)
    assert yamlfile.parse_yaml_text(nested) == yaml.load(nested, Loader=yaml.SafeLoader)
