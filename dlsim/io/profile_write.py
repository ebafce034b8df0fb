"""Writing a calibrated hardware profile: a new profile.yaml, or the tables added to a user's one.

A calibration never overwrites what a user wrote. When ``profile.yaml`` exists, only the table
entries it lacks are added, by inserting lines into the file's text (its comments, order and
values stay as they are); a kind the user already points elsewhere is left alone. The edited text
is parsed again and must give the merged mapping before it replaces the file (atomically).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

import yaml

from dlsim.errors import SpecError
from dlsim.io.files import write_atomic
from dlsim.io.yamlfile import read_yaml

_BLOCK = re.compile(r"^tables:[ \t]*(#.*)?$", re.M)
_FLOW = re.compile(r"^tables:[ \t]*\{[^\n]*\}[ \t]*(#.*)?$", re.M)


def _merged_text(text: str, existing: Mapping[str, str], missing: Mapping[str, str]) -> str:
    merged = {**existing, **missing}
    if (m := _FLOW.search(text)) is not None:
        flow = "tables: {" + ", ".join(f"{k}: {v}" for k, v in merged.items()) + "}"
        comment = f"  {m.group(1)}" if m.group(1) else ""
        return text[:m.start()] + flow + comment + text[m.end():]
    lines = "".join(f"  {k}: {v}\n" for k, v in missing.items())
    if (m := _BLOCK.search(text)) is not None:
        after = text[m.end():]
        nxt = re.match(r"\n([ \t]+)\S", after)
        if nxt:
            lines = "".join(f"{nxt.group(1)}{k}: {v}\n" for k, v in missing.items())
        return text[:m.end()] + "\n" + lines.rstrip("\n") + after
    return text.rstrip("\n") + "\n\n# measured kernel tables (dlsim calibrate compute)\ntables:\n" + lines


def add_tables(path: Path, tables: Mapping[str, str]) -> list[str]:
    """Add the `tables` entries (kind -> file) that `path` lacks; returns what changed, one line each."""
    data = read_yaml(path) or {}
    if not isinstance(data, dict):
        raise SpecError("must be a mapping", path=path)
    existing = data.get("tables") or {}
    if not isinstance(existing, dict):
        raise SpecError("must be a mapping of table kind to file", path=path, field="tables")
    missing = {k: v for k, v in tables.items() if k not in existing}
    changes = [f"tables.{k}: kept your {existing[k]!r} (calibration wrote {v})" for k, v in tables.items()
               if k in existing and existing[k] != v]
    if not missing:
        return changes
    text = _merged_text(path.read_text(), existing, missing)
    check = yaml.safe_load(text)
    if not isinstance(check, dict) or check.get("tables") != {**existing, **missing}:
        raise SpecError("could not add the measured tables automatically; add under tables: "
                        + ", ".join(f"{k}: {v}" for k, v in missing.items()), path=path)
    write_atomic(path, text)
    return changes + [f"tables.{k}: added {v}" for k, v in missing.items()]


def write_new_profile(path: Path, text: str) -> None:
    """Write a freshly generated profile.yaml (refusing to replace an existing one)."""
    if path.exists():
        raise SpecError("exists already; calibration only adds table entries to an existing profile", path=path)
    check = yaml.safe_load(text)
    if not isinstance(check, dict):
        raise SpecError("generated profile is not a mapping", path=path)
    write_atomic(path, text)
