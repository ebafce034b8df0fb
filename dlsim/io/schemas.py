"""JSON Schemas of the configuration files, generated from their typed records and shipped in
``dlsim/schemas/<kind>.schema.json`` (package data), so that an editor completes and checks a file.

=========  ===========================================  =================================
kind       files                                        record
=========  ===========================================  =================================
model      ``models/*.yaml``, ``models/families/*``     `dlsim.io.model_yaml.ModelFile`
profile    ``hardware_profiles/*/profile.yaml``         `dlsim.io.profile_yaml.ProfileFile`
strategy   ``--strategy`` files, ``examples/*.yaml``    `dlsim.io.strategy_yaml.StrategyFile`
sweep      ``dlsim sweep`` specs, ``examples/sweeps/``  `dlsim.io.sweep_spec.SweepFile`
stack      ``stacks/*.yaml``                            `dlsim.io.stack_yaml.StackFile`
=========  ===========================================  =================================

A new file kind is one line in `KINDS` (module and record). Regenerate after changing a record:
``python -m dlsim.io.schemas`` (``--check`` says which files are stale, exit code 1; a test runs it).
With the YAML language server, a file names its schema in its first line::

    # yaml-language-server: $schema=../dlsim/schemas/strategy.schema.json
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from dlsim.io.files import write_atomic

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"
DIALECT = "https://json-schema.org/draft/2020-12/schema"

KINDS: dict[str, tuple[str, str]] = {
    "model": ("dlsim.io.model_yaml", "ModelFile"),
    "profile": ("dlsim.io.profile_yaml", "ProfileFile"),
    "strategy": ("dlsim.io.strategy_yaml", "StrategyFile"),
    "sweep": ("dlsim.io.sweep_spec", "SweepFile"),
    "stack": ("dlsim.io.stack_yaml", "StackFile"),
}
"""file kind -> (module, typed record) whose JSON Schema describes the file."""


def schema(kind: str) -> dict:
    """The JSON Schema of a file kind (draft 2020-12), from its record."""
    module, name = KINDS[kind]
    record = getattr(importlib.import_module(module), name)
    body = record.model_json_schema(mode="validation")
    return {"$schema": DIALECT, **body, "title": f"dlsim {kind} file"}


def schema_path(kind: str) -> Path:
    return SCHEMA_DIR / f"{kind}.schema.json"


def schema_text(kind: str) -> str:
    return json.dumps(schema(kind), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def stale() -> list[str]:
    """The kinds whose shipped schema differs from the one their record gives now."""
    out = []
    for kind in KINDS:
        path = schema_path(kind)
        if not path.is_file() or path.read_text(encoding="utf-8") != schema_text(kind):
            out.append(kind)
    return out


def write_schemas() -> list[Path]:
    """Write every stale schema; returns the files written."""
    written = []
    for kind in stale():
        write_atomic(schema_path(kind), schema_text(kind))
        written.append(schema_path(kind))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlsim.io.schemas", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which schemas are stale (exit code 1)")
    args = parser.parse_args(argv)
    if args.check:
        kinds = stale()
        for kind in kinds:
            print(f"{schema_path(kind)} is stale: run python -m dlsim.io.schemas")
        return 1 if kinds else 0
    for path in write_schemas():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
